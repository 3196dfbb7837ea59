/**
 * Eval jobs seen from Redis: the run's eval status (the latest eval job's state), the reports
 * recorded per attempt (what `status`, the pipeline page and /metrics read), waiting for an
 * eval job to finish (`tokenmill train`, the demo), and cancelling them (`tokenmill train --cancel`).
 */
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  EVAL_QUEUE,
  EvalJobResultSchema,
  EvalKeys,
  evalJobId,
  readEvalStatus,
  type EvalJobResult,
  type EvalJobStatus,
  type RunKeys,
} from '../../shared/index.js';
import { cancelJobs, waitForJob, statusWriter } from '../gpu/index.js';
import type { CancelledJob, StatusPlace, StatusWriter } from '../gpu/index.js';
import { parseReport, type EvalReport } from './report.js';

/** The run's eval status, and its entry in the phases hash. */
export function evalStatusPlace(keys: RunKeys): StatusPlace {
  return { key: new EvalKeys(keys).status(), phase: 'eval' };
}

/**
 * Writes fields of the run's eval status for job `jobId` (and the `eval` phase). With `reset`,
 * the status is started afresh for that job; otherwise a job that no longer owns it writes nothing.
 */
export const writeEvalStatus: StatusWriter = statusWriter(evalStatusPlace);

/** Records an attempt's report (its eval.json) in Redis, where the status and the dashboard read it. */
export async function recordEvalReport(redis: Redis, keys: RunKeys, report: EvalReport): Promise<void> {
  if (report.attempt === null) return;
  await redis.hset(new EvalKeys(keys).reports(), report.attempt, JSON.stringify(report));
}

/** The report recorded for `attempt`, if any. */
export async function recordedReport(redis: Redis, keys: RunKeys, attempt: string): Promise<EvalReport | null> {
  const text = await redis.hget(new EvalKeys(keys).reports(), attempt);
  if (text === null) return null;
  const r = parseReport(text, `the recorded report of attempt ${attempt}`);
  return typeof r === 'string' ? null : r;
}

/** The eval job that follows train job `trainJobId`, or null when none does (no `eval` section when it was queued). */
export async function evalJobAfter(redis: Redis, keys: RunKeys, trainJobId: string): Promise<string | null> {
  const queue = new Queue(EVAL_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  try {
    const id = evalJobId(trainJobId);
    return (await queue.getJobState(id)) === 'unknown' ? null : id;
  } finally {
    await queue.close();
  }
}

/** How an eval job ended, with the report of its attempt when there is one. */
export type EvalOutcomeSeen =
  | { status: 'completed'; result: EvalJobResult; report: EvalReport | null }
  | { status: 'failed'; reason: string; report: EvalReport | null };

/**
 * Waits for eval job `jobId` to finish, calling `onStatus` whenever its state changes. The eval
 * job's own waits are bounded (server health, requests, connection retries); this one ends with
 * the job, or with `signal`.
 */
export async function waitForEvalJob(
  redis: Redis,
  keys: RunKeys,
  jobId: string,
  opts: { pollMs?: number; signal?: AbortSignal; onStatus?: (s: EvalJobStatus) => void } = {},
): Promise<EvalOutcomeSeen> {
  const ownStatus = async (): Promise<EvalJobStatus | null> => {
    const job = (await readEvalStatus(redis, keys, null))?.job ?? null;
    return job !== null && job.jobId === jobId ? job : null;
  };
  const reportOf = async (attempt: string | null | undefined): Promise<EvalReport | null> =>
    attempt === null || attempt === undefined ? null : recordedReport(redis, keys, attempt);
  return waitForJob<EvalJobStatus, EvalOutcomeSeen>(redis, keys, {
    queue: EVAL_QUEUE,
    jobId,
    ...opts,
    status: ownStatus,
    seen: (s) => [s.state, s.detail, s.waiting, s.attempt],
    async ended(state, job) {
      if (state === 'completed') {
        const result = EvalJobResultSchema.parse(job?.returnvalue);
        return { status: 'completed', result, report: result.report === null ? null : await reportOf(result.attempt) };
      }
      return {
        status: 'failed',
        reason: job?.failedReason || 'failed',
        report: await reportOf((await ownStatus())?.attempt),
      };
    },
  });
}

/**
 * Cancels the run's unfinished eval jobs: a queued or delayed one is removed; a running one is
 * flagged, and its worker stops the measurement and the servers it started. One still waiting
 * for its training is left to fail with it.
 */
export async function cancelEvalJobs(redis: Redis, keys: RunKeys): Promise<CancelledJob[]> {
  return cancelJobs(redis, keys, {
    queue: EVAL_QUEUE,
    states: ['active', 'waiting', 'delayed', 'prioritized'],
    cancelKey: (jobId) => new EvalKeys(keys).cancel(jobId),
    removed: (jobId) =>
      writeEvalStatus(redis, keys, jobId, {
        state: 'cancelled',
        reason: 'cancelled by `tokenmill train --cancel` before it started',
      }),
  });
}
