import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { generateQueueName } from './catalog.js';
import type { RunKeys } from './run-keys.js';

/**
 * Pausing a dataset. There is one pause state per dataset: the `paused` field of its queue's
 * BullMQ meta hash, which `Queue.pause()` sets — so `tokenmill pause`, the dashboard and Bull
 * Board's own pause button all do the same thing. Workers stop handing out the queue's jobs,
 * and acquire-request.lua reads the field before every request: no new request of the
 * dataset starts on any worker from the moment it is set, including samples of batches a
 * worker already holds; requests in flight finish. Resuming lets the held samples go on
 * where they stopped (within the dispatcher's re-check interval, about 250 ms).
 */

async function withQueue<T>(redis: Redis, keys: RunKeys, dataset: string, fn: (q: Queue) => Promise<T>): Promise<T> {
  const queue = new Queue(generateQueueName(dataset), { connection: redis, prefix: keys.bullPrefix });
  try {
    return await fn(queue);
  } finally {
    await queue.close();
  }
}

/** Pauses a dataset: no new request of it starts on any worker (see the module's comment). */
export async function pauseDataset(redis: Redis, keys: RunKeys, dataset: string): Promise<void> {
  await withQueue(redis, keys, dataset, (q) => q.pause());
}

/** Resumes a paused dataset: its waiting samples and queued batches go on. */
export async function resumeDataset(redis: Redis, keys: RunKeys, dataset: string): Promise<void> {
  await withQueue(redis, keys, dataset, (q) => q.resume());
}

/** Whether a dataset is paused (by any of the routes: they share one state). */
export async function isDatasetPaused(redis: Redis, keys: RunKeys, dataset: string): Promise<boolean> {
  return (await redis.hexists(keys.queueMeta(dataset), 'paused')) === 1;
}
