/**
 * Each stage's options, compiled once from a loaded config.
 *
 * Every default is defined once, in the schema (`ConfigSchema` and its sections); a loaded
 * {@link Config} carries them applied. The functions here only pick and derive what a stage
 * reads (`inferenceOptions`, `postprocessOptions`, `producerOptions`), so the stages take
 * resolved values and apply no default of their own, and the Lua scripts receive the same values.
 */
import { ConfigError } from '../errors.js';
import { tokenizerLoadOptions, type TokenizerLoadOptions } from '../tokenizer/index.js';
import type { Config } from './config.js';
import { DEFAULT_BUDGET_MARGIN_SD, type DatasetConfig } from './dataset.js';
import { type AutoConcurrency, autoConcurrencyOf, concurrencyCeiling } from './sglang.js';

/**
 * A dataset that is generated (`prompts`, or a `source` prepared into them), with its token
 * budget: the schema requires one for every such dataset. A dataset of `conversations` has no
 * budget (its `tokenBudget` is absent, and so is its stats field in Redis).
 */
export type GenerationDataset = DatasetConfig & { prompts: string; tokenBudget: number };

/** The datasets of a config that are generated, in config order. */
export function generationDatasets(config: Pick<Config, 'datasets'>): GenerationDataset[] {
  return config.datasets.flatMap((d, i) => {
    if (d.prompts === undefined) return [];
    if (d.tokenBudget === undefined)
      // The schema refuses this; a config built around it is refused here rather than run without a budget.
      throw new ConfigError([{ path: `datasets[${i}].tokenBudget`, message: 'missing: required with "prompts"' }]);
    return [{ ...d, prompts: d.prompts, tokenBudget: d.tokenBudget }];
  });
}

/** Prompts per batch job of the run: the smallest `batchSize` of its generated datasets (at least 1). */
export function runBatchSize(datasets: readonly Pick<DatasetConfig, 'batchSize'>[]): number {
  return Math.max(1, Math.min(...datasets.map((d) => d.batchSize)));
}

/**
 * `datasets[].budgetMarginSd` per dataset (acquire-request.lua ARGV[10]). `unlisted` is for a
 * dataset that a producer with another config registered and this config does not name: the
 * schema's default.
 */
export interface BudgetMargins {
  byDataset: Readonly<Record<string, number>>;
  unlisted: number;
}

/** The margin of one dataset. */
export function budgetMarginOf(margins: BudgetMargins, dataset: string): number {
  return margins.byDataset[dataset] ?? margins.unlisted;
}

/** What an inference worker reads of the config, resolved. */
export interface InferenceStageOptions {
  /** `sglang.endpoints`. */
  endpoints: readonly string[];
  /** `sglang.concurrency`: a fixed number, or `"auto"` within `sglang.autoConcurrency`. */
  concurrency: number | { auto: AutoConcurrency };
  /** `sglang.requestTimeoutMs`. */
  requestTimeoutMs: number;
  /** `sglang.apiKey` (or `SGLANG_API_KEY`); undefined: none. Never logged. */
  apiKey: string | undefined;
  /** `sglang.healthCheckIntervalMs`. */
  healthCheckIntervalMs: number;
  /** Prompts per batch job: this process keeps about one batch ready beyond its slots. */
  batchSize: number;
  /** `workers.lockDurationMs`: a killed worker's batches return to the queue after about this long. */
  lockDurationMs: number;
  /** `workers.stalledIntervalMs`. */
  stalledIntervalMs: number;
  /** `workers.leaseTtlMs`. */
  leaseTtlMs: number;
  /** `workers.crashProbationMs`. */
  crashProbationMs: number;
  /** `workers.shutdownGraceMs`: on stop, requests in flight may finish for this long. */
  shutdownGraceMs: number;
  /** Datasets in `budget: strict`: streamed, and aborted at the budget. */
  strictBudgetDatasets: readonly string[];
  /** `datasets[].budgetMarginSd`. */
  budgetMarginSd: BudgetMargins;
  /** Whether a dataset is regenerated turn by turn (`turns: all`): the worker then needs the run's tokenizer. */
  turnByTurn: boolean;
}

