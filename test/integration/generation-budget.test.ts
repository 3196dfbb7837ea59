import { describe, expect, it } from 'vitest';
import { Queue } from 'bullmq';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import { generateQueueName, readRunStatus, type ConfigInput, type loadConfig } from '../../src/shared/index.js';
import { loadTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, sampleIdOfRid, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, startSim } = useHarness({ redis: true, tmp: true });
let sim: SimulatorHandle;

function config(
  run: string,
  endpoint: string,
  datasets: ConfigInput['datasets'],
  extra: TestConfigSpec = {},
): ReturnType<typeof loadConfig> {
  return loadTestConfig(tmp.dir, {
    run,
    redis,
    sim: endpoint,
    sglang: { concurrency: 32, requestTimeoutMs: 30_000 },
    datasets,
    workers: { shutdownGraceMs: 2_000 },
    ...extra,
  });
}

async function runToEnd(cfg: ReturnType<typeof loadConfig>): Promise<Awaited<ReturnType<typeof openRunContextFor>>> {
  const ctx = await openRunContextFor(cfg);
  const handle = await startGeneration(ctx, { produce: true, infer: true });
  await handle.finished;
  await handle.stop();
  return ctx;
}

describe('generation: budgets and exactly-once accounting', () => {
  it('stops at the budget: tokens in [budget, budget + overshoot], no request after it was met, queued prompts skipped', async () => {
    sim = await startSim({ timeScale: 200, maxRunningRequests: 32, seed: 3 });
    writePrompts(tmp.dir, 'big', 600);
    const budget = 150_000;
    const cfg = config('budget', sim.url, [
      { name: 'big', prompts: 'big.jsonl', tokenBudget: budget, maxNewTokens: 4096, batchSize: 16 },
    ]);
    const ctx = await runToEnd(cfg);
    try {
      const stats = await ctx.redis.hgetall(ctx.keys.stats('big'));
      const tokens = Number(stats.outputTokens);
      expect(tokens).toBeGreaterThanOrEqual(budget);
      // The overshoot is what was in flight when the budget was met; with 32 slots and
      // completions capped at 4096 tokens it stays well under a quarter of this budget.
      expect(tokens).toBeLessThanOrEqual(budget * 1.25);

      const budgetMetMs = Number(stats.budgetMetMs);
      expect(budgetMetMs).toBeGreaterThan(0);
      const sent = sim.stats().requests.filter((r) => r.rid.startsWith('big/'));
      // A request admitted just before the budget was met may reach the server a few ms after
      // it; nothing admitted later is sent (with dispatch going on, dozens of requests a second
      // would keep arriving).
      const late = sent.filter((r) => r.receivedAtMs > budgetMetMs + 100);
      expect(late).toEqual([]);

      const records = readGenerations(ctx.runDir, 'big');
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(tokens);
      expect(records.length).toBe(Number(stats.records));
      // Each record is a sample the simulator really answered.
      const sentIds = new Set(sent.map((r) => sampleIdOfRid(r.rid)));
      for (const r of records) expect(sentIds.has(r.id)).toBe(true);

      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      const ds = status.datasets[0];
      expect(ds?.status).toBe('completed');
      // Prompts that were queued but never sent are recorded as skipped by budget (so a higher
      // budget resumes them); none of them has a record.
      const skipped = await ctx.redis.smembers(ctx.keys.skipped('big'));
      expect(ds?.skipped).toBe(skipped.length);
      expect(skipped.length).toBeGreaterThan(0);
      const recorded = new Set(records.map((r) => r.id));
      expect(skipped.filter((id) => recorded.has(id) || sentIds.has(id))).toEqual([]);
      expect(await ctx.redis.zcard(ctx.keys.inflight('big'))).toBe(0);
    } finally {
      await ctx.close();
    }
  });

  it('a dataset already at its budget sends nothing; a raised budget resumes the skipped prompts', async () => {
    const before = sim.stats().requests.filter((r) => r.rid.startsWith('big/')).length;
    const again = await runToEnd(
      config('budget', sim.url, [
        { name: 'big', prompts: 'big.jsonl', tokenBudget: 150_000, maxNewTokens: 4096, batchSize: 16 },
      ]),
    );
    await again.close();
    expect(sim.stats().requests.filter((r) => r.rid.startsWith('big/')).length).toBe(before);

    const raised = await runToEnd(
      config('budget', sim.url, [
        { name: 'big', prompts: 'big.jsonl', tokenBudget: 300_000, maxNewTokens: 4096, batchSize: 16 },
      ]),
    );
    try {
      const tokens = Number(await raised.redis.hget(raised.keys.stats('big'), 'outputTokens'));
      expect(tokens).toBeGreaterThanOrEqual(300_000);
      const records = readGenerations(raised.runDir, 'big');
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(tokens);
    } finally {
      await raised.close();
    }
  });

  it('adding a dataset to a pipeline: the finished one sends nothing, the new one runs', async () => {
    writePrompts(tmp.dir, 'newcomer', 40);
    const before = sim.stats().requests.filter((r) => r.rid.startsWith('big/')).length;
    const ctx = await runToEnd(
      config('budget', sim.url, [
        { name: 'big', prompts: 'big.jsonl', tokenBudget: 300_000, maxNewTokens: 4096, batchSize: 16 },
        { name: 'newcomer', prompts: 'newcomer.jsonl', tokenBudget: 100_000_000, maxNewTokens: 1024, batchSize: 16 },
      ]),
    );
    try {
      expect(sim.stats().requests.filter((r) => r.rid.startsWith('big/')).length).toBe(before);
      expect(readGenerations(ctx.runDir, 'newcomer').length).toBe(40);
      expect(await ctx.redis.smembers(ctx.keys.datasets())).toEqual(expect.arrayContaining(['big', 'newcomer']));
    } finally {
      await ctx.close();
    }
  });

  it('a batch delivered twice commits every sample once', async () => {
    writePrompts(tmp.dir, 'dup', 48);
    const cfg = config('dup', sim.url, [
      { name: 'dup', prompts: 'dup.jsonl', tokenBudget: 100_000_000, maxNewTokens: 2048, batchSize: 16 },
    ]);
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    // While the producer feeds the queue, copy every batch it adds under a second job id:
    // the same samples delivered twice, as a re-delivered or duplicated job would be.
    const queue = new Queue(generateQueueName('dup'), { connection: redis.connection(), prefix: ctx.keys.bullPrefix });
    const copied = new Set<string>();
    const copier = setInterval(() => {
      void (async () => {
        for (const job of await queue.getJobs(['waiting', 'active', 'completed'])) {
          if (job.id === undefined || job.id.startsWith('copy-') || copied.has(job.id)) continue;
          copied.add(job.id);
          await queue.add('batch', job.data, { jobId: `copy-${job.id}` });
        }
      })();
    }, 20);
    try {
      await handle.finished;
      await waitFor(
        async () =>
          (await queue.getJobCounts('waiting', 'active')).waiting === 0 &&
          (await queue.getJobCounts('active')).active === 0,
        'copies processed',
      );
    } finally {
      clearInterval(copier);
      await handle.stop();
    }
    try {
      expect(copied.size).toBeGreaterThan(0);
      const stats = await ctx.redis.hgetall(ctx.keys.stats('dup'));
      const records = readGenerations(ctx.runDir, 'dup');
      expect(records.length).toBe(48);
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(Number(stats.records)).toBe(48);
      expect(records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(Number(stats.outputTokens));
    } finally {
      await queue.close();
      await ctx.close();
    }
  });
  it('budget: strict in the config reaches the worker: in-flight requests are aborted at the budget and kept as abort records', async () => {
    await sim?.stop();
    // Every completion runs to max_new_tokens, so the budget is met in the first wave, while
    // every request of it is still decoding: at least one abort is certain, not a matter of timing.
    sim = await startSim({
      timeScale: 10,
      maxRunningRequests: 32,
      seed: 5,
      outputLength: { distribution: 'fixed', mean: 4096 },
    });
    writePrompts(tmp.dir, 'strict', 400);
    const budget = 40_000;
    const cfg = config('strict', sim.url, [
      {
        name: 'strict',
        prompts: 'strict.jsonl',
        tokenBudget: budget,
        budget: 'strict',
        maxNewTokens: 4096,
        batchSize: 16,
      },
    ]);
    const ctx = await runToEnd(cfg);
    try {
      const tokens = Number((await ctx.redis.hget(ctx.keys.stats('strict'), 'outputTokens')) ?? 0);
      const records = readGenerations(ctx.runDir, 'strict');
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(tokens);
      // What was in flight at the stop ends early, with its partial output kept.
      const aborted = records.filter((r) => r.finish_reason.type === 'abort');
      // The whole first wave, stopped part-way (none reaches its 4096 tokens).
      expect(aborted.length).toBeGreaterThan(0);
      expect(aborted.length).toBe(records.length);
      expect(aborted.every((r) => r.completion_tokens > 0 && r.completion_tokens < 4096)).toBe(true);
      expect(tokens).toBeGreaterThanOrEqual(budget);
      // Past the budget: what the server produced during the stop's round trip (wall time, so
      // timeScale times more here than against a real server), not the rest of their completions.
      expect(tokens).toBeLessThan(budget * 1.1);
    } finally {
      await ctx.close();
    }
  });
});
