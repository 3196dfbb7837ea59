// The budget margin as the dispatcher sends it: addAcquires passes each dataset's
// `budgetMarginSd` (default DEFAULT_BUDGET_MARGIN_SD, in both budget modes) to
// acquire-request.lua, against a real Redis.
import { describe, expect, it } from 'vitest';
import {
  budgetMarginOf,
  type BudgetMargins,
  decodeAcquire,
  DEFAULT_BUDGET_MARGIN_SD,
  inferenceOptions,
  loadConfig,
} from '../../src/shared/index.js';
import { histogramFromHash, reservedTokens } from '../../src/workers/inference/budget-expectation.js';
import {
  TIMED_PROGRESS_FACTOR,
  addAcquires,
  newAttempts,
  readAcquires,
  type AcquireSettings,
  type RedisPipeline,
} from '../../src/workers/inference/dispatch-acquire.js';
import type { Task } from '../../src/workers/inference/dispatch-queue.js';
import type { Endpoint } from '../../src/workers/inference/endpoint-pool.js';
import { useHarness } from '../helpers/fixture.js';

const { scripts: r, keys } = useHarness({ scripts: true, keys: 'budget-margin' });
const endpointUrl = 'http://margin:1';
const MAX_NEW = 10_240;
const PRIOR = 5_120;
const MIN_COMMITS = 32;
const IN_FLIGHT = 40;

function task(ds: string, id: string): Task {
  return {
    req: {
      dataset: ds,
      sample: { id, line: 1, promptIds: [1, 2, 3], maxNewTokens: MAX_NEW },
      sampling: {},
      maxAttempts: 3,
      priorExpectedTokens: PRIOR,
      attemptsSpent: 0,
    },
    state: 'pending',
    notBeforeMs: 0,
    crashes: 0,
    chargeOnRecovery: false,
  };
}

/** A dataset with 300 spread-out commits and IN_FLIGHT fresh requests; returns what the reservation computes from. */
async function datasetWithRequests(ds: string): Promise<Omit<Parameters<typeof reservedTokens>[0], 'inFlight'>> {
  const lease = keys.endpointLeases(endpointUrl);
  await r.hset(keys.stats(ds), 'tokenBudget', 1_000_000_000);
  for (let i = 0; i < 300; i += 1) {
    const tokens = 200 + ((i * 7919) % 7_000);
    await r.commitSample(
      keys.done(ds),
      keys.stats(ds),
      keys.results(ds),
      keys.inflight(ds),
      lease,
      keys.failed(ds),
      keys.skipped(ds),
      keys.attempts(ds),
      keys.rate(ds),
      `c${i}`,
      tokens,
      JSON.stringify({ id: `c${i}`, completion_tokens: tokens }),
      `done-${i}`,
      10_000,
      30,
    );
  }
  for (let i = 0; i < IN_FLIGHT; i += 1) {
    const code = await r.acquireRequest(
      5,
      keys.stats(ds),
      keys.inflight(ds),
      keys.done(ds),
      keys.queueMeta(ds),
      lease,
      `run-${i}`,
      60_000,
      PRIOR,
      10_000,
      MIN_COMMITS,
      0,
      0,
      `s${i}`,
      MAX_NEW,
      0,
      1,
    );
    expect(decodeAcquire(code).kind).toBe('acquired');
  }
  const stats = await r.hgetall(keys.stats(ds));
  return {
    committed: Number(stats['outputTokens']),
    records: Number(stats['records']),
    hist: histogramFromHash(await r.hgetall(`${keys.stats(ds)}:lengths`)),
    prior: PRIOR,
    minCommits: MIN_COMMITS,
    maxNewTokens: MAX_NEW,
  };
}

/** {@link datasetWithRequests}, its budget halfway between the plain reservation and the one with the default margin. */
async function datasetAtTheEnd(ds: string): Promise<void> {
  const base = {
    ...(await datasetWithRequests(ds)),
    inFlight: Array.from({ length: IN_FLIGHT }, () => ({ produced: 0 })),
  };
  const plain = reservedTokens(base);
  const withMargin = reservedTokens({ ...base, marginSd: DEFAULT_BUDGET_MARGIN_SD });
  expect(withMargin - plain).toBeGreaterThan(1_000);
  await r.hset(keys.stats(ds), 'tokenBudget', Math.floor((plain + withMargin) / 2));
}

/** `datasets[].budgetMarginSd` of the datasets named; any other gets the schema's default, as `inferenceOptions` compiles it. */
function margins(byDataset: Record<string, number>): BudgetMargins {
  return { byDataset, unlisted: DEFAULT_BUDGET_MARGIN_SD };
}

