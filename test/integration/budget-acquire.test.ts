// The budget decision of acquire-request.lua against a real Redis: each request in flight
// reserves E[L | L > x] at its own progress x, computed the way budget-expectation.ts does.
import { describe, expect, it } from 'vitest';
import { decodeAcquire } from '../../src/shared/index.js';
import { histogramFromHash, histogramOf, reservedTokens } from '../../src/workers/inference/budget-expectation.js';
import { useHarness } from '../helpers/fixture.js';

const { scripts: r, keys } = useHarness({ scripts: true, keys: 'budget-acquire' });
const endpoint = 'http://budget:1';
const MAX_NEW = 10_240;
const PRIOR = 5_120;
const MIN_COMMITS = 32;

function acquire(ds: string, rid: string, ttlMs = 60_000, marginSd = 0, timedFactor = 1): Promise<number> {
  const lease = keys.endpointLeases(endpoint);
  return r.acquireRequest(
    5,
    keys.stats(ds),
    keys.inflight(ds),
    keys.done(ds),
    keys.queueMeta(ds),
    lease,
    rid,
    ttlMs,
    PRIOR,
    10_000,
    MIN_COMMITS,
    0,
    0,
    `${rid}-sample`,
    MAX_NEW,
    marginSd,
    timedFactor,
  );
}

function commit(ds: string, id: string, tokens: number, rid: string): Promise<number[]> {
  return r.commitSample(
    keys.done(ds),
    keys.stats(ds),
    keys.results(ds),
    keys.inflight(ds),
    keys.endpointLeases(endpoint),
    keys.failed(ds),
    keys.skipped(ds),
    keys.attempts(ds),
    keys.rate(ds),
    id,
    tokens,
    JSON.stringify({ id, completion_tokens: tokens }),
    rid,
    10_000,
    30,
  );
}

/** Lengths spread like the users' completions (lognormal, mean ~2,700), deterministic. */
function lengths(n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i += 1) {
    const u = (i + 0.5) / n;
    // Inverse of a logistic approximation of the normal CDF: enough for a spread-out sample.
    const z = Math.log(u / (1 - u)) / 1.702;
    out.push(Math.min(MAX_NEW, Math.max(1, Math.round(Math.exp(Math.log(2_700) - 0.32 + 0.8 * z)))));
  }
  return out;
}

/** A dataset with `n` committed lengths and `inFlight` requests started, at the given progress. */
async function dataset(
  ds: string,
  committedLengths: readonly number[],
  progress: readonly number[],
): Promise<{ committed: number }> {
  await r.hset(keys.stats(ds), 'tokenBudget', 1_000_000_000);
  let committed = 0;
  for (const [i, l] of committedLengths.entries()) {
    await commit(ds, `c${i}`, l, `done-${i}`);
    committed += l;
  }
  for (const [i, x] of progress.entries()) {
    expect(decodeAcquire(await acquire(ds, `run-${i}`)).kind).toBe('acquired');
    if (x > 0) await r.hset(`${keys.inflight(ds)}:progress`, `run-${i}`, x);
  }
  return { committed };
}

/** The reservation budget-expectation.ts computes for the dataset's state in Redis. */
async function expectedReservation(ds: string, progress: readonly number[], marginSd = 0): Promise<number> {
  const stats = await r.hgetall(keys.stats(ds));
  return reservedTokens({
    committed: Number(stats['outputTokens'] ?? 0),
    records: Number(stats['records'] ?? 0),
    hist: histogramFromHash(await r.hgetall(`${keys.stats(ds)}:lengths`)),
    inFlight: progress.map((produced) => ({ produced })),
    prior: PRIOR,
    minCommits: MIN_COMMITS,
    maxNewTokens: MAX_NEW,
    marginSd,
  });
}

/** Whether a new request may start under `budget`; a request that starts is released again. */
async function admits(ds: string, budget: number, rid: string, marginSd = 0, timedFactor = 1): Promise<boolean> {
  await r.hset(keys.stats(ds), 'tokenBudget', budget);
  const outcome = decodeAcquire(await acquire(ds, rid, 60_000, marginSd, timedFactor));
  if (outcome.kind === 'acquired') {
    await r.zrem(keys.inflight(ds), rid);
    await r.zrem(keys.endpointLeases(endpoint), rid);
    return true;
  }
  expect(outcome.kind).toBe('budget-reserved');
  return false;
}

