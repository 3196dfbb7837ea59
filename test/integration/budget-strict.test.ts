// `budget: strict` and the last prompts of a budget, end to end against the simulator over HTTP:
// requests in flight are aborted at the budget and their partial outputs committed as `abort`
// (with no margin and with the default one); two worker processes race at the budget; a worker
// killed with requests in flight at the end.
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import { RunKeys, inferenceOptions, type Config, type InferenceStageOptions } from '../../src/shared/index.js';
import { InferenceWorker } from '../../src/workers/inference/worker.js';
import { loadTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, waitFor, writePrompts, type GenerationRecord } from '../helpers/pipeline.js';

const TIME_SCALE = 8;
/** The simulator's speed of one request decoding alone (its default), times TIME_SCALE: no request decodes faster. */
const MAX_REQUEST_TOKENS_PER_S = 80 * TIME_SCALE;
/** Allowance for the stop's round trip: the report interval, a stream tick, the abort, under a loaded machine. */
const ROUND_TRIP_S = 1.5;
const CONCURRENCY = 16;
const BUDGET = 150_000;

const { redis, sim, tmp, startSim } = useHarness({
  redis: true,
  // Long completions (mean 3,000): a request in flight at the budget still has thousands of tokens to go.
  sim: {
    timeScale: TIME_SCALE,
    maxRunningRequests: CONCURRENCY,
    seed: 17,
    outputLength: { distribution: 'lognormal', mean: 3_000, sigma: 0.8 },
  },
  tmp: true,
});
/** A second server: each worker process of a race has an endpoint (and its slots) of its own. */
let sim2: SimulatorHandle;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  sim2 = await startSim({
    timeScale: TIME_SCALE,
    maxRunningRequests: CONCURRENCY,
    seed: 18,
    outputLength: { distribution: 'lognormal', mean: 3_000, sigma: 0.8 },
  });
  writePrompts(tmp.dir, 'prompts', 400);
});

afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
});

/** `marginSd`: the dataset's `budgetMarginSd` (omitted: the default). */
function config(run: string, mode: 'reserve' | 'strict', marginSd?: number): Config {
  return loadTestConfig(tmp.dir, {
    run,
    redis,
    sim,
    sglang: { concurrency: CONCURRENCY },
    dataset: {
      prompts: 'prompts.jsonl',
      tokenBudget: BUDGET,
      budget: mode,
      ...(marginSd === undefined ? {} : { budgetMarginSd: marginSd }),
      maxNewTokens: 8_192,
    },
    workers: { shutdownGraceMs: 2_000, leaseTtlMs: 1_500, lockDurationMs: 2_000, stalledIntervalMs: 1_000 },
  });
}

const childEntry = path.join(path.dirname(fileURLToPath(import.meta.url)), 'budget-worker-child.ts');

/** The inference stage's options of `cfg`, as the pipeline gives them to its worker, served from `endpoint`. */
function workerOptions(cfg: Config, strict: boolean, endpoint?: string): InferenceStageOptions {
  return {
    ...inferenceOptions(cfg),
    ...(endpoint === undefined ? {} : { endpoints: [endpoint] }),
    strictBudgetDatasets: strict ? ['ds'] : [],
  };
}

