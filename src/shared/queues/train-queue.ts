import type { DefaultJobOptions } from 'bullmq';
import { z } from 'zod';
import type { RunKeys } from './run-keys.js';

/**
 * The train queue's catalog: payload and result schemas, job options and the run's train keys.
 * The queue name is `TRAIN_QUEUE` in catalog.ts.
 */

/** `from-scratch`: a new training run; `resume`: continue from a checkpoint. */
export const TrainModeSchema = z.enum(['from-scratch', 'resume']);
export type TrainMode = z.infer<typeof TrainModeSchema>;

/** One step of a chain as its job sees it. */
export const TrainStepPayloadSchema = z.object({
  name: z.string().min(1),
  command: z.array(z.string()).min(1),
  gpus: z.number().int().nonnegative(),
  minFreeGpuMemMiB: z.number().int().nonnegative(),
  minFreeDiskGiB: z.number().nonnegative(),
});
export type TrainStepPayload = z.infer<typeof TrainStepPayloadSchema>;

/**
 * Payload of a train job: everything the worker needs, taken from the config when the job was
 * queued (Bull Board shows it), so a worker runs exactly what was asked.
 */
export const TrainPayloadSchema = z.object({
  run: z.string().min(1),
  /** `<output.dir>/<run>`: attempts go to `<runDir>/train/<attempt>/`. */
  runDir: z.string().min(1),
  /** The training dataset folder (`postprocess.target`), the `{dataset}` placeholder. */
  dataset: z.string().min(1),
  mode: TrainModeSchema,
  /** Resume from this checkpoint instead of the newest one. */
  checkpoint: z.string().min(1).optional(),
  command: z.array(z.string()).min(1),
  resumeArgs: z.array(z.string()),
  /** Folder the command runs in (the config file's). */
  cwd: z.string().min(1),
  gpus: z.number().int().nonnegative(),
  minFreeGpuMemMiB: z.number().int().nonnegative(),
  /** Interpreter whose environment is fingerprinted; omitted = derived from the command. */
  python: z.string().min(1).optional(),
  allowEnvChange: z.boolean(),
  autoResume: z.boolean(),
  progressRegex: z.string().min(1).optional(),
  cancelGraceMs: z.number().int().positive(),
  preflightPollMs: z.number().int().positive(),
  /** Who queued it: a post-process round's flow (its id), or `tokenmill train`. */
  origin: z.string().min(1),
  /** Free disk space (GiB) the run folder needs before it starts. */
  minFreeDiskGiB: z.number().nonnegative().default(0),
  /** `train.steps`: the whole chain; each step's job has its own command, GPUs and limits above. */
  steps: z.array(TrainStepPayloadSchema).min(1).optional(),
  /** This job's step in `steps` (a chain's jobs only). */
  stepIndex: z.number().int().nonnegative().optional(),
});
export type TrainPayload = z.infer<typeof TrainPayloadSchema>;

/** Progress parsed from the command's output. */
export const TrainProgressSchema = z.object({
  step: z.number().nullable(),
  total: z.number().nullable(),
  loss: z.number().nullable(),
  stepsPerSec: z.number().nullable(),
  etaSeconds: z.number().nullable(),
});
export type TrainProgress = z.infer<typeof TrainProgressSchema>;

/** What a train job returns. */
export const TrainResultSchema = z.object({
  /** `completed`: the command exited 0; `skipped`: its round merged nothing new. */
  status: z.enum(['completed', 'skipped']),
  attempt: z.string().nullable(),
  attemptDir: z.string().nullable(),
  mode: TrainModeSchema,
  checkpoint: z.string().nullable(),
  /** The newest checkpoint the attempt left. */
  lastCheckpoint: z.string().nullable(),
  progress: TrainProgressSchema.nullable(),
  /** First and last loss seen. */
  firstLoss: z.number().nullable(),
  lastLoss: z.number().nullable(),
  gpus: z.array(z.number().int()),
  durationMs: z.number().nonnegative(),
  reason: z.string().optional(),
  /** A chain step's name. */
  step: z.string().optional(),
});
export type TrainResult = z.infer<typeof TrainResultSchema>;

/**
 * Train jobs are never retried by BullMQ: a failed training is looked at by a person, who
 * chooses `--resume` or `--from-scratch`. A worker that dies is handled by the worker that
 * picks the stalled job up (`train.autoResume`), hence the high stalled count.
 */
export const trainJobOptions: DefaultJobOptions = {
  attempts: 1,
  removeOnComplete: { count: 200 },
  removeOnFail: { count: 200 },
};

/** Stalled-job recoveries a train job may go through (each one a worker death, see above). */
export const TRAIN_MAX_STALLED_COUNT = 1000;

/** The run's train keys (next to those of {@link RunKeys}). */
export class TrainKeys {
  constructor(private readonly keys: RunKeys) {}

  /** Hash: the current (latest) train job's state and progress; see `train-status.ts`. */
  status(): string {
    return `${this.keys.base}:train`;
  }

  /** String: JSON fingerprint of the last successful train run's environment. */
  lastGoodEnv(): string {
    return `${this.keys.base}:train:env-last-good`;
  }

  /** String (with a TTL): set by `tokenmill train --cancel` for a job to stop. */
  cancel(jobId: string): string {
    return `${this.keys.base}:train:cancel:${jobId}`;
  }

  /** Counter of train jobs queued by `tokenmill train`. */
  counter(): string {
    return `${this.keys.base}:train:n`;
  }
}
