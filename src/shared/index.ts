// The public surface of src/shared: producers, workers, the dashboard and the CLI import
// only from here.
export * from './errors.js';
export * from './logger.js';
export * from './config.js';
export * from './redis/index.js';
export * from './sglang/index.js';
export * from './tokenizer.js';
export { checkTokenizerKindFits, loadConfiguredTokenizer, tokenizerLoadOptions, type TokenizerKind, type TokenizerLoadOptions, type TokenizerPreset, type TokenizerConfigSource } from './tokenizer-load.js';
export { ServerTokensNeeded, type EncoderKind, type TokenEncoder } from './tokenizer-encoder.js';
export { ServerTokenizeClient, type ServerTokenizeOptions } from './tokenizer-server-client.js';
export { ServerEncoder } from './tokenizer-server.js';
export { KIMI_K2_PATTERN, O200K_PATTERN, convertSplitPattern } from './tokenizer-pattern.js';
export { parseRankFile, readRankFile, type RankTable } from './tokenizer-bpe.js';
export * from './queues.js';
export * from './run-keys.js';
export * from './redis-scripts.js';
export * from './prompt-source.js';
export * from './run-status.js';
export * from './process-lock.js';
export * from './hf-dataset/index.js';
export * from './endpoint-health.js';
export * from './stall-watchdog.js';
export * from './request-stats.js';
export * from './worker-registry.js';
export * from './dataset-pause.js';
export * from './failed-prompts.js';
export * from './train-queue.js';
export * from './train-status.js';
