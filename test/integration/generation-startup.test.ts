// Start-up runs its parts side by side (the worker, the tokenizer load, the sinks): a part that
// fails leaves nothing behind — no lock held, no worker running — and the next start completes.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import type { Config } from '../../src/shared/index.js';
import { loadTestConfig, testDataset } from '../helpers/config.js';
import { duplicates, readGenerations, writePrompts } from '../helpers/pipeline.js';
import { useHarness } from '../helpers/fixture.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 1_000, maxRunningRequests: 16, seed: 5, outputLength: { distribution: 'fixed', mean: 8 } },
  tmp: true,
});

function config(tokenizerPath?: string): Config {
  return loadTestConfig(tmp.dir, {
    run: 'startup',
    redis,
    sim,
    sglang: { requestTimeoutMs: 900_000 },
    ...(tokenizerPath === undefined ? {} : { tokenizer: { path: tokenizerPath } }),
    datasets: ['one', 'two'].map((name) => testDataset(name, { name, tokenBudget: 1_000_000, maxNewTokens: 16 })),
  });
}

describe('generation start-up', () => {
  it('a tokenizer that fails to load while the worker and the sinks start: the start fails, no lock is left, the next start completes every prompt once', async () => {
    writePrompts(tmp.dir, 'one', 60);
    writePrompts(tmp.dir, 'two', 45);
    const broken = path.join(tmp.dir, 'broken-tokenizer');
    mkdirSync(broken, { recursive: true });
    writeFileSync(path.join(broken, 'tokenizer.json'), '{ "model": ');
    writeFileSync(path.join(broken, 'tokenizer_config.json'), '{}');

    const failing = await openRunContextFor(config(broken));
    try {
      await expect(startGeneration(failing, { produce: true, infer: true })).rejects.toThrow(/tokenizer/i);
      const { keys } = failing;
      expect(await failing.redis.exists(keys.producerLock(), keys.sinkLock('one'), keys.sinkLock('two'))).toBe(0);
      expect(sim.stats().requests.length).toBe(0);
    } finally {
      await failing.close();
    }

    const ctx = await openRunContextFor(config());
    try {
      const handle = await startGeneration(ctx, { produce: true, infer: true });
      try {
        await handle.finished;
      } finally {
        await handle.stop();
      }
      for (const [name, n] of [
        ['one', 60],
        ['two', 45],
      ] as const) {
        const ids = readGenerations(ctx.runDir, name).map((l) => l.id);
        expect(ids.length).toBe(n);
        expect(duplicates(ids)).toEqual([]);
      }
    } finally {
      await ctx.close();
    }
  }, 120_000);
});
