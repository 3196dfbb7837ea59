// SGLang misbehaving the way real servers do, each at a moment that used to hurt: the exact
// 503 "queue full" pattern that once hung a run forever, a prompt that crashes the server,
// a proxy answering 401 to everything, hung requests, dropped connections and a 12 s outage.
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import { loadTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, startSim: sim } = useHarness({ redis: true, tmp: true });

interface RunResult {
  ids: string[];
  failed: Record<string, string>;
  maxRunning: number;
}

/**
 * Runs `n` prompts through producer + worker + sink in this process, with `during` called once
 * the run is under way, and returns what ended failed. Fails the test if the run does not end.
 */
async function runWith(
  run: string,
  s: SimulatorHandle,
  n: number,
  opts: {
    sglang?: TestConfigSpec['sglang'];
    workers?: TestConfigSpec['workers'];
    during?: (records: () => Promise<number>) => Promise<void>;
    deadlineMs?: number;
  } = {},
): Promise<RunResult> {
  writePrompts(tmp.dir, run, n);
  const cfg = loadTestConfig(tmp.dir, {
    run,
    redis,
    sim: s,
    sglang: { requestTimeoutMs: 30_000, healthCheckIntervalMs: 200, ...opts.sglang },
    dataset: { maxNewTokens: 4096 },
    workers: { shutdownGraceMs: 1_000, ...opts.workers },
  });
  const ctx = await openRunContextFor(cfg);
  const handle = await startGeneration(ctx, { produce: true, infer: true });
  try {
    const records = async (): Promise<number> => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0);
    await opts.during?.(records);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      handle.finished,
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`run "${run}" did not end`)), opts.deadlineMs ?? 60_000);
      }),
    ]).finally(() => clearTimeout(timer));
    const out = readGenerations(ctx.runDir, 'ds');
    expect(duplicates(out.map((r) => r.id))).toEqual([]);
    const stats = await ctx.redis.hgetall(ctx.keys.stats('ds'));
    expect(out.reduce((a, r) => a + r.completion_tokens, 0)).toBe(Number(stats.outputTokens));
    // Nothing holds a slot or a budget reservation once the run is over (no lease renewed after its request ended).
    expect(await ctx.redis.zcard(ctx.keys.inflight('ds'))).toBe(0);
    expect(await ctx.redis.zcard(ctx.keys.endpointLeases(s.url))).toBe(0);
    return {
      ids: out.map((r) => r.id),
      failed: await ctx.redis.hgetall(ctx.keys.failed('ds')),
      maxRunning: s.stats().maxRunningObserved,
    };
  } finally {
    await handle.stop();
    await ctx.close();
  }
}

describe('SGLang faults', () => {
  it('503 "The request queue is full." on the first try of ~5 % of prompts (the run that once hung): every prompt committed, none failed', async () => {
    const s = await sim({
      timeScale: 40,
      maxRunningRequests: 16,
      seed: 41,
      outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.6 },
      faults: { firstTry503Rate: 0.05 },
    });
    const r = await runWith('first503', s, 150);
    expect(r.ids.length).toBe(150);
    expect(r.failed).toEqual({});
    expect(s.stats().failed).toBeGreaterThan(0);
  }, 90_000);

  it('a poison prompt that crashes the server ends failed after maxAttempts; nothing else fails', async () => {
    const s = await sim({
      timeScale: 40,
      maxRunningRequests: 16,
      seed: 42,
      outputLength: { distribution: 'lognormal', mean: 400, sigma: 0.5 },
      faults: { poisonSampleIds: ['ds/poison-37'], poisonDownMs: 300 },
    });
    const r = await runWith('poison', s, 80, {
      sglang: { maxAttempts: 2 },
      workers: { crashProbationMs: 800 },
      deadlineMs: 90_000,
    });
    expect(Object.keys(r.failed)).toEqual(['poison-37']);
    expect(JSON.parse(r.failed['poison-37'] ?? '{}').reason).toMatch(/crash/);
    expect(r.ids.length).toBe(79);
  }, 120_000);

  it('a proxy answering 401 to everything for a while fails no prompt; the run carries on once it is fixed', async () => {
    const s = await sim({
      timeScale: 40,
      maxRunningRequests: 16,
      seed: 43,
      outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.6 },
    });
    const r = await runWith('proxy401', s, 120, {
      sglang: { maxAttempts: 1 },
      during: async (records) => {
        await waitFor(async () => (await records()) >= 20, 'first commits', 30_000, 10);
        s.setFaults({ statusAll: 401, statusAllHealth: true });
        await new Promise((res) => setTimeout(res, 1_500));
        s.clearFaults();
      },
    });
    expect(r.failed).toEqual({});
    expect(r.ids.length).toBe(120);
  }, 90_000);

  it('hung requests (no answer until the timeout) and dropped connections: no prompt fails for them', async () => {
    const s = await sim({
      timeScale: 40,
      maxRunningRequests: 16,
      seed: 44,
      outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.6 },
      faults: { hangRate: 0.03, dropRate: 0.03 },
    });
    const r = await runWith('hangdrop', s, 150, {
      sglang: { requestTimeoutMs: 1_500, maxAttempts: 4 },
      workers: { crashProbationMs: 300 },
      deadlineMs: 90_000,
    });
    expect(r.failed).toEqual({});
    expect(r.ids.length).toBe(150);
  }, 120_000);

  it('a 12 s outage mid-run: workers wait without spending attempts, then finish on the same server', async () => {
    const s = await sim({
      timeScale: 40,
      maxRunningRequests: 16,
      seed: 45,
      outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.6 },
    });
    const r = await runWith('outage30', s, 100, {
      sglang: { maxAttempts: 1 },
      deadlineMs: 90_000,
      during: async (records) => {
        await waitFor(async () => (await records()) >= 30, 'first commits', 30_000, 10);
        // Longer than a request and several health probes: with maxAttempts 1, one attempt spent
        // on the outage would fail its prompt.
        s.setFaults({ outage: true });
        await new Promise((res) => setTimeout(res, 12_000));
        s.clearFaults();
      },
    });
    expect(r.failed).toEqual({});
    expect(r.ids.length).toBe(100);
  }, 150_000);
});
