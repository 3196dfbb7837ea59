// The dispatcher under faults at the worst moments: 503 bursts on the last prompts of a
// dataset, and a Redis freeze longer than the request leases.
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { inferenceOptions, type loadConfig } from '../../src/shared/index.js';
import { loadTestConfig } from '../helpers/config.js';
import { InferenceWorker } from '../../src/workers/inference/worker.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';
import { duplicates, readGenerations, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, startSim: sim } = useHarness({ redis: true, tmp: true });

function config(
  run: string,
  endpoint: string,
  prompts: string,
  sglang: Record<string, unknown> = {},
  workers: Record<string, unknown> = {},
): ReturnType<typeof loadConfig> {
  return loadTestConfig(tmp.dir, {
    run,
    redis,
    sim: endpoint,
    sglang: { requestTimeoutMs: 30_000, ...sglang },
    dataset: { prompts, maxNewTokens: 4096 },
    workers: { shutdownGraceMs: 2_000, ...workers },
  });
}

function workerFor(
  cfg: ReturnType<typeof loadConfig>,
  ctx: Awaited<ReturnType<typeof openRunContextFor>>,
  extra: Partial<ConstructorParameters<typeof InferenceWorker>[0]> = {},
): InferenceWorker {
  return new InferenceWorker({
    ...inferenceOptions(cfg),
    redisUrl: ctx.redisUrl,
    keys: ctx.keys,
    batchSize: 8,
    logger: quietLogger(),
    ...extra,
  });
}

describe('dispatch under faults', () => {
  it('503 "queue full" bursts on the last prompts of a dataset: the run ends, each prompt committed once, the accounting holds throughout', async () => {
    const s = await sim({
      timeScale: 40,
      maxRunningRequests: 16,
      seed: 21,
      outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.6 },
    });
    writePrompts(tmp.dir, 'tail503', 150);
    const cfg = config('tail503', s.url, 'tail503.jsonl');
    const ctx = await openRunContextFor(cfg);
    const worker = workerFor(cfg, ctx);
    await worker.start();
    const handle = await startGeneration(ctx, { produce: true, infer: false });
    const violations: string[] = [];
    const watch = setInterval(() => {
      const v = worker.dispatchInvariantViolation();
      if (v !== undefined) violations.push(v);
    }, 5);
    try {
      const records = async (): Promise<number> => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0);
      // The worst moment: the last prompts. Every burst answers the next requests 503 while
      // others are being acquired, so samples go back to the front of the line mid-pass.
      for (const at of [120, 132, 140, 145]) {
        await waitFor(async () => (await records()) >= at, `${at} records`, 60_000, 5);
        s.setFaults({ burst503: 6 });
      }
      await Promise.race([
        handle.finished,
        new Promise((_, reject) =>
          setTimeout(() => reject(new Error(`run hung: ${JSON.stringify(worker.dispatchAccounting())}`)), 45_000),
        ),
      ]);
      const out = readGenerations(ctx.runDir, 'ds');
      expect(duplicates(out.map((r) => r.id))).toEqual([]);
      expect(out.length).toBe(150);
      expect(await ctx.redis.hlen(ctx.keys.failed('ds'))).toBe(0);
      expect(violations).toEqual([]);
      const a = worker.dispatchAccounting();
      expect(a?.submitted).toBe(a?.settled);
      // The bursts did land: requests were answered 503 and sent again.
      expect(s.stats().failed).toBeGreaterThanOrEqual(6);
    } finally {
      clearInterval(watch);
      await worker.stop(1_000);
      await handle.stop();
      await ctx.close();
    }
  }, 90_000);
});
