import type { DefaultJobOptions } from 'bullmq';
import { z } from 'zod';
import { EvalStepPayloadSchema } from './eval-queue.js';
import type { RunKeys } from './run-keys.js';

/**
 * The train queue's catalog: payload and result schemas, job options and the run's train keys.
 * The queue name is `TRAIN_QUEUE` in catalog.ts.
 */

/** `from-scratch`: a new training run; `resume`: continue from a checkpoint. */
export const TrainModeSchema = z.enum(['from-scratch', 'resume']);
export type TrainMode = z.infer<typeof TrainModeSchema>;

/** A step's `hiddenStates` as its job sees it: the model path is absolute. */
export const HiddenStatesPayloadSchema = z.object({
  model: z.string().min(1),
  layers: z.number().int().positive(),
  dtype: z.enum(['bfloat16', 'float16', 'float32']),
  overheadBytesPerToken: z.number().int().nonnegative(),
  margin: z.number().nonnegative(),
});
export type HiddenStatesPayload = z.infer<typeof HiddenStatesPayloadSchema>;

/** A split step's two GPU groups, each with its count and free memory per GPU. */
const GpuGroupNeedSchema = z.object({
  gpus: z.number().int().positive(),
  minFreeGpuMemMiB: z.number().int().nonnegative(),
});
export const GpuGroupsPayloadSchema = z.object({ target: GpuGroupNeedSchema, drafter: GpuGroupNeedSchema });
export type GpuGroupsPayload = z.infer<typeof GpuGroupsPayloadSchema>;

/** One step of a chain as its job sees it. */
export const TrainStepPayloadSchema = z.object({
  name: z.string().min(1),
  command: z.array(z.string()).min(1),
  gpus: z.number().int().nonnegative(),
  minFreeGpuMemMiB: z.number().int().nonnegative(),
  minFreeDiskGiB: z.number().nonnegative(),
  hiddenStates: HiddenStatesPayloadSchema.optional(),
  /** A split step: its target and drafter groups (`gpus` is their total). */
  gpuGroups: GpuGroupsPayloadSchema.optional(),
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
  /** The job id of the chain's last step: names the chain (a chain's jobs only). */
  chain: z.string().min(1).optional(),
  /** What this step writes, sized before it starts (a chain's jobs only). */
  hiddenStates: HiddenStatesPayloadSchema.optional(),
  /** A split step: its target and drafter groups, each preflighted on its own (`gpus` is their total). */
  gpuGroups: GpuGroupsPayloadSchema.optional(),
  /**
   * With an `eval` section: the eval step after the training, queued as the train job's parent
   * (a chain's: its last step's). Only in the payload the flow is made from, not in the jobs'.
   */
  evaluate: EvalStepPayloadSchema.optional(),
});
export type TrainPayload = z.infer<typeof TrainPayloadSchema>;

/**
 * A chain step's hidden-state estimate as the train worker last made it (before the step
 * starts): bytes = tokens × (hiddenSize × layers × bytesPerElement + overheadBytesPerToken),
 * checked against the file system of the step's output folder.
 */
export const TrainHiddenStatesSchema = z.object({
  /** The chain (see {@link TrainPayloadSchema}'s `chain`), the step's job and its place in the chain. */
  chain: z.string(),
  jobId: z.string(),
  step: z.string(),
  stepIndex: z.number().int().nonnegative(),
  steps: z.number().int().positive(),
  bytes: z.number().nonnegative(),
  /** Tokens of the training dataset, and where they were read (its merge index, or its shards). */
  tokens: z.number().int().nonnegative(),
  tokensFrom: z.enum(['merge index', 'shard scan']),
  dataset: z.string(),
  hiddenSize: z.number().int().positive(),
  layers: z.number().int().positive(),
  dtype: z.string(),
  bytesPerElement: z.number().int().positive(),
  overheadBytesPerToken: z.number().int().nonnegative(),
  margin: z.number().nonnegative(),
  /** Free bytes the step waits for: bytes × (1 + margin) + the step's minFreeDiskGiB. */
  neededBytes: z.number().nonnegative(),
  /** The model's config.json the hidden size was read from. */
  configFile: z.string(),
  /** The file system of the step's output folder; `reusableBytes`: what the folder holds already. */
  disk: z
    .object({
      path: z.string(),
      totalBytes: z.number().nonnegative(),
      freeBytes: z.number().nonnegative(),
      reusableBytes: z.number().nonnegative(),
    })
    .nullable(),
  /** `fits`: the step started; `waiting`: too little free space; `refused`: the file system is too small. */
  verdict: z.enum(['fits', 'waiting', 'refused']),
  at: z.string(),
});
export type TrainHiddenStates = z.infer<typeof TrainHiddenStatesSchema>;

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

  /** Hash: step name → JSON {@link TrainHiddenStates} of the latest chain's steps that declare `hiddenStates`. */
  hiddenStates(): string {
    return `${this.keys.base}:train:hidden-states`;
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