/** One acquire through addAcquires, as the dispatcher pipelines it; the script's answer. */
async function acquireVia(ds: string, id: string, settings: Partial<AcquireSettings>): Promise<string> {
  const pipeline = r.pipeline() as unknown as RedisPipeline;
  const [attempt] = newAttempts([task(ds, id)]);
  if (attempt === undefined) throw new Error('no attempt');
  const group = [{ url: endpointUrl }] as unknown as Endpoint[];
  const calls = addAcquires(pipeline, [attempt], group, 10_000, {
    keys,
    leaseTtlMs: 60_000,
    minCommitsForMean: MIN_COMMITS,
    crashProbationMs: 0,
    budgetMarginSd: margins({}),
    strictDatasets: new Set(),
    ...settings,
  });
  readAcquires(calls, await pipeline.exec());
  if (attempt.error !== undefined) throw attempt.error;
  return decodeAcquire(attempt.code).kind;
}

describe('the budget margin the dispatcher sends', () => {
  it("is the dataset's own, else the schema's default, as the config compiles it", () => {
    const cfg = loadConfig({
      baseDir: '/',
      object: {
        datasets: [
          { name: 'a', prompts: 'a.jsonl', tokenBudget: 1_000, budgetMarginSd: 2.5 },
          { name: 'z', prompts: 'z.jsonl', tokenBudget: 1_000, budgetMarginSd: 0 },
          { name: 'b', prompts: 'b.jsonl', tokenBudget: 1_000 },
        ],
      },
    });
    const m = inferenceOptions(cfg).budgetMarginSd;
    expect(budgetMarginOf(m, 'a')).toBe(2.5);
    expect(budgetMarginOf(m, 'z')).toBe(0);
    expect(budgetMarginOf(m, 'b')).toBe(DEFAULT_BUDGET_MARGIN_SD);
    // A dataset another producer's config registered: the schema's default too.
    expect(budgetMarginOf(m, 'elsewhere')).toBe(DEFAULT_BUDGET_MARGIN_SD);
  });

  it('holds a request back at the end of a dataset by default, where the plain expectation would start it', async () => {
    await datasetAtTheEnd('dflt');
    expect(await acquireVia('dflt', 'x1', {})).toBe('budget-reserved');
    expect(await acquireVia('dflt', 'x2', { budgetMarginSd: margins({ other: 0 }) })).toBe('budget-reserved');
    // The dataset's own setting of 0 starts it.
    expect(await acquireVia('dflt', 'x3', { budgetMarginSd: margins({ dflt: 0 }) })).toBe('acquired');
  });

  it('holds the margin back for a dataset in strict mode too (few requests in flight to abort at the budget), nothing with its own 0', async () => {
    await datasetAtTheEnd('strict');
    expect(await acquireVia('strict', 'y1', { strictDatasets: new Set(['strict']) })).toBe('budget-reserved');
    expect(
      await acquireVia('strict', 'y2', { strictDatasets: new Set(['strict']), budgetMarginSd: margins({ strict: 0 }) }),
    ).toBe('acquired');
  });

  it('scales the progress estimated from running time for a reserve dataset, not for a strict one', async () => {
    for (const ds of ['timed', 'timed-strict']) {
      const base = await datasetWithRequests(ds);
      // The requests have run 2,000 ms at 1 token/ms.
      const [sec, usec] = await r.time();
      const now = Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
      for (let i = 0; i < IN_FLIGHT; i += 1) await r.hset(`${keys.inflight(ds)}:start`, `run-${i}`, now - 2_000);
      await r.hset(keys.stats(ds), 'rateMax', 1);
      const at = (produced: number): number =>
        reservedTokens({ ...base, inFlight: Array.from({ length: IN_FLIGHT }, () => ({ produced })) });
      expect(at(2_000 * TIMED_PROGRESS_FACTOR)).toBeGreaterThan(at(2_100) + 1_000);
      await r.hset(keys.stats(ds), 'tokenBudget', Math.floor((at(2_100) + at(2_000 * TIMED_PROGRESS_FACTOR)) / 2));
    }
    expect(await acquireVia('timed', 'z1', { budgetMarginSd: margins({ timed: 0 }) })).toBe('budget-reserved');
    expect(
      await acquireVia('timed-strict', 'z2', {
        strictDatasets: new Set(['timed-strict']),
        budgetMarginSd: margins({ 'timed-strict': 0 }),
      }),
    ).toBe('acquired');
  });
});
