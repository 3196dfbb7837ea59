import { UnrecoverableError, type Job } from 'bullmq';
import { AppError, encodeBatchPayload, type Logger } from '../../shared/index.js';
import { failedJobReason } from './failure-records.js';
import type { GenerateBatchOutcome } from './processor.js';

/** The error a batch job is failed with when its batch threw. */
export function batchJobError(e: unknown): Error {
  // A payload that does not parse is unrecoverable; anything else is retried by BullMQ.
  return e instanceof AppError && !e.retryable
    ? new UnrecoverableError(e.message)
    : e instanceof Error
      ? e
      : new Error(String(e));
}

/**
 * Ends a batch job failed, carrying only its failed prompts: Bull Board lists it under
 * failed with each prompt's line, id, status and reason, and its Retry (or `retry-failed`)
 * sends exactly those prompts again. The data is trimmed after the job is failed, so a
 * crash in between never sends a failed prompt again unasked (a retry of the untrimmed job
 * finds their records and fails it again, trimmed).
 */
export async function failBatchJob(job: Job, token: string, outcome: GenerateBatchOutcome, log: Logger): Promise<void> {
  const reason = failedJobReason(job.name, outcome.samples.length, outcome.failures);
  await job.moveToFailed(new UnrecoverableError(reason), token, false);
  const { dataset, batchId, sampling, maxAttempts, priorExpectedTokens, vocabSize } = outcome.payload;
  await job.updateData(
    encodeBatchPayload(
      { dataset, batchId, sampling, maxAttempts, priorExpectedTokens, vocabSize, retryOfFailed: true },
      outcome.failures.map((f) => f.sample),
    ),
  );
  log.warn(
    { queue: job.queueName, jobId: job.id, dataset, failed: outcome.failures.length },
    'batch ended with failed prompts: its job is failed, carrying them for a retry',
  );
}
