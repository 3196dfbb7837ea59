import type { Logger, TrainProgress, TrainHiddenStates, TrainResult, TrainState } from '../../shared/index.js';
import type { EnvFingerprint } from './fingerprint.js';
import type { GpuProbe } from './gpus.js';

/** This job's earlier record, when a worker already ran it (it died, or was stopped). */
export interface PreviousRun {
  state: TrainState;
  worker: string | null;
  host: string | null;
  pid: number | null;
  /** Its command's leader as recorded with the pid (see left-groups.ts); null when none was. */
  pidIdentity: string | null;
  attempt: string | null;
}

/** What the train processor needs from its worker: Redis, BullMQ and the machine, as functions. */
export interface TrainDeps {
  jobId: string;
  workerId: string;
  /** GPU indices this worker may use (`--gpus`); all when omitted. */
  allowedGpus?: readonly number[];
  probeGpus(): Promise<GpuProbe>;
  /** Writes fields of the run's train status (and the `train` phase when `phase` is given). */
  setStatus(
    fields: Record<string, string | number>,
    phase?: 'pending' | 'in_progress' | 'completed' | 'failed',
  ): Promise<void>;
  previousRun(): Promise<PreviousRun | null>;
  lastGoodEnv(): Promise<EnvFingerprint | null>;
  saveGoodEnv(fp: EnvFingerprint): Promise<void>;
  isCancelled(): Promise<boolean>;
  /** Appends a line to the job's log in Bull Board (the caller bounds it). */
  jobLog(line: string): void;
  reportProgress(p: TrainProgress): Promise<void>;
  /** Records a chain step's hidden-state estimate (shown by `status`, the page and /metrics). */
  recordHiddenStates(entry: TrainHiddenStates): Promise<void>;
  /** The return value of the job's child: a round's merge, or a chain's previous step. */
  childResult(): Promise<unknown>;
  /** Aborted when the worker stops (SIGTERM): the command is stopped too. */
  shutdown: AbortSignal;
  logger: Logger;
  /** How often the cancel flag is read while the command runs (ms). Default 500. */
  cancelPollMs?: number;
}

/** The processor's outcome: finished (result), or not yet startable (wait and try again). */
export type TrainOutcome =
  { kind: 'done'; result: TrainResult } | { kind: 'wait'; reason: string } | { kind: 'requeue'; reason: string };
