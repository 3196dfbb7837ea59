// Evaluation of a trained drafter: acceptance length and real speed-up, measured on SGLang servers.
export {
  attemptName,
  chooseDrafter,
  type DrafterChoice,
  drafterIn,
  evalReportPath,
  finalOutputDir,
  previousReport,
} from './drafter.js';
export {
  cancelEvalJobs,
  evalJobAfter,
  type EvalOutcomeSeen,
  recordedReport,
  recordEvalReport,
  waitForEvalJob,
  writeEvalStatus,
} from './eval-jobs.js';
export { formatHistogram, formatReport } from './format.js';
export {
  type ComparedDrafter,
  type ComparisonRow,
  compareReports,
  drafterLabel,
  type EvalComparison,
  evaluatedAttempts,
  formatComparison,
} from './compare.js';
export {
  EvalCancelledError,
  type EvalJobDeps,
  type EvalOutcome,
  EvalVerdictError,
  processEvalJob,
} from './processor.js';
export {
  type EvalServerSettings,
  launchEvalServers,
  type LaunchedServers,
  type LaunchOptions,
  type LaunchOutcome,
  serverArgv,
  type ServerValues,
} from './launch.js';
export { measureDrafter, type MeasureOptions, type MeasureOutcome } from './measure.js';
export { type EvalPhase, evalRid, type PhaseOptions, runPhase, WARMUP_NEW_TOKENS } from './phase.js';
export { type EvalPrompt, type EvalPromptSet, heldOutPromptsPath, loadPromptSets, type PromptSets } from './prompts.js';
export {
  type BaselineEndpointInfo,
  buildReport,
  type DatasetEval,
  type DatasetTotals,
  deltaOf,
  type DrafterEndpointInfo,
  EVAL_REPORT_VERSION,
  type EvalDelta,
  type EvalFailure,
  type EvalReport,
  type EvalSection,
  type EvalSettings,
  type EvalSource,
  type EvalThresholds,
  incomparable,
  parseReport,
  type ReportContext,
  type SimulatedFigures,
  simulatedFigures,
  type SimulatorInfo,
} from './report.js';
export {
  type CheckedServers,
  checkServers,
  type EvalConfigured,
  evalConfigOf,
  evalSectionOf,
  type EvalRunConfig,
  type EvalRunOptions,
  runEval,
  settingsOf,
  withEndpoints,
  writeEvalReport,
} from './run.js';
export {
  commandLine,
  portFree,
  type ServerRole,
  type ServerSpec,
  startServer,
  type StartedServer,
} from './server-process.js';
export {
  DEFAULT_RETRY,
  EvalError,
  type RetryPolicy,
  SIMULATOR_ANNOUNCEMENT_KEY,
  simulatorOf,
  withConnectRetries,
} from './servers.js';
export { EvalWorker, type EvalWorkerOptions } from './worker.js';
export {
  addAnswer,
  addFailure,
  addHistogram,
  type AnswerStats,
  emptyTotals,
  type PhaseStats,
  phaseStats,
  type PhaseTotals,
  type SpecAnswerStats,
  specStatsOf,
  speedupOf,
  sumTotals,
} from './stats.js';
