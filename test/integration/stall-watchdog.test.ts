// Issue 7, defect 10: a run that silently sits. Real Redis, real BullMQ queues: a dataset with
// batch jobs pending, nothing in flight and a healthy endpoint is reported stalled after the
// threshold (error log, `status` table and `--json`); with something in flight, or no healthy
// endpoint, it is not (the latter is "waiting").
import { Queue, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  RunKeys,
  StallWatchdog,
  formatRunStatus,
  generateQueueName,
  readRunStatus,
  readStalls,
  writeEndpointHealth,
  type DatasetWatch,
  type EndpointHealthReport,
  type RunStatus,
  type StallWatchdogOptions,
} from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const EP = 'http://127.0.0.1:39999';
const STALL_MS = 400;

const { redis, tmp } = useHarness({ redis: true, tmp: true, cli: true });
let conn: Redis;
const cleanups: (() => Promise<unknown>)[] = [];
let runNo = 0;

beforeAll(() => {
  conn = redis.connection('client');
});

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Logged {
  level: number;
  msg: string;
  dataset?: string;
  waiting?: number;
  active?: number;
  inFlight?: number;
  healthyEndpoints?: number;
}

/** A fresh run: its keys, a queue for dataset `alpha` marked in progress, a log to read back. */
async function setup(): Promise<{
  run: string;
  keys: RunKeys;
  queue: Queue;
  logs: Logged[];
  watchdog: (o?: Partial<StallWatchdogOptions>) => StallWatchdog;
}> {
  runNo += 1;
  const run = `stall${runNo}`;
  const keys = new RunKeys(redis.prefix, run);
  const queue = new Queue(generateQueueName('alpha'), { connection: conn, prefix: keys.bullPrefix });
  cleanups.push(() => queue.close());
  await conn.hset(keys.stats('alpha'), 'status', 'in_progress', 'records', '3');
  const logs: Logged[] = [];
  const logger = pino({ level: 'warn' }, { write: (line: string) => void logs.push(JSON.parse(line) as Logged) });
  const watchdog = (o: Partial<StallWatchdogOptions> = {}): StallWatchdog => {
    const w = new StallWatchdog({
      redis: conn,
      keys,
      datasets: ['alpha'],
      endpoints: [EP],
      stallAfterMs: STALL_MS,
      checkIntervalMs: 50,
      logger,
      ...o,
    });
    cleanups.push(() => w.stop());
    return w;
  };
  return { run, keys, queue, logs, watchdog };
}

function report(up: boolean, o: Partial<EndpointHealthReport> = {}): EndpointHealthReport {
  const now = Date.now();
  return {
    url: EP,
    up,
    reason: up ? null : 'GET /health answered 503',
    sinceMs: now,
    worker: 'w1:1',
    updatedMs: now,
    expiresMs: now + 60_000,
    ...o,
  };
}

/** Checks until the dataset has been in its condition longer than the threshold; returns that check. */
async function checkPastThreshold(w: StallWatchdog): Promise<DatasetWatch> {
  return until(
    async () => {
      const [d] = await w.check();
      return d !== undefined && Date.now() - d.sinceMs > 2 * STALL_MS ? d : undefined;
    },
    'a check past the stall threshold',
    10_000,
  );
}

