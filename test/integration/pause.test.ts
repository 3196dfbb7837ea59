// Pause means pause: `tokenmill pause`, the dashboard's pauseDataset() and Bull Board's pause
// of a queue stop a dataset's new requests within a second on every worker — including the
// samples of batches a worker already holds — while requests in flight finish and the other
// datasets go on; resume continues where it stopped, with the same budget semantics.
import { describe, expect, it } from 'vitest';
import { Queue } from 'bullmq';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import {
  generateQueueName,
  inferenceOptions,
  isDatasetPaused,
  loadConfig,
  pauseDataset,
  readRunStatus,
  resumeDataset,
} from '../../src/shared/index.js';
import { InferenceWorker } from '../../src/workers/inference/worker.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';
import { duplicates, readGenerations, spawnCli, waitFor, writeConfig, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, startSim } = useHarness({ redis: true, tmp: true, cli: true });

function setup(
  run: string,
  endpoint: string,
  datasets: { name: string; n: number; tokenBudget: number; batchSize: number }[],
  concurrency: number,
): { path: string; cfg: ReturnType<typeof loadConfig> } {
  for (const d of datasets) writePrompts(tmp.dir, d.name, d.n);
  const yaml = {
    run,
    redis: { url: redis.url, prefix: redis.prefix },
    sglang: { endpoints: [endpoint], concurrency, requestTimeoutMs: 60_000 },
    datasets: datasets.map((d) => ({
      name: d.name,
      prompts: `${d.name}.jsonl`,
      tokenBudget: d.tokenBudget,
      maxNewTokens: 4096,
      batchSize: d.batchSize,
    })),
    output: { dir: 'out' },
    workers: { shutdownGraceMs: 5_000 },
  };
  return {
    path: writeConfig(tmp.dir, yaml as never, `${run}.yaml`),
    cfg: loadConfig({ baseDir: tmp.dir, object: yaml }),
  };
}

