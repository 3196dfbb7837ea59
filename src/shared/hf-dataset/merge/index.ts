// The merge of tokenized shards into the training dataset: lock, stage, validate, journal, rollback.
export {
  DatasetMergeError,
  MERGE_CRASH_POINTS,
  type MergeCrashPoint,
  type MergeOptions,
  type MergeDflashReport,
  type MergeReport,
  type MergeResult,
  type MergeSample,
  type MergeSource,
  ROLLBACK_CRASH_POINTS,
  type RollbackCrashPoint,
} from './common.js';
export { type EndOfTurnCount, endOfTurnFindings, MAX_WITHOUT_END_OF_TURN_FRACTION } from './end-of-turn.js';
export { DatasetIndex, indexFileOf, KeyFilter, sampleKey, type ShardIndexHeader } from './id-index.js';
export { repairTarget } from './journal.js';
export { mergeIntoTarget } from './merge.js';
export {
  type DatasetOffsets,
  DatasetOffsetsSchema,
  type GenerationFileOffset,
  GenerationFileOffsetSchema,
  type SourceOffsets,
  SourceOffsetsSchema,
} from './offsets-schema.js';
export {
  commitOffsetsWithoutMerge,
  type CommittedOffsets,
  offsetsOfState,
  readCommittedOffsets,
  stateKey,
} from './offsets.js';
export { listMerges, type RollbackOptions, type RollbackResult, rollbackTarget } from './rollback.js';
export { assertSampleKeyedTarget, SAMPLE_KEY_COLUMNS, sampleKeyProblem } from './sample-key.js';
export { planMergeColumns } from './stage.js';
export { DEFAULT_PYTHON, pythonVerifier, type PythonVerifier } from './verify-python.js';
