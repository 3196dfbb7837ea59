// Producers: prepare (source datasets to prompt files), the prompt producer and the results sink.
export {
  EVAL_HELD_OUT_FIELD,
  EVAL_MANIFEST_FILE,
  EVAL_PROMPTS_FILE,
  type EvalHoldout,
  type EvalManifest,
  evalHoldoutCount,
  evalPromptsPath,
  readEvalSplit,
  resolveEvalHoldout,
} from './eval-holdout.js';
export { Producer } from './producer.js';
export { ResultsSink, type SinkCrashPoint } from './results-sink.js';
export {
  type DatasetPrepareOutcome,
  formatPrepareCounts,
  type PrepareCounts,
  prepareSources,
  sourcedDatasets,
  startRunOver,
} from './prepare/index.js';
