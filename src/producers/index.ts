// Producers: prepare (source datasets to prompt files), the prompt producer and the results sink.
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
