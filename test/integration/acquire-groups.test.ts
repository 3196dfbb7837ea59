// Acquires in groups (addAcquires): one acquire-request.lua call decides a run of samples of
// one dataset, each exactly as if it had its own call, in order — against a real Redis, side by
// side with the same requests sent one call each.
import { describe, expect, it } from 'vitest';
import { DEFAULT_BUDGET_MARGIN_SD, RunKeys, decodeAcquire } from '../../src/shared/index.js';
import {
  addAcquires,
  newAttempts,
  readAcquires,
  type AcquireAttempt,
  type AcquireSettings,
  type RedisPipeline,
} from '../../src/workers/inference/dispatch-acquire.js';
import type { Task } from '../../src/workers/inference/dispatch-queue.js';
import type { Endpoint } from '../../src/workers/inference/endpoint-pool.js';
import { useHarness } from '../helpers/fixture.js';

const { redis, scripts: r } = useHarness({ scripts: true });

function task(ds: string, id: string, crashes = 0): Task {
  return {
    req: {
      dataset: ds,
      sample: { id, line: 1, promptIds: [1, 2, 3], maxNewTokens: 100 },
      sampling: {},
      maxAttempts: 3,
      priorExpectedTokens: 40,
      attemptsSpent: 0,
    },
    state: 'pending',
    notBeforeMs: 0,
    crashes,
    chargeOnRecovery: false,
  };
}

const endpoints = ['http://g:1', 'http://g:2'];
const group = endpoints.map((url) => ({ url })) as unknown as Endpoint[];

/** What each task's acquire answers, sent as addAcquires groups them (`grouped`) or one pipeline call each. */
async function acquireAll(keys: RunKeys, tasks: Task[], grouped: boolean): Promise<{ kinds: string[]; calls: number }> {
  const settings: AcquireSettings = {
    keys,
    leaseTtlMs: 60_000,
    minCommitsForMean: 4,
    crashProbationMs: 5_000,
    budgetMarginSd: { byDataset: {}, unlisted: DEFAULT_BUDGET_MARGIN_SD },
    strictDatasets: new Set(),
  };
  const pipeline = r.pipeline() as unknown as RedisPipeline;
  const attempts = newAttempts(tasks);
  let calls: AcquireAttempt[][];
  if (grouped) calls = addAcquires(pipeline, attempts, group, 3, settings);
  else calls = attempts.map((a) => addAcquires(pipeline, [a], group, 3, settings)).flat();
  readAcquires(calls, await pipeline.exec());
  return {
    kinds: attempts.map((a) => {
      if (a.error !== undefined) throw a.error;
      const d = decodeAcquire(a.code);
      return d.kind === 'acquired' ? `acquired@${d.endpointIndex}` : d.kind;
    }),
    calls: calls.length,
  };
}

async function prepare(keys: RunKeys): Promise<void> {
  await r.hset(keys.stats('a'), 'tokenBudget', 1_000_000);
  await r.hset(keys.stats('b'), 'tokenBudget', 100); // 40 expected per request: two start, the third waits
  await r.sadd(keys.done('a'), 'a-done');
  await r.hset(keys.queueMeta('p'), 'paused', 1);
}

describe('acquires in groups', () => {
  it('answer as one call per request would: slots, caps, budgets, done, paused, probation — one call per run of a dataset', async () => {
    const tasks = (): Task[] => [
      task('a', 'a1'),
      task('a', 'a-done'),
      task('a', 'a2', 2), // on probation: an endpoint to itself
      task('b', 'b1'),
      task('b', 'b2'),
      task('b', 'b3'),
      task('p', 'p1'),
      task('a', 'a3'),
      task('a', 'a4'),
      task('a', 'a5'),
      task('a', 'a6'),
    ];
    const one = new RunKeys(redis.prefix, 'one');
    const many = new RunKeys(redis.prefix, 'many');
    await prepare(one);
    await prepare(many);
    const alone = await acquireAll(one, tasks(), false);
    const together = await acquireAll(many, tasks(), true);
    expect(together.kinds).toEqual(alone.kinds);
    expect(together.calls).toBe(4); // a a a | b b b | p | a a a a
    expect(alone.calls).toBe(11);
    // What was decided: 2 endpoints x cap 3, one taken alone by the probation.
    expect(alone.kinds).toEqual([
      'acquired@0',
      'already-done',
      'acquired@1',
      'acquired@0',
      'acquired@0',
      'budget-reserved',
      'paused',
      'no-slot',
      'no-slot',
      'no-slot',
      'no-slot',
    ]);
    for (const keys of [one, many]) {
      expect(await r.zcard(keys.inflight('a'))).toBe(2);
      expect(await r.zcard(keys.inflight('b'))).toBe(2);
    }
  });
});
