// What every GPU job shares (train, eval): the GPU probe and preflight, commands in their own
// process groups and the groups a dead worker left, the job status, the worker shell, the job's frame.
export { type GpuInfo, type GpuProbe, NVIDIA_SMI_ARGS, parseGpuList, parseNvidiaSmi, probeGpus } from './gpus.js';
export {
  type GpuJobDeps,
  type GpuJobOutcome,
  type GpuJobPhases,
  type Next,
  runGpuJob,
  type Stopping,
  type StopSignal,
  watch,
  type Watched,
} from './job.js';
export { type JobPhase, type StatusPlace, statusWriter, type StatusWriter, writeJobStatus } from './job-status.js';
export { cancelJobs, type CancelJobs, type CancelledJob, waitForJob, type WaitForJob } from './jobs.js';
export {
  formatIdentity,
  killLeftGroup,
  type LeftGroupOutcome,
  parseIdentity,
  processIdentity,
  type ProcessIdentity,
  recordedIdentity,
} from './left-groups.js';
export {
  type AssignedGroup,
  type GpuGroupNeed,
  type GpuNeed,
  type GroupsVerdict,
  preflight,
  preflightGroups,
  type PreflightVerdict,
} from './preflight.js';
export {
  type CommandExit,
  groupAlive,
  runCommand,
  type RunCommandOptions,
  type RunningCommand,
  signalGroup,
} from './run-command.js';
export {
  GpuWorker,
  type GpuJobKind,
  type GpuWorkerOptions,
  isCancel,
  JOB_LOG_MAX_LINES,
  JobCancelledError,
  type TakenJob,
} from './worker.js';