describe('acquire-request.lua: the reservation of requests at various progress', () => {
  it('the commit keeps the length histogram, and a request that is committed leaves no start time or progress behind', async () => {
    const ls = lengths(200);
    await dataset('hist', ls, []);
    const hist = histogramFromHash(await r.hgetall(`${keys.stats('hist')}:lengths`));
    expect([...hist.entries()].sort((a, b) => a[0] - b[0])).toEqual(
      [...histogramOf(ls).entries()].sort((a, b) => a[0] - b[0]),
    );
    expect(decodeAcquire(await acquire('hist', 'one')).kind).toBe('acquired');
    expect(await r.hexists(`${keys.inflight('hist')}:start`, 'one')).toBe(1);
    await r.hset(`${keys.inflight('hist')}:progress`, 'one', 40);
    await commit('hist', 'last', 50, 'one');
    expect(await r.hexists(`${keys.inflight('hist')}:start`, 'one')).toBe(0);
    expect(await r.hexists(`${keys.inflight('hist')}:progress`, 'one')).toBe(0);
    // Its elapsed time and length feed the decode rate (tokens per ms of the fastest recent request).
    expect(Number(await r.hget(keys.stats('hist'), 'rateMax'))).toBeGreaterThan(0);
    expect(Number(await r.hget(keys.stats('hist'), 'rateMax'))).toBeLessThanOrEqual(50);
  });

  for (const [name, progress] of [
    ['all fresh', Array<number>(40).fill(0)],
    ['half far along', [...Array<number>(20).fill(0), ...Array<number>(20).fill(5_000)]],
    ['some near max_new_tokens', [...Array<number>(30).fill(800), ...Array<number>(10).fill(9_900)]],
  ] as const) {
    it(`admits a request exactly while committed + the expectations of those in flight stay under the budget (${name})`, async () => {
      const ds = `at-${name.replace(/\W+/g, '-')}`;
      await dataset(ds, lengths(300), progress);
      const reserved = await expectedReservation(ds, progress);
      expect(await admits(ds, Math.floor(reserved) + 2, `${ds}-yes`)).toBe(true);
      expect(await admits(ds, Math.floor(reserved), `${ds}-no`)).toBe(false);
    });
  }

  it('reserves more for requests that have come further, and a fresh one the plain mean (not the size-biased one)', async () => {
    const ls = lengths(300);
    const fresh = Array<number>(40).fill(0);
    const far = Array<number>(40).fill(6_000);
    await dataset('fresh', ls, fresh);
    await dataset('far', ls, far);
    const rFresh = await expectedReservation('fresh', fresh);
    const rFar = await expectedReservation('far', far);
    const committed = ls.reduce((a, b) => a + b, 0);
    const mean = committed / ls.length;
    const sizeBiased = ls.reduce((a, b) => a + b * b, 0) / committed;
    // 40 fresh requests reserve about 40 plain means, well under 40 size-biased ones.
    expect((rFresh - committed) / 40).toBeLessThan(1.1 * mean);
    expect((rFresh - committed) / 40).toBeLessThan(0.75 * sizeBiased);
    expect(rFar - committed).toBeGreaterThan(40 * 6_000);
    // A budget between the two: the dataset with fresh requests admits one more, the other does not.
    const between = Math.floor((rFresh + rFar) / 2);
    expect(await admits('fresh', between, 'fresh-next')).toBe(true);
    expect(await admits('far', between, 'far-next')).toBe(false);
  });

  it('adds a margin of standard deviations of the in-flight total, as budget-expectation.ts computes it', async () => {
    const progress = [...Array<number>(30).fill(0), ...Array<number>(30).fill(3_000)];
    await dataset('margin', lengths(300), progress);
    const plain = await expectedReservation('margin', progress);
    const withMargin = await expectedReservation('margin', progress, 1);
    expect(withMargin - plain).toBeGreaterThan(5_000);
    expect(await admits('margin', Math.floor(withMargin) + 2, 'm-yes', 1)).toBe(true);
    expect(await admits('margin', Math.floor(withMargin), 'm-no', 1)).toBe(false);
    // Without the margin the same budget admits.
    expect(await admits('margin', Math.floor(withMargin), 'm-plain', 0)).toBe(true);
  });

  it('estimates progress from the time a request has run and the decode rate when nothing is streamed', async () => {
    await dataset('timed', lengths(300), Array<number>(20).fill(0));
    const idle = await expectedReservation('timed', Array<number>(20).fill(0));
    expect(await admits('timed', Math.floor(idle) + 2, 'timed-a')).toBe(true);
    // Backdate their start: at 1 token/ms they have produced ~4,000 tokens each.
    const startKey = `${keys.inflight('timed')}:start`;
    const [sec, usec] = await r.time();
    const now = Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
    for (let i = 0; i < 20; i += 1) await r.hset(startKey, `run-${i}`, now - 4_000);
    await r.hset(keys.stats('timed'), 'rateMax', 1);
    expect(await admits('timed', Math.floor(idle) + 2, 'timed-b')).toBe(false);
    const advanced = await expectedReservation('timed', Array<number>(20).fill(4_000));
    expect(await admits('timed', Math.floor(advanced * 1.01) + 2, 'timed-c')).toBe(true);
  });

  it('scales the time-based progress by ARGV[11] where nothing is streamed, and leaves streamed progress as it is', async () => {
    await dataset('scaled', lengths(300), Array<number>(20).fill(0));
    // 20 requests that have run 2,000 ms at 1 token/ms: 2,000 tokens by time, 3,000 scaled by 1.5.
    const startKey = `${keys.inflight('scaled')}:start`;
    const [sec, usec] = await r.time();
    const now = Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
    for (let i = 0; i < 20; i += 1) await r.hset(startKey, `run-${i}`, now - 2_000);
    await r.hset(keys.stats('scaled'), 'rateMax', 1);
    const atTime = await expectedReservation('scaled', Array<number>(20).fill(2_000));
    const scaled = await expectedReservation('scaled', Array<number>(20).fill(3_000));
    expect(scaled - atTime).toBeGreaterThan(20 * 300);
    // A budget between the two: room at the progress by time, none once it is scaled.
    const between = Math.floor(atTime + (scaled - atTime) / 2);
    expect(await admits('scaled', between, 'scaled-plain', 0, 1)).toBe(true);
    expect(await admits('scaled', between, 'scaled-by-1.5', 0, 1.5)).toBe(false);
    // Streamed progress is the request's own count: it is not scaled (the time-based one still bounds it from below).
    for (let i = 0; i < 20; i += 1) await r.hset(`${keys.inflight('scaled')}:progress`, `run-${i}`, 1_000);
    expect(await admits('scaled', between, 'scaled-streamed', 0, 1.5)).toBe(true);
  });

  it('floors every expectation by the prior at the beginning of a dataset (few commits)', async () => {
    const progress = Array<number>(10).fill(0);
    await dataset('early', [100, 120, 90], progress);
    const reserved = await expectedReservation('early', progress);
    expect(reserved).toBeCloseTo(310 + 10 * PRIOR, 6);
    expect(await admits('early', Math.floor(reserved) + 2, 'early-yes')).toBe(true);
    expect(await admits('early', Math.floor(reserved), 'early-no')).toBe(false);
  });

  it("releases the reservation of a crashed worker's request at the last prompts once its lease lapses", async () => {
    await dataset('crash', lengths(300), []);
    const stats = await r.hgetall(keys.stats('crash'));
    const committed = Number(stats['outputTokens']);
    // The last prompt goes out on a worker that dies: its lease is never renewed.
    expect(decodeAcquire(await acquire('crash', 'dead', 300)).kind).toBe('acquired');
    await r.hset(`${keys.inflight('crash')}:progress`, 'dead', 9_000);
    const budget = committed + 3_000;
    await r.hset(keys.stats('crash'), 'tokenBudget', budget);
    expect(decodeAcquire(await acquire('crash', 'blocked')).kind).toBe('budget-reserved');
    await new Promise((res) => setTimeout(res, 400));
    // The lease lapsed: the budget is free again, and the dead request's progress is gone.
    expect(decodeAcquire(await acquire('crash', 'retry')).kind).toBe('acquired');
    expect(await r.hexists(`${keys.inflight('crash')}:progress`, 'dead')).toBe(0);
    expect(await r.hexists(`${keys.inflight('crash')}:start`, 'dead')).toBe(0);
    expect(await r.zscore(keys.inflight('crash'), 'dead')).toBeNull();
  });

  it('sends nothing once the budget is met, whatever is in flight', async () => {
    await dataset('met', lengths(50), [0]);
    const committed = Number(await r.hget(keys.stats('met'), 'outputTokens'));
    await r.hset(keys.stats('met'), 'tokenBudget', committed);
    expect(decodeAcquire(await acquire('met', 'after')).kind).toBe('budget-met');
  });
});

