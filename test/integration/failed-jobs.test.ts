// Failed prompts are failed BullMQ jobs (what Bull Board shows): a server answers 500 to a few
// prompts until their attempts are spent; their batches end failed, carrying exactly them, with
// the reason; Bull Board's Retry (`job.retry()`), "retry all" and `tokenmill retry-failed` send
// them again through the normal path, each committed once.
import { beforeAll, describe, expect, it } from 'vitest';
import { Queue, type Job } from 'bullmq';
import { startGeneration, type GenerationHandle } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import {
  batchSamples,
  generateQueueName,
  GenerateBatchPayloadSchema,
  loadConfig,
  readRunStatus,
  type BatchProgress,
} from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { INJECTED_500_MESSAGE, startPromptFaultProxy, type PromptFaultProxy } from '../helpers/prompt-fault-proxy.js';

const { redis, sim, tmp, defer } = useHarness({
  redis: true,
  tmp: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 5, outputLength: { distribution: 'fixed', mean: 200 } },
  cli: true,
});
let proxy: PromptFaultProxy;

beforeAll(async () => {
  proxy = await startPromptFaultProxy(sim.url);
  defer(() => proxy.close());
});

function yamlFor(
  run: string,
  ds: string,
  n: number,
  batchSize: number,
): { path: string; cfg: ReturnType<typeof loadConfig> } {
  writePrompts(tmp.dir, ds, n);
  const yaml = {
    run,
    redis: { url: redis.url, prefix: redis.prefix },
    sglang: { endpoints: [proxy.url], concurrency: 16, maxAttempts: 2, requestTimeoutMs: 30_000 },
    datasets: [{ name: ds, prompts: `${ds}.jsonl`, tokenBudget: 1_000_000_000, maxNewTokens: 512, batchSize }],
    output: { dir: 'out' },
    workers: { shutdownGraceMs: 2_000 },
  };
  return {
    path: writeConfig(tmp.dir, yaml as never, `${run}.yaml`),
    cfg: loadConfig({ baseDir: tmp.dir, object: yaml }),
  };
}

const failedCount = async (ctx: RunContext, ds: string): Promise<number> => ctx.redis.hlen(ctx.keys.failed(ds));
const isDone = async (ctx: RunContext, ds: string, id: string): Promise<boolean> =>
  (await ctx.redis.sismember(ctx.keys.done(ds), id)) === 1;

/** Sample ids carried by a job's data. */
function idsOf(job: Job): string[] {
  return batchSamples(GenerateBatchPayloadSchema.parse(job.data)).map((s) => s.id);
}

