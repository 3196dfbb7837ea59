import type { DefaultJobOptions, FlowJob } from 'bullmq';
import { z } from 'zod';
import { EvalConfigSchema } from '../config/index.js';
import type { RunKeys } from './run-keys.js';

/**
 * The eval queue's catalog: the eval step that follows every training when the config has an
 * `eval` section. Each train job (a chain's last step) gets an `eval` parent in the flow,
 * `eval ◀ train ◀ merge ◀ tokenize…`, so the evaluation starts once the attempt completed and
 * fails with it when the training fails. Train workers serve the queue.
 */

/** Queue of eval jobs, served by train workers (`worker --role train`). */
export const EVAL_QUEUE = 'eval';

/** What a train job carries for the eval step after it (taken from the config when it was queued). */
export const EvalStepPayloadSchema = z.object({
  run: z.string().min(1),
  /** `<output.dir>/<run>`: the attempt's report goes to `<runDir>/train/<attempt>/eval.json`. */
  runDir: z.string().min(1),
  /**
   * The config's `eval` section as it was when the training was queued (Bull Board shows it),
   * checked again by the config's own schema when the job arrives.
   */
  eval: EvalConfigSchema,
  /** Folder the servers' commands run in (the config file's). */
  cwd: z.string().min(1),
  /** How often a job waiting for GPU memory checks again (ms): `train.preflightPollMs`. */
  preflightPollMs: z.number().int().positive(),
});
export type EvalStepPayload = z.infer<typeof EvalStepPayloadSchema>;

/** Payload of an eval job: the step, and the train job whose attempt it evaluates (its child). */
export const EvalJobPayloadSchema = EvalStepPayloadSchema.extend({
  trainJob: z.string().min(1),
});
export type EvalJobPayload = z.infer<typeof EvalJobPayloadSchema>;

/** What an eval job returns (a verdict below the thresholds fails the job instead, its report written). */
export const EvalJobResultSchema = z.object({
  /** `completed`: measured; `skipped`: the training made no new attempt. */
  status: z.enum(['completed', 'skipped']),
  attempt: z.string().nullable(),
  drafter: z.string().nullable(),
  /** The eval.json written. */
  report: z.string().nullable(),
  acceptLength: z.number().nullable(),
  speedup: z.number().nullable(),
  warnings: z.array(z.string()),
  durationMs: z.number().nonnegative(),
  reason: z.string().optional(),
});
export type EvalJobResult = z.infer<typeof EvalJobResultSchema>;

/** Eval jobs are not retried: a verdict is a verdict; a worker that stops hands its job back. */
export const evalJobOptions: DefaultJobOptions = {
  attempts: 1,
  removeOnComplete: { count: 200 },
  removeOnFail: { count: 200 },
};

/** The eval job id of train job `trainJobId` (a chain's last step): a rerun of the flow joins it. */
export function evalJobId(trainJobId: string): string {
  return `${trainJobId}-eval`;
}

/**
 * `train` (a train job, or a chain's last step, with its children) under an eval parent. The
 * training fails its eval parent when it fails.
 */
export function withEvalParent(train: FlowJob, step: EvalStepPayload): FlowJob {
  const trainJob = train.opts?.jobId;
  if (trainJob === undefined) throw new Error('eval: the train job of a flow has no job id');
  const data: EvalJobPayload = EvalJobPayloadSchema.parse({ ...step, trainJob });
  return {
    name: 'eval',
    queueName: EVAL_QUEUE,
    data,
    opts: { ...evalJobOptions, jobId: evalJobId(trainJob) },
    children: [{ ...train, opts: { ...train.opts, failParentOnFailure: true } }],
  };
}

/** The run's eval keys (next to those of {@link RunKeys}). */
export class EvalKeys {
  constructor(private readonly keys: RunKeys) {}

  /** Hash: the latest eval job's state (jobId, state, attempt, detail, reason, servers, updatedAt). */
  status(): string {
    return `${this.keys.base}:eval`;
  }

  /** Hash: attempt → JSON of its eval report (the eval.json the eval step wrote). */
  reports(): string {
    return `${this.keys.base}:eval:reports`;
  }

  /** String (with a TTL): set by `tokenmill train --cancel` for an eval job to stop. */
  cancel(jobId: string): string {
    return `${this.keys.base}:eval:cancel:${jobId}`;
  }
}