describe('budget-progress-2.lua: the strict stop flag', () => {
  it('sets the flag once committed + produced in flight reach the budget; acquire waits for the aborted requests, then says met', async () => {
    const ds = 'strict';
    await dataset(ds, lengths(100), [0, 0, 0]);
    const committed = Number(await r.hget(keys.stats(ds), 'outputTokens'));
    await r.hset(keys.stats(ds), 'tokenBudget', committed + 1_000);
    const progress = (...args: (string | number)[]): Promise<number> =>
      r.budgetProgress(keys.inflight(ds), keys.stats(ds), ...args);
    expect(await progress('run-0', 300, 'run-1', 300)).toBe(0);
    // A rid that is not in flight (already committed) is ignored.
    expect(await progress('gone', 5_000)).toBe(0);
    expect(await progress('run-2', 400)).toBe(1);
    const stats = await r.hgetall(keys.stats(ds));
    expect(Number(stats['budgetStopTokens'])).toBe(committed + 1_000);
    expect(Number(stats['budgetStopMs'])).toBeGreaterThan(0);
    // Another worker reporting later is told to stop too.
    expect(await progress()).toBe(1);
    expect(decodeAcquire(await acquire(ds, 'late')).kind).toBe('budget-reserved');
    for (const [i, n] of [310, 320, 410].entries()) await commit(ds, `p${i}`, n, `run-${i}`);
    expect(decodeAcquire(await acquire(ds, 'later')).kind).toBe('budget-met');
  });

  it("drops the flag when the aborted requests' worker died before committing them (the budget is not met)", async () => {
    const ds = 'strict-crash';
    await dataset(ds, lengths(100), []);
    const committed = Number(await r.hget(keys.stats(ds), 'outputTokens'));
    await r.hset(keys.stats(ds), 'tokenBudget', committed + 1_000);
    expect(decodeAcquire(await acquire(ds, 'dying', 300)).kind).toBe('acquired');
    expect(await r.budgetProgress(keys.inflight(ds), keys.stats(ds), 'dying', 1_200)).toBe(1);
    expect(decodeAcquire(await acquire(ds, 'wait')).kind).toBe('budget-reserved');
    await new Promise((res) => setTimeout(res, 400));
    expect(decodeAcquire(await acquire(ds, 'again')).kind).toBe('acquired');
    expect(await r.hexists(keys.stats(ds), 'budgetStopMs')).toBe(0);
  });
});

