import { Queue, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { generateQueueName } from './catalog.js';
import { withScripts } from '../redis/index.js';
import type { RunKeys } from './run-keys.js';

/** What {@link retryFailedPrompts} did for one dataset. */
export interface RetryFailedOutcome {
  /** Failed prompts sent again: those of the failed jobs retried, plus those given back to the producer. */
  prompts: number;
  /** Failed batch jobs moved back to the queue (as Bull Board's Retry does). */
  jobs: number;
  /** Of `prompts`: failures without a failed job (recorded before failed jobs existed, their job removed, or their batch still running), given back to the producer's next pass. */
  givenBackToProducer: number;
}

/** Failed jobs fetched per page while retrying them. */
const PAGE = 100;

/**
 * Retries a dataset's failed prompts: the same as Bull Board's "retry all failed" on the
 * dataset's queue, plus the failures that no failed job carries.
 *
 * 1. retry-failed-4.lua, atomically, gives back to the producer every failure not carried by
 *    a failed job or claimed by a retried one (a running producer makes another pass; a later
 *    `run` / `produce` does otherwise).
 * 2. Every failed job of the queue goes back to the queue (`job.retry()`); the worker that
 *    takes one claims exactly its failed prompts (claim-failed-3.lua) and sends them again
 *    with fresh attempts. A job retried meanwhile by Bull Board is no longer failed and is
 *    skipped here, and a prompt is claimed by its own job only: none is sent twice.
 */
export async function retryFailedPrompts(redis: Redis, keys: RunKeys, dataset: string): Promise<RetryFailedOutcome> {
  const r = withScripts(redis);
  const givenBack = await r.retryFailed(
    keys.failed(dataset),
    keys.attempts(dataset),
    keys.stats(dataset),
    keys.producer(dataset),
    keys.queuePrefix(dataset),
  );
  const queue = new Queue(generateQueueName(dataset), { connection: redis, prefix: keys.bullPrefix });
  const outcome: RetryFailedOutcome = { prompts: givenBack, jobs: 0, givenBackToProducer: givenBack };
  try {
    const seen = new Set<string>();
    for (;;) {
      const page = (await queue.getJobs(['failed'], 0, PAGE - 1)).filter(
        (j: Job | undefined): j is Job => j !== undefined && !seen.has(String(j.id)),
      );
      if (page.length === 0) break;
      for (const job of page) {
        seen.add(String(job.id));
        try {
          await job.retry('failed');
        } catch {
          // Retried (by Bull Board) or removed meanwhile: not ours to count.
          continue;
        }
        outcome.jobs += 1;
        const data = job.data as { retryOfFailed?: unknown; samples?: unknown };
        if (data.retryOfFailed === true && Array.isArray(data.samples)) outcome.prompts += data.samples.length;
      }
    }
  } finally {
    await queue.close();
  }
  return outcome;
}
