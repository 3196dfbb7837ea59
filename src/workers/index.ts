export * from './eval/index.js';
export { endCause, InferenceWorker } from './inference/index.js';
export {
  conversationRow,
  createTokenizeContext,
  earlierTurnSpans,
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
  type TurnFinishOf,
  waitForRound,
} from './postprocess/index.js';
export { parseGpuList, probeGpus } from './gpu/index.js';
export {
  cancelTrainJobs,
  describeHiddenStatesAtQueue,
  queueTrainJob,
  roundTrainJobId,
  type TrainOutcomeSeen,
  trainPayloadOf,
  TrainWorker,
  waitForTrainJob,
} from './train/index.js';
