// A worker host cut off from the network for 30 s, then plugged back in. The producer and one
// worker reach Redis and the simulator directly; a second worker reaches both only through fault
// proxies on 127.0.0.1 that the test controls. Its connections are cut (reset), then Redis is
// blackholed (connections accepted, nothing answered: a pulled cable, no RST) and the simulator
// refuses connections. Its batches must be recovered by the other worker, the run must complete
// exactly once, and the cut-off worker must carry on, without a restart, once the network is back.
import { hostname } from 'node:os';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { RunKeys, generateQueueName } from '../../src/shared/index.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { loopbackPort, startFaultProxy, type FaultProxy } from '../helpers/fault-proxy.js';
import {
  sampleIdOfRid,
  duplicates,
  readGenerations,
  spawnCli,
  waitFor,
  writePrompts,
  type CliProcess,
} from '../helpers/pipeline.js';
import { useHarness } from '../helpers/fixture.js';

/** Requests in flight per endpoint URL. The proxied worker reaches the same simulator under another URL, so it has a cap of its own. */
const CONCURRENCY = 4;
/** Enough that work remains for both workers after the cut: the other worker alone commits about 4 a second. */
const PROMPTS = 224;
const CUT_MS = 30_000;

const { redis, sim, tmp, defer } = useHarness({
  redis: true,
  // About a second per request, so that work remains after the cut.
  sim: {
    timeScale: 8,
    maxRunningRequests: 16,
    seed: 41,
    outputLength: { distribution: 'lognormal', mean: 600, sigma: 0.6 },
  },
  tmp: true,
  cli: true,
});
let redisProxy: FaultProxy;
let simProxy: FaultProxy;

beforeAll(async () => {
  redisProxy = await startFaultProxy({ target: { host: '127.0.0.1', port: redis.port } });
  defer(() => redisProxy.close());
  simProxy = await startFaultProxy({ target: { host: '127.0.0.1', port: loopbackPort(sim.url) } });
  defer(() => simProxy.close());
});

function config(run: string, redisUrl: string, endpoint: string): TestConfigSpec {
  return {
    run,
    redis: { url: redisUrl, prefix: redis.prefix },
    sim: endpoint,
    sglang: { concurrency: CONCURRENCY },
    dataset: { batchSize: 4 },
    // Short locks and leases: a cut-off worker's batches return to the queue within seconds.
    workers: {
      lockDurationMs: 2_000,
      stalledIntervalMs: 1_000,
      leaseTtlMs: 1_000,
      shutdownGraceMs: 2_000,
      windowBatches: 8,
    },
  };
}

/** Active batch jobs whose lock token is this worker's (`<workerId>:<uuid>`). */
async function jobsHeldBy(keys: RunKeys, workerId: string): Promise<string[]> {
  const conn = redis.connection('client');
  const q = `${keys.bullPrefix}:${generateQueueName('ds')}`;
  const active = await conn.lrange(`${q}:active`, 0, -1);
  const held: string[] = [];
  for (const id of active) {
    const token = await conn.get(`${q}:${id}:lock`);
    if (token?.startsWith(`${workerId}:`)) held.push(id);
  }
  return held;
}

/** Whether a job is finished, or running under a worker other than `workerId`. */
async function recoveredFrom(keys: RunKeys, jobId: string, workerId: string): Promise<boolean> {
  const conn = redis.connection('client');
  const q = `${keys.bullPrefix}:${generateQueueName('ds')}`;
  if ((await conn.zscore(`${q}:completed`, jobId)) !== null) return true;
  if ((await conn.exists(`${q}:${jobId}`)) === 0) return true; // completed and removed
  const token = await conn.get(`${q}:${jobId}:lock`);
  return token !== null && !token.startsWith(`${workerId}:`);
}

