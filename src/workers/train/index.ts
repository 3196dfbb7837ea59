// The train stage: GPU workers that run the configured trainer on the merged dataset.
export { listAttempts, listCheckpoints, trainDir } from './attempts.js';
export { type GpuInfo, type GpuProbe, parseGpuList, probeGpus } from './gpus.js';
export { preflight, type PreflightVerdict } from './preflight.js';
export {
  formatIdentity,
  killLeftGroup,
  type LeftGroupOutcome,
  parseIdentity,
  processIdentity,
  type ProcessIdentity,
  recordedIdentity,
} from './left-groups.js';
export { groupAlive, runCommand, type RunningCommand, signalGroup } from './run-command.js';
export { describeHiddenStatesAtQueue } from './hidden-states.js';
export {
  cancelTrainJobs,
  type JobPhase,
  queueTrainJob,
  roundTrainJobId,
  type TrainOutcomeSeen,
  trainPayloadOf,
  waitForTrainJob,
  withTrainParent,
  writeJobStatus,
} from './train-jobs.js';
export { TrainWorker } from './worker.js';
