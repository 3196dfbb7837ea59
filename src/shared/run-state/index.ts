// Run state: status and its formatting, phases, the stall watchdog, workers and endpoint health.
export {
  describeEndpointHealth,
  type EndpointConcurrency,
  endpointConcurrencyKey,
  endpointConcurrencyLeaseKey,
  type EndpointHealthReport,
  type EndpointHealthSummary,
  type EndpointHealthView,
  parseEndpointConcurrency,
  readEndpointConcurrency,
  readEndpointHealth,
  removeEndpointHealth,
  writeEndpointHealth,
} from './endpoint-health.js';
export {
  describeEvalSection,
  type EvalAttemptPoint,
  type EvalJobState,
  type EvalJobStatus,
  evalPhaseDetail,
  evalPointOf,
  type EvalReportView,
  type EvalSectionView,
  type EvalSourceView,
  type EvalStatus,
  formatEvalStatus,
  parseEvalReportView,
  readEvalStatus,
  type SimulatedView,
  simulatedNote,
  sourceOf,
} from './eval-status.js';
export { PREPARE_STATS_FIELDS } from './phases.js';
export {
  type DatasetWatch,
  readStalls,
  type StallCondition,
  type StallRecord,
  StallWatchdog,
  type StallWatchdogOptions,
} from './stall-watchdog.js';
export { formatEndpointHealth, formatEta, formatRunStatus, runStatusWarnings } from './status-format.js';
export {
  type ConversationCounts,
  type DatasetStatus,
  type EndpointRequests,
  JOB_STATES,
  type JobState,
  type PhaseStatus,
  type ProgressStatus,
  RATE_BUCKET_MS,
  RATE_BUCKETS_KEPT,
  readRunStatus,
  type RunStatus,
} from './status.js';
export {
  describeHiddenStates,
  formatBytes,
  formatTrainProgress,
  formatTrainStatus,
  type GpuMemorySeen,
  hiddenStatesFormula,
  readTrainStatus,
  trainPhaseDetail,
  type TrainState,
  type TrainStatus,
} from './train-status.js';
export {
  readWorkers,
  sumEndpointRequests,
  WorkerHeartbeat,
  type WorkerHeartbeatOptions,
  type WorkerInfo,
  type WorkerRole,
  workersKey,
} from './worker-registry.js';
