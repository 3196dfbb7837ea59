// The last pass over a big file is the costly one (issue 7, defect 4): when the counters prove
// every enqueued prompt is committed or failed, the producer completes the dataset without
// reading the file again; a restarted producer still makes sure nothing was left behind.
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { readRunStatus } from '../../src/shared/index.js';
import { loadTestConfig } from '../helpers/config.js';
import { duplicates, readGenerations, writePrompts } from '../helpers/pipeline.js';
import { useHarness } from '../helpers/fixture.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 100, maxRunningRequests: 16, seed: 4, outputLength: { distribution: 'fixed', mean: 30 } },
  tmp: true,
});

describe('producer: the final pass', () => {
  it('completes after one pass when every enqueued prompt is accounted for; a rerun enqueues nothing', async () => {
    const n = 300;
    writePrompts(tmp.dir, 'once', n, (i) =>
      i === 7 ? { id: 'once-3', prompt: 'a repeated id' } : { id: `once-${i}`, prompt: `prompt ${i}` },
    );
    const cfg = loadTestConfig(tmp.dir, {
      run: 'once',
      redis,
      sim,
      datasets: [{ name: 'once', prompts: 'once.jsonl', tokenBudget: 1_000_000, maxNewTokens: 64, batchSize: 16 }],
    });
    for (const round of [1, 2]) {
      const ctx = await openRunContextFor(cfg);
      const before = sim.stats().requests.length;
      const handle = await startGeneration(ctx, { produce: true, infer: true });
      try {
        await handle.finished;
      } finally {
        await handle.stop();
      }
      try {
        const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
        expect(status.datasets[0]).toMatchObject({ records: n - 1, failed: 0, rejected: 1, status: 'completed' });
        const producer = await ctx.redis.hgetall(ctx.keys.producer('once'));
        // Round 1: one pass (epoch 0), no verification pass. Round 2 (a restart after the
        // end): it resumes after its cursor, then one check from line 1 that finds nothing.
        expect(Number(producer.epoch ?? 0)).toBe(round === 1 ? 0 : 1);
        if (round === 2) expect(sim.stats().requests.length).toBe(before);
        const lines = readGenerations(ctx.runDir, 'once');
        expect(lines.length).toBe(n - 1);
        expect(duplicates(lines.map((l) => l.id))).toEqual([]);
      } finally {
        await ctx.close();
      }
    }
  }, 120_000);
});