/** The inference stage's options of a loaded config. */
export function inferenceOptions(config: Config): InferenceStageOptions {
  const datasets = generationDatasets(config);
  const { sglang, workers } = config;
  return {
    endpoints: sglang.endpoints,
    concurrency: sglang.concurrency === 'auto' ? { auto: autoConcurrencyOf(sglang) } : sglang.concurrency,
    requestTimeoutMs: sglang.requestTimeoutMs,
    apiKey: sglang.apiKey,
    healthCheckIntervalMs: sglang.healthCheckIntervalMs,
    batchSize: runBatchSize(datasets),
    lockDurationMs: workers.lockDurationMs,
    stalledIntervalMs: workers.stalledIntervalMs,
    leaseTtlMs: workers.leaseTtlMs,
    crashProbationMs: workers.crashProbationMs,
    shutdownGraceMs: workers.shutdownGraceMs,
    strictBudgetDatasets: datasets.filter((d) => d.budget === 'strict').map((d) => d.name),
    budgetMarginSd: {
      byDataset: Object.fromEntries(datasets.map((d) => [d.name, d.budgetMarginSd])),
      unlisted: DEFAULT_BUDGET_MARGIN_SD,
    },
    turnByTurn: datasets.some((d) => d.turns === 'all'),
  };
}

/** What a post-processing worker (tokenize, merge) reads of the config, resolved. */
export interface PostprocessStageOptions {
  /** `tokenizer.path`. */
  tokenizerPath: string;
  /** How to load it (`tokenizer.kind`, `pattern`, `preset`; the servers for `server`). */
  tokenizer: TokenizerLoadOptions;
  /** `postprocess.keepTruncated`. */
  keepTruncated: boolean;
  /** `postprocess.tokenizeThreads`; undefined: one per CPU core of the machine that tokenizes. */
  tokenizeThreads: number | undefined;
  /** `workers.lockDurationMs`: a killed worker's job is retried after about this long. */
  lockDurationMs: number;
  /** `workers.stalledIntervalMs`. */
  stalledIntervalMs: number;
}

/** The post-processing stage's options of a loaded config. */
export function postprocessOptions(config: Config): PostprocessStageOptions {
  return {
    tokenizerPath: config.tokenizer.path,
    tokenizer: tokenizerLoadOptions(config),
    keepTruncated: config.postprocess.keepTruncated,
    tokenizeThreads: config.postprocess.tokenizeThreads,
    lockDurationMs: config.workers.lockDurationMs,
    stalledIntervalMs: config.workers.stalledIntervalMs,
  };
}

/** What the producer reads of the config, resolved. */
export interface ProducerStageOptions {
  /** The generated datasets, each with its budget. */
  datasets: readonly GenerationDataset[];
  /** `sglang.maxAttempts`. */
  maxAttempts: number;
  /** `workers.windowBatches`, or enough batches to fill every endpoint twice over, per dataset. */
  windowBatches: number;
  /** `tokenizer.toolCallFormat` (`auto`: read from the chat template). */
  toolCallFormat: Config['tokenizer']['toolCallFormat'];
}

/** The producer's options of a loaded config. */
export function producerOptions(config: Config): ProducerStageOptions {
  const datasets = generationDatasets(config);
  const batchSize = runBatchSize(datasets);
  return {
    datasets,
    maxAttempts: config.sglang.maxAttempts,
    windowBatches:
      config.workers.windowBatches ??
      Math.ceil((2 * concurrencyCeiling(config.sglang) * config.sglang.endpoints.length) / batchSize) + 1,
    toolCallFormat: config.tokenizer.toolCallFormat,
  };
}