describe('failed prompts are failed jobs of their dataset queue', () => {
  it('shows each failed prompt with its reason; Bull Board Retry, retry all and retry-failed commit each exactly once', async () => {
    const ds = 'fj';
    const bad = ['fj-7', 'fj-23', 'fj-41'];
    for (const id of bad) proxy.failing.add(id);
    const { path: cfgPath, cfg } = yamlFor('failed-jobs', ds, 60, 10);
    const ctx = await openRunContextFor(cfg);
    const queue = new Queue(generateQueueName(ds), { connection: ctx.redis, prefix: ctx.keys.bullPrefix });
    let worker: GenerationHandle | undefined;
    try {
      const run = await startGeneration(ctx, { produce: true, infer: true });
      await run.finished;
      await run.stop();

      // Every prompt answered 500 until its 2 attempts were spent is failed, and nothing else.
      expect((await ctx.redis.hkeys(ctx.keys.failed(ds))).sort()).toEqual([...bad].sort());
      const failedJobs = await queue.getJobs(['failed']);
      expect(failedJobs).toHaveLength(3);
      expect(failedJobs.flatMap(idsOf).sort()).toEqual([...bad].sort());
      for (const job of failedJobs) {
        const [id] = idsOf(job);
        const line = Number(id?.slice(3)) + 1;
        // Named by dataset and lines; the reason names line, id, status, attempts and SGLang's message.
        expect(job.name).toMatch(/^fj lines \d+–\d+$/);
        expect(job.failedReason).toContain(`1 of 10 prompt(s) failed in ${job.name}`);
        expect(job.failedReason).toContain(`line ${line} (id ${id}), HTTP 500, 2 attempt(s)`);
        expect(job.failedReason).toContain(INJECTED_500_MESSAGE);
        // The data now carries only the failed prompt, ids and lines first, token ids last.
        expect(Object.keys(job.data as object)[0]).toBe('dataset');
        expect(Object.keys(job.data as object).at(-1)).toBe('prompts');
        expect((job.data as { retryOfFailed?: boolean }).retryOfFailed).toBe(true);
        expect(job.progress as BatchProgress).toEqual({ committed: 9, failed: 1, skipped: 0, size: 10 });
        const { logs } = await queue.getJobLogs(String(job.id));
        expect(
          logs.some(
            (l) =>
              l.startsWith(`line ${line} (id ${id}): attempt 1 of 2 failed, will retry:`) && l.includes('returned 500'),
          ),
        ).toBe(true);
        expect(logs.some((l) => l.startsWith(`line ${line} (id ${id}): failed (HTTP 500) after 2 attempt(s):`))).toBe(
          true,
        );
      }
      const completed = await queue.getJobs(['completed']);
      expect(completed.length).toBeGreaterThan(0);
      for (const job of completed)
        expect(job.progress as BatchProgress).toEqual({ committed: 10, failed: 0, skipped: 0, size: 10 });
      expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets[0]?.failed).toBe(3);
      const recordsBefore = readGenerations(ctx.runDir, ds).length;
      expect(recordsBefore).toBe(57);

      // The server is fixed; an inference worker serves the queue (no producer running).
      proxy.failing.clear();
      worker = await startGeneration(ctx, { produce: false, infer: true });
      const sentBefore = new Map(bad.map((id) => [id, proxy.requests(id)]));
      const sentAgain = (id: string): number => proxy.requests(id) - (sentBefore.get(id) ?? 0);

      // 1. Bull Board's Retry on one job.
      const first = failedJobs.find((j) => idsOf(j)[0] === bad[0]);
      if (first === undefined) throw new Error('no failed job for the first bad prompt');
      await first.retry('failed');
      await waitFor(() => isDone(ctx, ds, bad[0] ?? ''), 'the retried prompt committed', 30_000);
      await waitFor(async () => (await first.getState()) === 'completed', 'the retried job completed', 10_000);
      expect(await failedCount(ctx, ds)).toBe(2);
      expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets[0]?.failed).toBe(2);
      expect(sentAgain(bad[0] ?? '')).toBe(1);
      expect(sentAgain(bad[1] ?? '')).toBe(0);
      expect(
        (await queue.getJobLogs(String(first.id))).logs.some((l) => l.includes('sent again with fresh attempts')),
      ).toBe(true);

      // 2. Bull Board's "retry all failed" and `tokenmill retry-failed` at the same moment.
      const retryAll = (async () => {
        for (const job of await queue.getJobs(['failed'])) await job.retry('failed').catch(() => undefined);
      })();
      const cli = spawnCli(['retry-failed', '-c', cfgPath, ds]);
      await retryAll;
      expect(await cli.exited, cli.output()).toBe(0);
      expect(cli.output()).toMatch(/fj: \d+ failed prompt\(s\) will be sent again/);
      await waitFor(
        async () =>
          (await failedCount(ctx, ds)) === 0 &&
          (await isDone(ctx, ds, bad[1] ?? '')) &&
          (await isDone(ctx, ds, bad[2] ?? '')),
        'every retried prompt committed',
        30_000,
      );
      // No failed job left; each prompt sent once more and committed once.
      await waitFor(
        async () => (await queue.getJobCounts('failed', 'active', 'wait')).active === 0,
        'retried jobs finished',
        10_000,
      );
      expect((await queue.getJobCounts('failed')).failed).toBe(0);
      for (const id of bad) expect(sentAgain(id), id).toBe(1);
      const stats = await ctx.redis.hgetall(ctx.keys.stats(ds));
      expect(Number(stats.records)).toBe(60);
      // The committed results (the sink wrote the first run's; the rest are still in the stream): each id once.
      const stream = await ctx.redis.xrange(ctx.keys.results(ds), '-', '+');
      const streamIds = stream.map(([, fields]) => (JSON.parse(fields[1] ?? '{}') as { id: string }).id);
      const all = [...readGenerations(ctx.runDir, ds).map((r) => r.id), ...streamIds];
      expect(duplicates(all)).toEqual([]);
      expect(new Set(all).size).toBe(60);
      expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets[0]?.failed).toBe(0);
    } finally {
      await worker?.stop();
      await queue.close();
      await ctx.close();
    }
  }, 120_000);
});

describe('a retry while the producer is still running', () => {
  it('sends the retried prompt once; the producer does not send it again; all commit once', async () => {
    const ds = 'fr';
    const n = 300;
    proxy.failing.add('fr-3');
    const { cfg } = yamlFor('failed-retry-running', ds, n, 8);
    const ctx = await openRunContextFor(cfg);
    const queue = new Queue(generateQueueName(ds), { connection: ctx.redis, prefix: ctx.keys.bullPrefix });
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    let finished = false;
    void handle.finished.then(
      () => (finished = true),
      () => (finished = true),
    );
    try {
      const job = (await waitFor(async () => (await queue.getJobs(['failed']))[0], 'the failed job', 60_000)) as Job;
      proxy.failing.clear();
      const before = proxy.requests('fr-3');
      expect(finished).toBe(false);
      await job.retry('failed');
      await handle.finished;
      expect(proxy.requests('fr-3') - before).toBe(1);
    } finally {
      await handle.stop();
    }
    try {
      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      expect(status.datasets[0]).toMatchObject({ records: n, failed: 0, status: 'completed' });
      const lines = readGenerations(ctx.runDir, ds);
      expect(lines.length).toBe(n);
      expect(duplicates(lines.map((l) => l.id))).toEqual([]);
    } finally {
      await queue.close();
      await ctx.close();
    }
  }, 120_000);
});