describe('acquire-request.lua: the margin near the end of a dataset', () => {
  it('floors each variance by that of the prior while the commits are few, as budget-expectation.ts does', async () => {
    const progress = Array<number>(10).fill(0);
    await dataset('early-margin', [100, 120, 90], progress);
    const reserved = await expectedReservation('early-margin', progress, 1);
    // Ten fresh requests at the prior, plus one standard deviation of ten lengths spread over [0, 2 prior].
    expect(reserved).toBeCloseTo(310 + 10 * PRIOR + Math.sqrt((10 * PRIOR * PRIOR) / 3), 6);
    expect(await admits('early-margin', Math.floor(reserved) + 2, 'em-yes', 1)).toBe(true);
    expect(await admits('early-margin', Math.floor(reserved), 'em-no', 1)).toBe(false);
  });

  it('with nothing in flight and the budget not met, starts one request whatever the margin; the next waits for it', async () => {
    await dataset('tail', lengths(300), []);
    const committed = Number(await r.hget(keys.stats('tail'), 'outputTokens'));
    await r.hset(keys.stats('tail'), 'tokenBudget', committed + 1);
    expect(decodeAcquire(await acquire('tail', 'last-1', 60_000, 50)).kind).toBe('acquired');
    // One in flight: its expectation alone fills the budget.
    expect(decodeAcquire(await acquire('tail', 'last-2', 60_000, 50)).kind).toBe('budget-reserved');
    expect(decodeAcquire(await acquire('tail', 'last-3', 60_000, 0)).kind).toBe('budget-reserved');
    // It ends as a failure (released, nothing committed): the dataset is below its budget with nothing in flight again.
    await r.zrem(keys.inflight('tail'), 'last-1');
    await r.zrem(keys.endpointLeases(endpoint), 'last-1');
    expect(decodeAcquire(await acquire('tail', 'last-4', 60_000, 50)).kind).toBe('acquired');
    // Its commit meets the budget: nothing more, margin or not.
    await commit('tail', 'last', 1, 'last-4');
    expect(decodeAcquire(await acquire('tail', 'last-5', 60_000, 0)).kind).toBe('budget-met');
  });

  it('holds back more of the budget while many requests are in flight and less as they end: the margin shrinks with sqrt(n)', async () => {
    const many = Array<number>(64).fill(0);
    await dataset('shrink-many', lengths(300), many);
    await dataset('shrink-few', lengths(300), many.slice(0, 4));
    const gap = async (ds: string, progress: number[]): Promise<number> =>
      (await expectedReservation(ds, progress, 1)) - (await expectedReservation(ds, progress, 0));
    const gMany = await gap('shrink-many', many);
    const gFew = await gap('shrink-few', many.slice(0, 4));
    expect(gMany / gFew).toBeCloseTo(4, 6);
    // A budget the plain reservation admits under, but not the margin: 64 in flight wait, 4 do not
    // once the budget leaves room for the smaller margin.
    const plainMany = await expectedReservation('shrink-many', many, 0);
    expect(await admits('shrink-many', Math.floor(plainMany + gMany / 2), 'sm-no', 1)).toBe(false);
    expect(await admits('shrink-many', Math.floor(plainMany + gMany / 2), 'sm-plain', 0)).toBe(true);
    const plainFew = await expectedReservation('shrink-few', many.slice(0, 4), 0);
    expect(await admits('shrink-few', Math.floor(plainFew + gFew) + 2, 'sf-yes', 1)).toBe(true);
  });
});
