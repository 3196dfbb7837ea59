import type { TrainProgress, TrainHiddenStates, TrainResult, TrainState } from '../../shared/index.js';
import type { GpuJobDeps, GpuJobOutcome } from '../gpu/index.js';
import type { EnvFingerprint } from './fingerprint.js';

/** This job's earlier record, when a worker already ran it (it died, or was stopped). */
export interface PreviousRun {
  state: TrainState;
  worker: string | null;
  host: string | null;
  pid: number | null;
  /** Its command's leader as recorded with the pid (see gpu/left-groups.ts); null when none was. */
  pidIdentity: string | null;
  attempt: string | null;
}

/** What the train processor needs from its worker besides what every GPU job does. */
export interface TrainDeps extends GpuJobDeps {
  previousRun(): Promise<PreviousRun | null>;
  lastGoodEnv(): Promise<EnvFingerprint | null>;
  saveGoodEnv(fp: EnvFingerprint): Promise<void>;
  reportProgress(p: TrainProgress): Promise<void>;
  /** Records a chain step's hidden-state estimate (shown by `status`, the page and /metrics). */
  recordHiddenStates(entry: TrainHiddenStates): Promise<void>;
}

/** The processor's outcome: finished (result), not yet startable (wait and try again), or handed back. */
export type TrainOutcome = GpuJobOutcome<TrainResult>;
