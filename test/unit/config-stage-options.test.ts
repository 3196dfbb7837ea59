// Each stage's options compiled once from the config: the schema's defaults reach every stage as
// they are, a configured value reaches every stage that reads it, and nothing else decides them.
import { describe, expect, it } from 'vitest';
import {
  AutoConcurrencySchema,
  budgetMarginOf,
  ConfigError,
  DEFAULT_BUDGET_MARGIN_SD,
  generationDatasets,
  inferenceOptions,
  loadConfig,
  postprocessOptions,
  producerOptions,
  type Config,
  type ConfigInput,
} from '../../src/shared/index.js';

function config(object: Partial<ConfigInput> = {}): Config {
  return loadConfig({
    baseDir: '/data',
    object: {
      datasets: [
        { name: 'a', prompts: 'a.jsonl', tokenBudget: 1_000, batchSize: 16 },
        { name: 'b', prompts: 'b.jsonl', tokenBudget: 2_000, budget: 'strict', budgetMarginSd: 0, turns: 'all' },
        { name: 'c', conversations: 'c.jsonl' },
      ],
      ...object,
    },
  });
}

describe('the stages options of a config', () => {
  it("the schema's defaults, the same in every stage", () => {
    const c = config();
    const inference = inferenceOptions(c);
    const postprocess = postprocessOptions(c);
    expect(inference).toMatchObject({
      endpoints: ['http://127.0.0.1:30000'],
      concurrency: 150,
      requestTimeoutMs: 900_000,
      apiKey: undefined,
      healthCheckIntervalMs: 2_000,
      batchSize: 16,
      lockDurationMs: 30_000,
      stalledIntervalMs: 30_000,
      leaseTtlMs: 30_000,
      crashProbationMs: 5_000,
      shutdownGraceMs: 30_000,
      strictBudgetDatasets: ['b'],
      turnByTurn: true,
    });
    expect(postprocess).toMatchObject({ keepTruncated: false, lockDurationMs: 30_000, stalledIntervalMs: 30_000 });
    expect(postprocess.tokenizeThreads).toBeUndefined();
    expect(budgetMarginOf(inference.budgetMarginSd, 'a')).toBe(DEFAULT_BUDGET_MARGIN_SD);
    expect(budgetMarginOf(inference.budgetMarginSd, 'b')).toBe(0);
    expect(budgetMarginOf(inference.budgetMarginSd, 'registered-elsewhere')).toBe(DEFAULT_BUDGET_MARGIN_SD);
    const producer = producerOptions(c);
    expect(producer.datasets.map((d) => [d.name, d.tokenBudget])).toEqual([
      ['a', 1_000],
      ['b', 2_000],
    ]);
    expect(producer).toMatchObject({ maxAttempts: 3, toolCallFormat: 'auto' });
    // Enough batches to fill every endpoint twice over: 2 x 150 / 16, rounded up, + 1.
    expect(producer.windowBatches).toBe(Math.ceil((2 * 150) / 16) + 1);
  });

  it('a configured lock duration reaches the post-processing worker as well as the inference worker', () => {
    const c = config({ workers: { lockDurationMs: 12_000, stalledIntervalMs: 4_000, windowBatches: 7 } });
    expect(inferenceOptions(c)).toMatchObject({ lockDurationMs: 12_000, stalledIntervalMs: 4_000 });
    expect(postprocessOptions(c)).toMatchObject({ lockDurationMs: 12_000, stalledIntervalMs: 4_000 });
    expect(producerOptions(c).windowBatches).toBe(7);
  });

  it('"auto" concurrency carries its bounds, defaults applied', () => {
    const c = config({ sglang: { concurrency: 'auto' } });
    expect(inferenceOptions(c).concurrency).toEqual({ auto: AutoConcurrencySchema.parse({}) });
  });

  it('a generated dataset without a budget is refused, never run without one', () => {
    const c = config();
    const broken = { ...c, datasets: c.datasets.map((d) => ({ ...d, tokenBudget: undefined })) };
    expect(() => generationDatasets(broken)).toThrow(ConfigError);
  });
});
