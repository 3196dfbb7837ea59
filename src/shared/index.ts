// The public surface of src/shared: producers, workers, the dashboard and the CLI import only from
// here. Each subsystem's own index.ts names what it offers; see docs/design.md for the map.
export {
  AppError,
  type AppErrorOptions,
  CancelledError,
  ConfigError,
  type ConfigIssue,
  EnvironmentError,
  errorMessage,
  isRetryable,
  PayloadError,
  TimeoutError,
  UnavailableError,
  UpstreamHttpError,
} from './errors.js';
export { createRootLogger, logger, type Logger, rootLogger } from './logger.js';
export * from './config/index.js';
export * from './tokenizer/index.js';
export * from './redis/index.js';
export * from './queues/index.js';
export * from './run-state/index.js';
export * from './prompts/index.js';
export * from './sglang/index.js';
export * from './hf-dataset/index.js';
export * from './util/index.js';
export * from './tools/index.js';
