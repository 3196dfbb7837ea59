// Config: the zod schema of tokenmill.yaml, loading with env overrides, issues with their config paths.
export {
  type Config,
  type ConfigInput,
  ConfigSchema,
  type ConfigSource,
  loadConfig,
  type LoadConfigInput,
  type ParsedConfig,
  runDir,
} from './config.js';
export {
  type DatasetConfig,
  DatasetConfigSchema,
  DEFAULT_BUDGET_MARGIN_SD,
  type SamplingParams,
  SamplingParamsSchema,
} from './dataset.js';
export { CONFIG_ENV_VARS, type ConfigEnv } from './env.js';
export { type DflashConfig, DflashConfigSchema } from './dflash.js';
export { type EvalConfig, EvalConfigSchema } from './eval.js';
export { formatConfigPath } from './issues.js';
export {
  configJsonSchema,
  configReferenceMarkdown,
  type ConfigReferenceRow,
  configReferenceRows,
  type JsonSchemaNode,
} from './reference.js';
export { type RedisConfig, RedisConfigSchema } from './redis.js';
export { NAME_PATTERN } from './schema-util.js';
export {
  type AutoConcurrency,
  autoConcurrencyOf,
  AutoConcurrencySchema,
  concurrencyCeiling,
  type ConcurrencySetting,
  SglangConfigSchema,
} from './sglang.js';
export {
  type BudgetMargins,
  budgetMarginOf,
  type GenerationDataset,
  generationDatasets,
  inferenceOptions,
  type InferenceStageOptions,
  postprocessOptions,
  type PostprocessStageOptions,
  producerOptions,
  type ProducerStageOptions,
  runBatchSize,
} from './stage-options.js';
export { PrepareConfigSchema, type PromptSource, PromptSourceSchema } from './source.js';
export {
  HIDDEN_STATE_DTYPES,
  type HiddenStatesConfig,
  HiddenStatesSchema,
  type TrainConfig,
  TrainConfigSchema,
  type TrainStep,
  TrainStepSchema,
} from './train.js';
