import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { inferenceOptions, readRunStatus, type loadConfig } from '../../src/shared/index.js';
import { loadTestConfig } from '../helpers/config.js';
import { InferenceWorker } from '../../src/workers/inference/worker.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, startSim: sim } = useHarness({ redis: true, tmp: true });

function config(
  run: string,
  endpoint: string,
  dataset: Record<string, unknown>,
  sglang: Record<string, unknown> = {},
): ReturnType<typeof loadConfig> {
  return loadTestConfig(tmp.dir, {
    run,
    redis,
    sim: endpoint,
    sglang: { concurrency: 64, requestTimeoutMs: 30_000, ...sglang },
    dataset: { maxNewTokens: 8192, batchSize: 16, ...dataset },
    workers: { shutdownGraceMs: 2_000 },
  });
}

describe('generation: dispatch', () => {
  it('keeps the GPU saturated: time-averaged running requests >= 95% of the cap in steady state', async () => {
    // Long-tailed lengths: a batch-and-wait client would idle at every batch's tail.
    const s = await sim({
      timeScale: 20,
      maxRunningRequests: 64,
      seed: 5,
      outputLength: { distribution: 'lognormal', mean: 1000, sigma: 1.0 },
    });
    writePrompts(tmp.dir, 'sat', 700);
    const cfg = config('sat', s.url, { prompts: 'sat.jsonl' });
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    const records = async (): Promise<number> => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0);
    try {
      await waitFor(async () => (await records()) >= 120, 'warm-up', 60_000);
      s.resetStats();
      await waitFor(async () => (await records()) >= 450, 'steady state', 60_000);
      const { occupancy, maxRunningObserved } = s.stats();
      expect(maxRunningObserved).toBe(64);
      expect(occupancy.windowMs).toBeGreaterThan(1_000);
      expect(occupancy.meanRunning / 64).toBeGreaterThanOrEqual(0.95);
      await handle.finished;
    } finally {
      await handle.stop();
      await ctx.close();
    }
  }, 120_000);

  it('an outage mid-run fails no prompt: workers wait, then resume on the same server', async () => {
    const s = await sim({
      timeScale: 20,
      maxRunningRequests: 32,
      seed: 6,
      outputLength: { distribution: 'lognormal', mean: 600, sigma: 0.6 },
    });
    writePrompts(tmp.dir, 'outage', 160);
    const cfg = config('outage', s.url, { prompts: 'outage.jsonl' }, { concurrency: 32, maxAttempts: 1 });
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    try {
      await waitFor(
        async () => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0) >= 30,
        'first commits',
        60_000,
      );
      // Down for 3 s: every request in flight is cut, new connections are refused. With a
      // single attempt per prompt, any outage error counted as an attempt would fail a prompt.
      await s.outage(3_000);
      await handle.finished;
    } finally {
      await handle.stop();
    }
    try {
      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      expect(status.datasets[0]?.failed).toBe(0);
      expect(status.datasets[0]?.status).toBe('completed');
      const records = readGenerations(ctx.runDir, 'ds');
      expect(records.length).toBe(160);
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(s.stats().aborted).toBeGreaterThan(0);
    } finally {
      await ctx.close();
    }
  }, 120_000);

  it('an endpoint whose /health fails leaves the rotation, and comes back when it passes', async () => {
    const s = await sim({
      timeScale: 20,
      maxRunningRequests: 16,
      seed: 9,
      outputLength: { distribution: 'lognormal', mean: 400, sigma: 0.5 },
    });
    writePrompts(tmp.dir, 'health', 120);
    const cfg = config(
      'health',
      s.url,
      { prompts: 'health.jsonl', batchSize: 8 },
      { concurrency: 16, healthCheckIntervalMs: 100 },
    );
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    try {
      await waitFor(
        async () => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0) >= 10,
        'first commits',
        60_000,
      );
      s.setFaults({ unhealthy: true });
      // Requests in flight finish; no new one starts while the server says it is unhealthy.
      await waitFor(() => s.stats().running === 0 && s.stats().queued === 0, 'in-flight requests drained', 30_000);
      const drainedAt = Date.now();
      // Drained because the endpoint left the rotation, not because the prompts ran out.
      expect(Number(await ctx.redis.hget(ctx.keys.stats('ds'), 'records'))).toBeLessThan(120);
      // An observation window (not a synchronisation wait): nothing may arrive during it.
      await new Promise((r) => setTimeout(r, 600));
      expect(s.stats().requests.filter((r) => r.receivedAtMs > drainedAt)).toEqual([]);
      s.clearFaults();
      await handle.finished;
    } finally {
      await handle.stop();
    }
    try {
      expect(readGenerations(ctx.runDir, 'ds').length).toBe(120);
      expect(Number(await ctx.redis.hlen(ctx.keys.failed('ds')))).toBe(0);
    } finally {
      await ctx.close();
    }
  }, 120_000);

  it("a prompt SGLang rejects (400) fails alone, with SGLang's message and no retry; the rest of its batch commits", async () => {
    // The simulator's context is 2048 tokens, but the config claims more, so two long
    // prompts reach SGLang and get its 400.
    const s = await sim({
      timeScale: 50,
      maxRunningRequests: 32,
      seed: 7,
      contextLength: 2048,
      outputLength: { distribution: 'fixed', mean: 50 },
    });
    writePrompts(tmp.dir, 'bad', 64, (i) => ({
      id: `bad-${i}`,
      prompt: i === 5 || i === 40 ? 'long '.repeat(3000) : `short prompt ${i}`,
    }));
    const cfg = config(
      'bad',
      s.url,
      { prompts: 'bad.jsonl', maxNewTokens: 100, batchSize: 64 },
      { contextLength: 100_000, concurrency: 32 },
    );
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    try {
      await handle.finished;
    } finally {
      await handle.stop();
    }
    try {
      const failed = await ctx.redis.hgetall(ctx.keys.failed('ds'));
      expect(Object.keys(failed).sort()).toEqual(['bad-40', 'bad-5']);
      for (const v of Object.values(failed)) {
        const f = JSON.parse(v) as { reason: string; attempts: number; status: number };
        expect(f.reason).toMatch(/longer than the model's context length/);
        expect(f.status).toBe(400);
        // Not retried: a 400 is the prompt's own fault.
        expect(f.attempts).toBe(1);
      }
      expect(readGenerations(ctx.runDir, 'ds').length).toBe(62);
      expect(s.stats().failed).toBe(2);
      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      expect(status.datasets[0]?.failed).toBe(2);
    } finally {
      await ctx.close();
    }
  }, 60_000);

  it('the per-endpoint cap holds across worker processes together', async () => {
    const s = await sim({
      timeScale: 20,
      maxRunningRequests: 64,
      seed: 8,
      outputLength: { distribution: 'lognormal', mean: 500, sigma: 0.5 },
    });
    writePrompts(tmp.dir, 'cap', 200);
    const cfg = config('cap', s.url, { prompts: 'cap.jsonl', batchSize: 8 }, { concurrency: 12 });
    const ctx = await openRunContextFor(cfg);
    // The run's own worker plus two more: three processes' worth of dispatchers, one cap of 12.
    const extra = [0, 1].map(
      (i) =>
        new InferenceWorker({
          ...inferenceOptions(cfg),
          redisUrl: ctx.redisUrl,
          keys: ctx.keys,
          workerId: `extra-${i}`,
        }),
    );
    for (const w of extra) await w.start();
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    try {
      await handle.finished;
    } finally {
      await handle.stop();
      for (const w of extra) await w.stop(1_000);
    }
    try {
      expect(s.stats().maxRunningObserved).toBe(12);
      const records = readGenerations(ctx.runDir, 'ds');
      expect(records.length).toBe(200);
      // The extra workers really took part.
      expect(new Set(records.map((r) => r.worker)).size).toBeGreaterThanOrEqual(2);
    } finally {
      await ctx.close();
    }
  }, 120_000);
});