describe('a worker host cut off', () => {
  it('cut for 30 s (reset, then Redis blackholed and the server refused): its batches are recovered, no duplicates, and it carries on without a restart', async () => {
    const run = 'cutoff';
    writePrompts(tmp.dir, run, PROMPTS);
    const direct = writeTestConfig(tmp.dir, config(run, redis.url, sim.url));
    const proxied = writeTestConfig(
      tmp.dir,
      config(run, redisProxy.url('redis'), simProxy.url('http')),
      `${run}-proxied.yaml`,
    );
    const runDir = path.join(tmp.dir, 'out', run);
    const keys = new RunKeys(redis.prefix, run);
    const conn = redis.connection('client');
    const records = async (): Promise<number> => Number((await conn.hget(keys.stats('ds'), 'records')) ?? 0);

    const producer = spawnCli(['produce', '-c', direct]);
    const w1 = spawnCli(['worker', '-c', direct]);
    const w2 = spawnCli(['worker', '-c', proxied]);
    const workers: CliProcess[] = [w1, w2];
    const w1Id = `${hostname()}:${w1.child.pid}`;
    const w2Id = `${hostname()}:${w2.child.pid}`;
    const byWorker = (id: string, afterMs = 0): number =>
      readGenerations(runDir, 'ds').filter((r) => r.worker === id && Date.parse(r.ts) > afterMs).length;
    try {
      // 1. Both workers commit.
      await waitFor(() => byWorker(w1Id) >= 4 && byWorker(w2Id) >= 4, 'both workers committing', 60_000, 100);
      let held: string[] = [];
      await waitFor(async () => (held = await jobsHeldBy(keys, w2Id)).length > 0, 'a batch held by the proxied worker');

      // 2. The cut: every connection reset, new ones too, until the worker has tried again…
      const cutAt = Date.now();
      const droppedBefore = redisProxy.stats().dropped;
      await Promise.all([redisProxy.setMode('drop'), simProxy.setMode('drop')]);
      expect(redisProxy.stats().dropped).toBeGreaterThan(droppedBefore);
      const droppedAtCut = redisProxy.stats().dropped;
      await waitFor(
        () => redisProxy.stats().dropped > droppedAtCut,
        'the cut-off worker reconnecting to Redis',
        10_000,
        10,
      );
      // …then Redis goes silent (accepted, never answered) and the server refuses.
      await Promise.all([redisProxy.setMode('blackhole'), simProxy.setMode('refuse')]);
      const committedAtCut = await records();

      // 3. Its batches are taken over by the other worker while it is cut off.
      for (const jobId of held)
        await waitFor(
          () => recoveredFrom(keys, jobId, w2Id),
          `batch ${jobId} recovered from the cut-off worker`,
          CUT_MS - 2_000,
          100,
        );
      // The run goes on without it.
      await waitFor(
        async () => (await records()) >= committedAtCut + 8,
        'commits by the other worker during the cut',
        CUT_MS,
        100,
      );
      // The outage lasts CUT_MS whatever happens meanwhile.
      await waitFor(() => Date.now() - cutAt >= CUT_MS, 'the end of the cut', CUT_MS + 5_000, 100);
      expect(w2.child.exitCode, w2.output()).toBeNull();
      const left = PROMPTS - (await records());
      expect(left, 'prompts left for the cut-off worker after the restore').toBeGreaterThanOrEqual(48);

      // 4. Plugged back in: the held bytes flow, the worker carries on.
      const restoredAt = Date.now();
      await Promise.all([redisProxy.setMode('pass'), simProxy.setMode('pass')]);
      await waitFor(
        () => byWorker(w2Id, restoredAt) >= 2,
        'commits by the cut-off worker after the restore',
        30_000,
        100,
      );
      expect(await producer.exited, producer.output()).toBe(0);
      expect(w2.child.exitCode, w2.output()).toBeNull();
    } finally {
      for (const w of workers) w.child.kill('SIGTERM');
      await Promise.all(workers.map((w) => w.exited));
    }
    // Both stop cleanly on SIGTERM, the cut-off one too.
    expect(await w1.exited, w1.output()).toBe(0);
    expect(await w2.exited, w2.output()).toBe(0);

    // 5. Exactly once.
    const lines = readGenerations(runDir, 'ds');
    expect(duplicates(lines.map((r) => r.id))).toEqual([]);
    expect(lines.map((r) => r.id).sort()).toEqual(Array.from({ length: PROMPTS }, (_, i) => `${run}-${i}`).sort());
    const stats = await conn.hgetall(keys.stats('ds'));
    expect(Number(stats.records)).toBe(PROMPTS);
    expect(lines.reduce((a, r) => a + r.completion_tokens, 0)).toBe(Number(stats.outputTokens));
    expect(await conn.hlen(keys.failed('ds'))).toBe(0);
    // A worker that lost its batches does not send samples already committed by the other one:
    // every request reached the server before its sample's commit (a few ms of race allowed).
    const committedAt = new Map(lines.map((r) => [r.id, Date.parse(r.ts)]));
    const late = sim
      .stats()
      .requests.filter((q) => q.receivedAtMs > (committedAt.get(sampleIdOfRid(q.rid)) ?? Infinity) + 250);
    expect(late.map((q) => q.rid)).toEqual([]);
    // Each URL has its own cap: the server never saw more than both together.
    expect(sim.stats().maxRunningObserved).toBeLessThanOrEqual(2 * CONCURRENCY);
  }, 150_000);
});
