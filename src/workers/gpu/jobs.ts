/**
 * GPU jobs seen from outside their worker: waiting for one to finish, and cancelling a queue's
 * unfinished ones. Each kind (train, eval) passes its queue, status and cancel flag.
 */
import { Job, Queue, type JobType } from 'bullmq';
import type { Redis } from 'ioredis';
import { AppError, CancelledError, type RunKeys } from '../../shared/index.js';

/** How long a cancel flag lives: past any job that could still read it. */
const CANCEL_FLAG_TTL_S = 7 * 24 * 3600;

/** What waiting for a job of one kind needs. */
export interface WaitForJob<S, O> {
  queue: string;
  jobId: string;
  pollMs?: number;
  signal?: AbortSignal;
  /** The job's own status now, or null when the status is another job's. */
  status(): Promise<S | null>;
  /** What of a status is worth telling: `onStatus` is called when it changes. */
  seen(s: S): unknown;
  onStatus?: (s: S) => void;
  /** The outcome of the job that ended so (read after its state, so a completed one has its result). */
  ended(state: 'completed' | 'failed', job: Job | undefined): Promise<O>;
}

/** Waits for job `w.jobId` to finish, telling each change of its status; ends with the job, or with `w.signal`. */
export async function waitForJob<S, O>(redis: Redis, keys: RunKeys, w: WaitForJob<S, O>): Promise<O> {
  const queue = new Queue(w.queue, { connection: redis, prefix: keys.bullPrefix });
  let lastSeen = '';
  try {
    for (;;) {
      if (w.signal?.aborted === true) throw new CancelledError(`stopped waiting for ${w.queue} job ${w.jobId}`);
      const status = await w.status();
      if (status !== null && w.onStatus !== undefined) {
        const key = JSON.stringify(w.seen(status));
        if (key !== lastSeen) {
          lastSeen = key;
          w.onStatus(status);
        }
      }
      // The state first, then the job: a job read before it finished has no result yet.
      const state = await queue.getJobState(w.jobId);
      if (state === 'unknown')
        throw new AppError(`${w.queue} job ${w.jobId} is not in Redis (removed, or another Redis?)`);
      if (state === 'completed' || state === 'failed') return await w.ended(state, await Job.fromId(queue, w.jobId));
      await new Promise((r) => setTimeout(r, w.pollMs ?? 250));
    }
  } finally {
    await queue.close();
  }
}

/** What `tokenmill train --cancel` did to each unfinished job. */
export interface CancelledJob {
  jobId: string;
  state: string;
  action: 'removed' | 'signalled';
}

/** What cancelling the jobs of one kind needs. */
export interface CancelJobs {
  queue: string;
  /** The states of the jobs cancelled. */
  states: JobType[];
  /** The key of a job's cancel flag, which its worker polls. */
  cancelKey(jobId: string): string;
  /** Writes the status of a job removed before it started. */
  removed(jobId: string): Promise<void>;
}

/**
 * Cancels a queue's unfinished jobs: each is flagged; a queued or delayed one is removed too (its
 * status says so), a running one is stopped by its worker, which polls the flag.
 */
export async function cancelJobs(redis: Redis, keys: RunKeys, c: CancelJobs): Promise<CancelledJob[]> {
  const queue = new Queue(c.queue, { connection: redis, prefix: keys.bullPrefix });
  const out: CancelledJob[] = [];
  try {
    for (const job of await queue.getJobs(c.states)) {
      const jobId = job.id;
      if (jobId === undefined) continue;
      const state = await job.getState();
      await redis.set(c.cancelKey(jobId), '1', 'EX', CANCEL_FLAG_TTL_S);
      if (state === 'waiting' || state === 'delayed' || state === 'prioritized') {
        try {
          await job.remove();
          await c.removed(jobId);
          out.push({ jobId, state, action: 'removed' });
          continue;
        } catch {
          // taken by a worker meanwhile: the flag stops it
        }
      }
      out.push({ jobId, state, action: 'signalled' });
    }
    return out;
  } finally {
    await queue.close();
  }
}
