// Prompts: the prompt file format, its line reader and the id filter that skips what is done.
export { BloomFilter, fastPromptId } from './id-filter.js';
export { notUtf8Reason, type RawPromptLine, readRawLineChunks, readRawLines } from './line-reader.js';
export {
  contentSampleId,
  duplicateReject,
  DuplicateTracker,
  parseChatMessage,
  parseChatMessages,
  parsePromptLine,
  parseScannedLine,
  PromptFileIndex,
  type PromptLine,
  type PromptParseOptions,
  type PromptRecord,
  readPromptFile,
  type RejectedLine,
  type ScannedLine,
  scanPromptFile,
} from './source.js';
export {
  conversationTurns,
  type ConversationTurns,
  sourceTurnStep,
  type SourceTurnStep,
  turnHistory,
  turnSampleId,
} from './conversation.js';
export { functionCallToolCalls, recordTools, type RecordTools, toolCallIds } from './tool-schemas.js';
export {
  HELD_OUT_IDS_FILE,
  type HeldOutIds,
  type HeldOutIdsFile,
  isSampleOf,
  promptContentKey,
  readHeldOutIds,
} from './eval-content.js';
