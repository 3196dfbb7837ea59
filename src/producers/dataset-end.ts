/**
 * How the producer ends a dataset (docs/design.md, invariants 3, 4, 11): completed, when its
 * budget is met or its prompts are exhausted; stopped `failed`, when passes over its prompts bring
 * no sample to an end; and the counts that tell which.
 */
import type { Queue } from 'bullmq';
import type { DatasetConfig, Logger, RunKeys, ScriptedRedis } from '../shared/index.js';

/**
 * Passes in a row that sent samples and saw none of them committed, failed or finished before a
 * dataset is stopped (`status: failed`, with the cause): a pass without progress is never
 * repeated for ever (docs/design.md, invariant 12).
 */
export const MAX_PASSES_WITHOUT_PROGRESS = 3;

/** Committed plus failed samples of a dataset (with `turns: all`: its finished conversations). */
export async function accountedCount(redis: ScriptedRedis, keys: RunKeys, ds: DatasetConfig): Promise<number> {
  // A conversation is what was enqueued; its turns are committed one by one under their own ids.
  if (ds.turns === 'all') return redis.hlen(keys.conversations(ds.name));
  const [records, failed] = await Promise.all([
    redis.hget(keys.stats(ds.name), 'records'),
    redis.hlen(keys.failed(ds.name)),
  ]);
  return Number(records ?? 0) + failed;
}

/** What grows whenever a sample of the dataset comes to an end: records, failures, finished conversations. */
export async function progressMark(redis: ScriptedRedis, keys: RunKeys, ds: DatasetConfig): Promise<string> {
  const [records, failed, conversations] = await Promise.all([
    redis.hget(keys.stats(ds.name), 'records'),
    redis.hlen(keys.failed(ds.name)),
    ds.turns === 'all' ? redis.hlen(keys.conversations(ds.name)) : Promise.resolve(0),
  ]);
  return `${records ?? 0}/${failed}/${conversations}`;
}

/**
 * Stops a dataset whose last passes made no progress: its status becomes `failed`, with a
 * reason naming the cause (the last failed batch job's error), shown by `status`, the pipeline
 * page and `/metrics`. The next `run` (or `produce`) starts it again.
 */
export async function stopWithoutProgress(
  redis: ScriptedRedis,
  keys: RunKeys,
  ds: DatasetConfig,
  queue: Queue,
  passes: { passes: number; enqueued: number },
  log: Logger,
): Promise<void> {
  const [last] = await queue.getJobs(['failed'], 0, 0, false);
  const cause =
    last?.failedReason === undefined || last.failedReason === ''
      ? 'no batch job failed: its samples were handed back or lost each time'
      : `the last failed batch job (${String(last.id)}) says: ${last.failedReason.replace(/\s+/g, ' ').slice(0, 500)}`;
  const reason =
    `stopped: ${passes.passes} passes over the prompts in a row sent samples (${passes.enqueued} the last time) and none of them ` +
    `was committed, failed or finished; ${cause}. Fix the cause, then run again (\`tokenmill retry-failed\` gives failed prompts back)`;
  await redis.hset(keys.stats(ds.name), 'status', 'failed', 'failedReason', reason, 'failedAtMs', Date.now());
  log.error({ dataset: ds.name, ...passes }, `dataset ${ds.name} ${reason}`);
}

/**
 * Completes the dataset; false (and nothing changed) when `retry-failed` gave samples back
 * since the pass that read `retryGen` began ('' = complete regardless).
 */
export async function finishDataset(
  redis: ScriptedRedis,
  keys: RunKeys,
  ds: DatasetConfig,
  queue: Queue,
  reason: 'budget' | 'exhausted',
  retryGen: string,
  log: Logger,
): Promise<boolean> {
  if (reason === 'budget') {
    // Nothing more is sent for this dataset: its queued batches leave the queue, their
    // samples recorded as skipped by budget (a higher budget later enqueues them again).
    const jobs = await queue.getJobs(['waiting', 'prioritized', 'delayed']);
    for (const job of jobs) {
      const ids = (job.data as { samples?: { id: string }[] }).samples?.map((s) => s.id) ?? [];
      try {
        await job.remove();
        if (ids.length > 0) await redis.skipSamples(keys.done(ds.name), keys.skipped(ds.name), ...ids);
      } catch (e: unknown) {
        // Taken by a worker meanwhile: the worker skips its samples itself.
        log.debug({ err: e, jobId: job.id }, 'queued batch already taken');
      }
    }
  }
  if ((await redis.completeDataset(keys.stats(ds.name), keys.producer(ds.name), retryGen, reason)) === 0) {
    log.info('failed prompts were given back for a retry: another pass');
    return false;
  }
  log.info({ reason }, 'dataset completed');
  return true;
}