/** Requests the simulator received for a dataset, optionally only after `afterMs`. */
function sent(sim: SimulatorHandle, ds: string, afterMs = 0): number {
  return sim.stats().requests.filter((r) => r.rid.startsWith(`${ds}/`) && r.receivedAtMs > afterMs).length;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('pause means pause', () => {
  it('CLI, dashboard and Bull Board pauses stop one dataset within a second on every worker while the other goes on; resume keeps the budget semantics', async () => {
    // Real-time requests (1.25 s each): the work done while the CLI starts stays small.
    const sim = await startSim({
      timeScale: 1,
      maxRunningRequests: 16,
      seed: 21,
      outputLength: { distribution: 'fixed', mean: 100 },
    });
    const budget = 20_000;
    const { path: cfgPath, cfg } = setup(
      'pause-mid',
      sim.url,
      [
        { name: 'pa', n: 400, tokenBudget: budget, batchSize: 8 },
        { name: 'pb', n: 150, tokenBudget: 1_000_000_000, batchSize: 8 },
      ],
      16,
    );
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    // A second inference worker: a pause holds across every worker.
    const second = new InferenceWorker({
      ...inferenceOptions(cfg),
      redisUrl: ctx.redisUrl,
      keys: ctx.keys,
      logger: quietLogger(),
    });
    await second.start();
    const records = async (ds: string): Promise<number> =>
      Number((await ctx.redis.hget(ctx.keys.stats(ds), 'records')) ?? 0);
    const pbQueue = new Queue(generateQueueName('pb'), { connection: ctx.redis, prefix: ctx.keys.bullPrefix });
    const paQueue = new Queue(generateQueueName('pa'), { connection: ctx.redis, prefix: ctx.keys.bullPrefix });
    try {
      await waitFor(
        async () => (await records('pa')) >= 5 && (await records('pb')) >= 5,
        'both datasets generating',
        60_000,
      );
      await waitFor(() => second.inFlight > 0, 'the second worker sending', 30_000);

      // 1. `tokenmill pause pb` (the CLI): pb's requests stop within a second on both workers,
      //    held batches included; pa goes on.
      const cli = spawnCli(['pause', '-c', cfgPath, 'pb']);
      expect(await cli.exited, cli.output()).toBe(0);
      const pbPausedAt = Date.now();
      expect(await pbQueue.isPaused()).toBe(true);
      await sleep(1_000);
      const pbFrozen = sent(sim, 'pb');
      const paBefore = sent(sim, 'pa');
      await sleep(1_500);
      expect(sent(sim, 'pb'), 'pb requests while paused by the CLI').toBe(pbFrozen);
      expect(sent(sim, 'pb', pbPausedAt + 1_000)).toBe(0);
      expect(sent(sim, 'pa') - paBefore, 'pa requests while pb is paused').toBeGreaterThan(5);
      // Requests in flight finished; status shows the pause.
      await waitFor(
        async () => (await ctx.redis.zcount(ctx.keys.inflight('pb'), Date.now(), '+inf')) === 0,
        'pb requests in flight finished',
        5_000,
      );
      expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets.find((d) => d.name === 'pb')?.status).toBe(
        'paused',
      );
      const pbRecordsPaused = await records('pb');

      // 2. resumeDataset (what the dashboard calls) undoes it: pb goes on.
      await resumeDataset(ctx.redis, ctx.keys, 'pb');
      await waitFor(async () => (await records('pb')) > pbRecordsPaused, 'pb committing again after resume', 10_000);

      // 3. Bull Board's pause of pa's queue (Queue.pause): pa stops, pb goes on; the dashboard's
      //    function sees the same state and its resume undoes it.
      expect(
        Number(await ctx.redis.hget(ctx.keys.stats('pa'), 'outputTokens')),
        'pa still short of its budget',
      ).toBeLessThan(budget);
      await paQueue.pause();
      const paPausedAt = Date.now();
      await sleep(1_000);
      const paFrozen = sent(sim, 'pa');
      const pbBefore = sent(sim, 'pb');
      await sleep(1_500);
      expect(sent(sim, 'pa'), 'pa requests while paused in Bull Board').toBe(paFrozen);
      expect(sent(sim, 'pa', paPausedAt + 1_000)).toBe(0);
      expect(sent(sim, 'pb') - pbBefore, 'pb requests while pa is paused').toBeGreaterThan(5);
      expect(await isDatasetPaused(ctx.redis, ctx.keys, 'pa')).toBe(true);
      await resumeDataset(ctx.redis, ctx.keys, 'pa');
      expect(await paQueue.isPaused()).toBe(false);

      await handle.finished;
    } finally {
      await second.stop(2_000);
      await handle.stop();
      await pbQueue.close();
      await paQueue.close();
    }
    try {
      // pa: the budget semantics hold across the pause; pb: every prompt once.
      const stats = await ctx.redis.hgetall(ctx.keys.stats('pa'));
      const tokens = Number(stats.outputTokens);
      expect(tokens).toBeGreaterThanOrEqual(budget);
      expect(tokens).toBeLessThanOrEqual(budget + 16 * 100);
      expect(sent(sim, 'pa', Number(stats.budgetMetMs) + 100)).toBe(0);
      const pa = readGenerations(ctx.runDir, 'pa');
      expect(duplicates(pa.map((r) => r.id))).toEqual([]);
      expect(pa.reduce((a, r) => a + r.completion_tokens, 0)).toBe(tokens);
      const pb = readGenerations(ctx.runDir, 'pb');
      expect(pb.length).toBe(150);
      expect(duplicates(pb.map((r) => r.id))).toEqual([]);
      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      expect(status.datasets.map((d) => d.status)).toEqual(['completed', 'completed']);
    } finally {
      await ctx.close();
    }
  }, 180_000);

  it('pausing with a held batch half in flight, then with the last prompts in flight: in-flight requests finish, nothing new is sent, resume sends the rest once', async () => {
    const sim = await startSim({
      timeScale: 10,
      maxRunningRequests: 16,
      seed: 22,
      outputLength: { distribution: 'fixed', mean: 2000 },
    });
    const n = 24;
    const { cfg } = setup('pause-tail', sim.url, [{ name: 'pc', n, tokenBudget: 1_000_000_000, batchSize: n }], 16);
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    const records = async (): Promise<number> => Number((await ctx.redis.hget(ctx.keys.stats('pc'), 'records')) ?? 0);
    try {
      // One batch of 24, held by the worker: 16 in flight, 8 waiting in its dispatcher.
      await waitFor(() => sent(sim, 'pc') === 16, '16 requests in flight', 30_000);
      await pauseDataset(ctx.redis, ctx.keys, 'pc');
      const pausedAt = Date.now();
      // The 16 in flight finish and commit; the 8 held samples are not sent.
      await waitFor(async () => (await records()) === 16, 'the requests in flight committed', 30_000);
      await sleep(Math.max(0, pausedAt + 1_500 - Date.now()));
      expect(sent(sim, 'pc')).toBe(16);
      await resumeDataset(ctx.redis, ctx.keys, 'pc');
      // The last 8 go out; pause again while they are in flight.
      await waitFor(() => sent(sim, 'pc') === n, 'the last prompts sent', 10_000);
      await pauseDataset(ctx.redis, ctx.keys, 'pc');
      await waitFor(async () => (await records()) === n, 'the last prompts committed while paused', 30_000);
      // Nothing was left to send: the dataset completes while paused.
      await handle.finished;
      await resumeDataset(ctx.redis, ctx.keys, 'pc');
      expect(sent(sim, 'pc')).toBe(n);
    } finally {
      await handle.stop();
    }
    try {
      const lines = readGenerations(ctx.runDir, 'pc');
      expect(lines.length).toBe(n);
      expect(duplicates(lines.map((l) => l.id))).toEqual([]);
      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      expect(status.datasets[0]).toMatchObject({ records: n, failed: 0, skipped: 0, status: 'completed' });
    } finally {
      await ctx.close();
    }
  }, 120_000);
});