/** An inference worker in a process of its own; resolves once it has started. */
async function spawnWorker(cfg: Config, workerId: string, strict: boolean, endpoint: string): Promise<ChildProcess> {
  const opts = {
    redisUrl: redis.url,
    prefix: cfg.redis.prefix,
    run: cfg.run,
    options: workerOptions(cfg, strict, endpoint),
    workerId,
  };
  const child = spawn(process.execPath, ['--import', 'tsx', childEntry, JSON.stringify(opts)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  child.once('exit', () => {
    children.delete(child);
    if (process.env['BUDGET_TEST_DEBUG'] !== undefined) process.stderr.write(`[${workerId} exited]\n${out}\n`);
  });
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  await waitFor(() => out.includes('ready') || child.exitCode !== null, `worker ${workerId} to start`, 60_000);
  if (!out.includes('ready')) throw new Error(`worker ${workerId} did not start:\n${out}`);
  return child;
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

interface RunOutcome {
  stats: Record<string, string>;
  records: GenerationRecord[];
  receivedAfterMet: number;
}

/** The producer and sinks in this process; `workers` starts the inference side and returns how to stop it. */
async function run(
  cfg: Config,
  workers: () => Promise<() => Promise<void>>,
  during?: (ctx: Awaited<ReturnType<typeof openRunContextFor>>) => Promise<void>,
): Promise<RunOutcome> {
  sim.resetStats();
  sim2.resetStats();
  // The workers first: each is serving the dataset's queue when its first batch arrives.
  const stopWorkers = await workers();
  const ctx = await openRunContextFor(cfg);
  const handle = await startGeneration(ctx, { produce: true, infer: false });
  handle.finished.catch(() => undefined);
  try {
    await during?.(ctx);
    await handle.finished;
  } finally {
    await stopWorkers();
    await handle.stop();
  }
  const stats = await ctx.redis.hgetall(ctx.keys.stats('ds'));
  const records = readGenerations(ctx.runDir, 'ds');
  const metMs = Number(stats['budgetMetMs']);
  const receivedAfterMet = [...sim.stats().requests, ...sim2.stats().requests].filter(
    (q) => q.rid.startsWith('ds/') && q.receivedAtMs > metMs,
  ).length;
  await ctx.close();
  return { stats, records, receivedAfterMet };
}

function inProcessWorker(cfg: Config, strict: boolean): () => Promise<() => Promise<void>> {
  return async () => {
    const w = new InferenceWorker({
      ...workerOptions(cfg, strict),
      redisUrl: redis.url,
      keys: new RunKeys(cfg.redis.prefix, cfg.run),
    });
    await w.start();
    return () => w.stop(2_000);
  };
}

/** Checks every run must pass: exactly once, the counter equal to the files, the budget met, nothing sent after it. */
function expectBudgetKept(o: RunOutcome): number {
  const total = Number(o.stats['outputTokens']);
  expect(duplicates(o.records.map((r) => r.id))).toEqual([]);
  expect(o.records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(total);
  expect(total).toBeGreaterThanOrEqual(BUDGET);
  expect(o.receivedAfterMet).toBe(0);
  return total;
}

/**
 * Strict: the partial outputs are abort records, and the total is the stop's count plus what was
 * produced in the stop's round trip. Returns how many requests were aborted.
 */
function expectStrict(o: RunOutcome, endpoints = 1): number {
  const total = expectBudgetKept(o);
  const aborted = o.records.filter((r) => r.finish_reason.type === 'abort');
  for (const r of aborted) {
    expect(r.completion_tokens).toBeGreaterThan(0);
    expect(r.output_ids.length).toBe(r.completion_tokens);
  }
  const stopTokens = Number(o.stats['budgetStopTokens']);
  expect(stopTokens).toBeGreaterThanOrEqual(BUDGET);
  expect(total).toBeGreaterThanOrEqual(stopTokens);
  // At most every request in flight (on every endpoint) decoding at full speed through the round trip; a request
  // left to finish would add its remaining ~2,000+ tokens instead.
  expect(total - stopTokens).toBeLessThanOrEqual(endpoints * CONCURRENCY * MAX_REQUEST_TOKENS_PER_S * ROUND_TRIP_S);
  return aborted.length;
}

describe('budget: strict', () => {
  it('margin 0: aborts what is in flight once committed + produced reach the budget, and commits the partial outputs as abort records', async () => {
    const cfg = config('strict-one', 'strict', 0);
    const o = await run(cfg, inProcessWorker(cfg, true));
    expect(expectStrict(o)).toBeGreaterThan(0);
  }, 180_000);

  it('with the default margin (the last requests start only while the budget is likely to hold them): the budget kept, the total within the round trip', async () => {
    const cfg = config('strict-margin', 'strict');
    expectStrict(await run(cfg, inProcessWorker(cfg, true)));
  }, 180_000);

  it('two worker processes racing at the budget (margin 0): both stop, each sample once, the total within the round trip', async () => {
    const cfg = config('strict-race', 'strict', 0);
    const o = await run(cfg, async () => {
      const a = await spawnWorker(cfg, 'race-a', true, sim.url);
      const b = await spawnWorker(cfg, 'race-b', true, sim2.url);
      return async () => {
        await Promise.all([stopChild(a), stopChild(b)]);
      };
    });
    expect(expectStrict(o, 2)).toBeGreaterThan(0);
    // Both processes ran requests of the dataset.
    expect(new Set(o.records.map((r) => r.worker)).size).toBe(2);
  }, 180_000);
});

describe('the last prompts of a budget', () => {
  it('a worker killed with requests in flight near the budget: its leases lapse, the other worker tops up, nothing is sent after the budget is met', async () => {
    const cfg = config('crash-last', 'reserve');
    let victim: ChildProcess | undefined;
    let survivor: ChildProcess | undefined;
    const o = await run(
      cfg,
      async () => {
        victim = await spawnWorker(cfg, 'victim', false, sim.url);
        survivor = await spawnWorker(cfg, 'survivor', false, sim2.url);
        return async () => {
          if (victim !== undefined) await stopChild(victim);
          if (survivor !== undefined) await stopChild(survivor);
        };
      },
      async (ctx) => {
        // Near the end: most of the budget committed, the rest reserved by requests in flight.
        await waitFor(
          async () => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'outputTokens')) ?? 0) >= 0.6 * BUDGET,
          'most of the budget committed',
          120_000,
        );
        victim?.kill('SIGKILL');
      },
    );
    expectBudgetKept(o);
    const byWorker = new Set(o.records.map((r) => r.worker));
    expect(byWorker.has('survivor')).toBe(true);
    // Reserve mode: no request was aborted; the overshoot is what the last requests added.
    expect(o.records.filter((r) => r.finish_reason.type === 'abort')).toEqual([]);
  }, 240_000);
});
