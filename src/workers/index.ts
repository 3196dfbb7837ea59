export * from './eval/index.js';
export { InferenceWorker } from './inference/index.js';
export {
  conversationRow,
  createTokenizeContext,
  ensurePostprocessRound,
  type GenerationRecord,
  jsonLines,
  listGenerationFiles,
  parseGenerationRecord,
  planPostprocess,
  PostprocessFailedError,
  PostprocessWorker,
  recordToRow,
  type RoundInfo,
  type RoundOutcome,
  type TokenizeContext,
  turnFields,
  type TurnFields,
  waitForRound,
} from './postprocess/index.js';
export {
  cancelTrainJobs,
  describeHiddenStatesAtQueue,
  parseGpuList,
  probeGpus,
  queueTrainJob,
  roundTrainJobId,
  type TrainOutcomeSeen,
  trainPayloadOf,
  TrainWorker,
  waitForTrainJob,
} from './train/index.js';