describe('stall watchdog', () => {
  it('batch jobs pending (one waiting, one held by a worker), nothing in flight, an endpoint healthy: stalled after the threshold, logged, shown by status', async () => {
    const { run, keys, queue, logs, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    await queue.add('batch', { n: 2 });
    // A worker takes one batch and sits on it (the case: active, lock renewed, nothing sent).
    const holder = new Worker(generateQueueName('alpha'), null, {
      connection: redis.connection(),
      prefix: keys.bullPrefix,
      autorun: false,
    });
    cleanups.push(() => holder.close());
    expect(await holder.getNextJob('holder-token')).toBeDefined();
    await writeEndpointHealth(conn, keys, [report(true)]);

    const w = watchdog();
    const started = Date.now();
    w.start();
    const stalled = await until(
      async () => (await readStalls(conn, keys)).get('alpha'),
      'alpha reported stalled',
      10_000,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(STALL_MS);
    expect(stalled).toMatchObject({
      dataset: 'alpha',
      waiting: 1,
      active: 1,
      inFlight: 0,
      healthyEndpoints: 1,
      totalEndpoints: 1,
    });
    expect(stalled.reason).toBe(
      '2 batch job(s) pending (1 waiting, 1 active), 0 requests in flight, 1/1 endpoints healthy',
    );

    // An error names the dataset and the counts; it is not repeated on every check.
    await waitFor(() => logs.some((l) => l.level === 50), 'the error log');
    const errors = logs.filter((l) => l.level === 50);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject({ dataset: 'alpha', waiting: 1, active: 1, inFlight: 0, healthyEndpoints: 1 });
    expect(errors[0]?.msg).toMatch(/^dataset alpha stalled for \d+s: 2 batch job\(s\) pending/);

    // status: the dataset keeps its status, with `stalled` beside it and a warning line.
    const cfg = {
      run,
      datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1000 }],
      sglang: { endpoints: [EP] },
    } as never;
    const status = await readRunStatus(conn, keys, cfg);
    expect(status.datasets[0]).toMatchObject({
      status: 'in_progress',
      stalled: { sinceMs: stalled.sinceMs, reason: stalled.reason },
    });
    expect(status.endpoints).toMatchObject({ total: 1, healthy: 1, reported: 1 });
    expect(formatRunStatus(status)).toMatch(
      /\n! alpha stalled for \d+s: 2 batch job\(s\) pending \(1 waiting, 1 active\), 0 requests in flight, 1\/1 endpoints healthy — a bug/,
    );

    // The same through the CLI, as users run it.
    writePrompts(tmp.dir, 'alpha', 2);
    const configPath = writeTestConfig(
      tmp.dir,
      {
        run,
        redis,
        sim: EP,
        datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1000 }],
      },
      `${run}.yaml`,
    );
    const [json, table] = await Promise.all([
      cliOk(['status', '-c', configPath, '--json']),
      cliOk(['status', '-c', configPath]),
    ]);
    const parsed = JSON.parse(json.trim().split('\n').at(-1) ?? '{}') as RunStatus;
    expect(parsed.datasets[0]?.status).toBe('in_progress');
    expect(parsed.datasets[0]?.stalled?.reason).toBe(stalled.reason);
    expect(table).toMatch(/! alpha stalled for \d+s: 2 batch job\(s\) pending/);
    expect(table).toMatch(/endpoints: 1\/1 endpoints healthy/);

    // Once something is in flight again it is no longer stalled, and the record goes.
    await conn.zadd(keys.inflight('alpha'), Date.now() + 60_000, 'alpha/x');
    await waitFor(async () => !(await readStalls(conn, keys)).has('alpha'), 'the stall record withdrawn');
    await waitFor(() => logs.some((l) => l.msg === 'dataset alpha is no longer stalled'), 'the recovery log');
  });

  it('with a request in flight, the dataset is not stalled', async () => {
    const { keys, queue, logs, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    await writeEndpointHealth(conn, keys, [report(true)]);
    await conn.zadd(keys.inflight('alpha'), Date.now() + 60_000, 'alpha/1');
    const d = await checkPastThreshold(watchdog());
    expect(d).toMatchObject({ condition: 'ok', stalled: null, inFlight: 1 });
    expect((await readStalls(conn, keys)).size).toBe(0);
    expect(logs).toEqual([]);
  });

  it('with no healthy endpoint, the dataset is waiting, not stalled; status and the log say so', async () => {
    const { run, keys, queue, logs, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    await writeEndpointHealth(conn, keys, [report(false)]);
    const d = await checkPastThreshold(watchdog());
    expect(d).toMatchObject({ condition: 'waiting', stalled: null, waiting: 1 });
    expect((await readStalls(conn, keys)).size).toBe(0);
    expect(logs.filter((l) => l.level === 50)).toEqual([]);
    expect(logs.find((l) => l.level === 40)?.msg).toBe(
      `dataset alpha is waiting: 0/1 endpoints healthy (${EP}: GET /health answered 503); 1 batch job(s) pending`,
    );
    const cfg = {
      run,
      datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1000 }],
      sglang: { endpoints: [EP] },
    } as never;
    const status = await readRunStatus(conn, keys, cfg);
    expect(status.datasets[0]?.stalled).toBeNull();
    expect(status.endpoints).toMatchObject({ total: 1, healthy: 0, reported: 1 });
    expect(formatRunStatus(status)).toMatch(
      new RegExp(`\\nwaiting: 0/1 endpoints healthy \\(${EP}: GET /health answered 503\\)$`),
    );
  });

  it('with no inference worker reporting (or only expired reports), the dataset is waiting', async () => {
    const { keys, queue, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    // A worker that died without withdrawing its view: its report has expired.
    await writeEndpointHealth(conn, keys, [report(true, { expiresMs: Date.now() - 1 })]);
    const d = await checkPastThreshold(watchdog());
    expect(d).toMatchObject({ condition: 'waiting', stalled: null });
    expect(d.health).toMatchObject({ healthy: 0, reported: 0 });
  });

  it('with every slot of the healthy endpoint leased (to other datasets), the dataset is busy, not stalled', async () => {
    const { keys, queue, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    await writeEndpointHealth(conn, keys, [report(true)]);
    await conn.zadd(keys.endpointLeases(EP), Date.now() + 60_000, 'beta/1', Date.now() + 60_000, 'beta/2');
    const w = watchdog({ concurrencyPerEndpoint: 2 });
    expect(await checkPastThreshold(w)).toMatchObject({ condition: 'busy', stalled: null });
    // A slot frees up and still nothing is sent: stuck.
    await conn.zrem(keys.endpointLeases(EP), 'beta/2');
    const [d] = await w.check();
    expect(d).toMatchObject({ condition: 'stuck', stalled: null });
  });

  it('a paused dataset, or one whose records keep growing, is not stalled', async () => {
    const { keys, queue, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    await writeEndpointHealth(conn, keys, [report(true)]);
    const w = watchdog();
    await queue.pause();
    expect(await checkPastThreshold(w)).toMatchObject({ condition: 'ok', stalled: null });
    await queue.resume();
    // Commits landing between checks (nothing in flight at the instant of each look) are progress.
    const seen: DatasetWatch[] = [];
    const resumed = Date.now();
    await waitFor(async () => {
      await conn.hincrby(keys.stats('alpha'), 'records', 1);
      const [x] = await w.check();
      if (x !== undefined) seen.push(x);
      return Date.now() - resumed > 2 * STALL_MS;
    }, 'checks past the threshold while records grow');
    expect(seen.length).toBeGreaterThan(2);
    expect(seen.filter((x) => x.stalled !== null)).toEqual([]);
    expect(seen.at(-1)?.condition).toBe('ok');
  });

  it('stop() withdraws the stall records; a record its watchdog stopped refreshing is ignored', async () => {
    const { keys, queue, watchdog } = await setup();
    await queue.add('batch', { n: 1 });
    await writeEndpointHealth(conn, keys, [report(true)]);
    const w = watchdog();
    await waitFor(async () => (await w.check())[0]?.stalled, 'stalled');
    expect((await readStalls(conn, keys)).has('alpha')).toBe(true);
    await w.stop();
    expect(await conn.hexists(keys.stalls(), 'alpha')).toBe(0);
    await conn.hset(
      keys.stalls(),
      'alpha',
      JSON.stringify({ dataset: 'alpha', sinceMs: 1, reason: 'old', expiresMs: Date.now() - 1 }),
    );
    expect((await readStalls(conn, keys)).size).toBe(0);
  });
});

async function cliOk(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  if (code !== 0) throw new Error(`tokenmill ${args.join(' ')} exited ${code}:\n${p.output()}`);
  return p.output();
}

/** Polls until `f` gives a value (see waitFor), and returns it. */
async function until<T>(f: () => Promise<T | undefined>, what: string, timeoutMs?: number): Promise<T> {
  let value: T | undefined;
  await waitFor(async () => (value = await f()) !== undefined, what, timeoutMs);
  if (value === undefined) throw new Error(`no value for ${what}`);
  return value;
}
