// Post-processing: tokenize generations into rows and merge them into the training dataset.
export {
  ensurePostprocessRound,
  planPostprocess,
  PostprocessFailedError,
  type RoundInfo,
  type RoundOutcome,
  waitForRound,
} from './flow.js';
export { createTokenizeContext, type TokenizeContext } from './tokenize-context.js';
export { jsonLines } from './tokenize-lines.js';
export {
  conversationRow,
  earlierTurnSpans,
  turnFields,
  type TurnFields,
  type TurnFinishOf,
} from './tokenize-conversation-rows.js';
export { type GenerationRecord, listGenerationFiles, parseGenerationRecord, recordToRow } from './tokenize-records.js';
export { PostprocessWorker } from './worker.js';
