// The public surface of src/shared: producers, workers, the dashboard and the CLI import
// only from here.
export * from './errors.js';
export * from './logger.js';
export * from './config.js';
export * from './redis/index.js';
export * from './sglang/index.js';
export * from './tokenizer.js';
export * from './queues.js';
export * from './run-keys.js';
export * from './redis-scripts.js';
export * from './prompt-source.js';
export * from './run-status.js';
export * from './process-lock.js';
export * from './hf-dataset/index.js';
export * from './endpoint-health.js';
export * from './stall-watchdog.js';
