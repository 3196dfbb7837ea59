import { describe, expect, it } from 'vitest';
import { decodeAcquire, isDatasetPaused, pauseDataset, resumeDataset } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';

const { scripts: r, keys } = useHarness({ scripts: true, keys: 'lua' });
const ep = ['http://a:1', 'http://b:2'];

/**
 * acquire-request.lua with the arguments these tests leave out filled as the dispatcher sends them
 * for a plain request: no probation (ARGV[6], ARGV[7]), a sample id of its own (ARGV[8]),
 * max_new_tokens twice the prior (ARGV[9]), no budget margin (ARGV[10]), progress unscaled (ARGV[11]).
 */
function acquireRequest(numKeys: number, ...keysAndArgs: (string | number)[]): Promise<number> {
  const argv = keysAndArgs.slice(numKeys);
  const [rid, , prior] = argv;
  const filled = [0, 0, `sample-of-${String(rid)}`, 2 * Number(prior), 0, 1];
  return r.acquireRequest(numKeys, ...keysAndArgs, ...filled.slice(argv.length - 5));
}

function acquire(ds: string, rid: string, cap = 2, prior = 100, endpoints = ep): Promise<number> {
  const leaseKeys = endpoints.map((e) => keys.endpointLeases(e));
  return acquireRequest(
    4 + leaseKeys.length,
    keys.stats(ds),
    keys.inflight(ds),
    keys.done(ds),
    keys.queueMeta(ds),
    ...leaseKeys,
    rid,
    60_000,
    prior,
    cap,
    4,
  );
}

function commit(ds: string, id: string, tokens: number, rid: string, endpoint = ep[0] ?? ''): Promise<number[]> {
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

describe('commit-sample.lua', () => {
  it('commits a sample once: the counter, the stream and the done set change only on the first commit', async () => {
    // No budget: the stats hash has no tokenBudget field.
    expect(await commit('c', 's1', 40, 'r1')).toEqual([1, 40]);
    expect(await commit('c', 's1', 55, 'r2')).toEqual([0, 40]);
    expect(await commit('c', 's2', 10, 'r3')).toEqual([1, 50]);
    expect(await r.xlen(keys.results('c'))).toBe(2);
    expect(await r.smembers(keys.done('c'))).toEqual(expect.arrayContaining(['s1', 's2']));
    expect(await r.hget(keys.stats('c'), 'records')).toBe('2');
    expect(await r.hget(keys.stats('c'), 'outputTokensSq')).toBe(String(40 * 40 + 10 * 10));
  });

  it("releases the request's leases whether or not it was the first commit, and records when the budget was met", async () => {
    await r.hset(keys.stats('l'), 'tokenBudget', 1_000);
    expect(decodeAcquire(await acquire('l', 'ra'))).toEqual({ kind: 'acquired', endpointIndex: 0 });
    expect(decodeAcquire(await acquire('l', 'rb'))).toEqual({ kind: 'acquired', endpointIndex: 1 });
    expect(await r.zcard(keys.inflight('l'))).toBe(2);
    await commit('l', 'x', 600, 'ra', ep[0]);
    expect(await r.hget(keys.stats('l'), 'budgetMetMs')).toBeNull();
    await commit('l', 'x', 600, 'rb', ep[1]);
    expect(await r.zcard(keys.inflight('l'))).toBe(0);
    expect(await r.zcard(keys.endpointLeases(ep[1] ?? ''))).toBe(0);
    await commit('l', 'y', 500, 'rc');
    expect(Number(await r.hget(keys.stats('l'), 'budgetMetMs'))).toBeGreaterThan(0);
  });
  it('commits a group in one call exactly as one call each: duplicates in and across groups change nothing but their leases', async () => {
    await r.hset(keys.stats('g'), 'tokenBudget', 100);
    for (const rid of ['g1', 'g2', 'g3', 'g4'])
      expect(decodeAcquire(await acquire('g', rid, 10, 1, [ep[0] ?? '']))).toEqual({
        kind: 'acquired',
        endpointIndex: 0,
      });
    expect(await commit('g', 'a', 30, 'g0')).toEqual([1, 30]);
    const rec = (id: string, tokens: number): string => JSON.stringify({ id, completion_tokens: tokens });
    const reply = await r.commitSample(
      keys.done('g'),
      keys.stats('g'),
      keys.results('g'),
      keys.inflight('g'),
      keys.endpointLeases(ep[0] ?? ''),
      keys.failed('g'),
      keys.skipped('g'),
      keys.attempts('g'),
      keys.rate('g'),
      'b',
      40,
      rec('b', 40),
      'g1',
      10_000,
      30,
      'a',
      99,
      rec('a', 99),
      'g2', // committed before this group
      'c',
      50,
      rec('c', 50),
      'g3', // meets the budget of 100
      'b',
      7,
      rec('b', 7),
      'g4', // twice in one group
    );
    expect(reply).toEqual([1, 70, 0, 70, 1, 120, 0, 120]);
    expect(await r.zcard(keys.inflight('g'))).toBe(0);
    expect(await r.zcard(keys.endpointLeases(ep[0] ?? ''))).toBe(0);
    const stream = (await r.xrange(keys.results('g'), '-', '+')).map(
      ([, f]) => (JSON.parse(f[1] ?? '{}') as { id: string }).id,
    );
    expect(stream).toEqual(['a', 'b', 'c']);
    const stats = await r.hgetall(keys.stats('g'));
    expect([stats.records, stats.outputTokens, stats.outputTokensSq]).toEqual([
      '3',
      '120',
      String(30 * 30 + 40 * 40 + 50 * 50),
    ]);
    expect(Number(stats.budgetMetMs)).toBeGreaterThan(0);
  });
});

describe('acquire-request.lua', () => {
  it('picks the least-loaded endpoint and refuses past the cap on every endpoint', async () => {
    const eps = ['http://c:1', 'http://d:1'];
    const got = [];
    for (let i = 0; i < 4; i += 1) got.push(decodeAcquire(await acquire('cap', `r${i}`, 2, 1, eps)));
    expect(got.map((g) => (g.kind === 'acquired' ? g.endpointIndex : g.kind))).toEqual([0, 1, 0, 1]);
    expect(decodeAcquire(await acquire('cap', 'r5', 2, 1, eps))).toEqual({ kind: 'no-slot' });
  });

  it('reserves the budget for requests in flight and says when it is met', async () => {
    await r.hset(keys.stats('b'), 'tokenBudget', 1_000);
    const eps = ['http://e:1'];
    // prior 300: 0 + n*300 < 1000 admits 4 requests, not a 5th.
    const codes = [];
    for (let i = 0; i < 5; i += 1) codes.push(decodeAcquire(await acquire('b', `q${i}`, 100, 300, eps)).kind);
    expect(codes).toEqual(['acquired', 'acquired', 'acquired', 'acquired', 'budget-reserved']);
    await r.hset(keys.stats('b'), 'outputTokens', 1_000, 'records', 4);
    expect(decodeAcquire(await acquire('b', 'q9', 100, 300, eps)).kind).toBe('budget-met');
  });

  it("lets a crashed worker's leases lapse", async () => {
    const eps = ['http://f:1'];
    const leaseKeys = eps.map((e) => keys.endpointLeases(e));
    expect(
      await acquireRequest(
        5,
        keys.stats('t'),
        keys.inflight('t'),
        keys.done('t'),
        keys.queueMeta('t'),
        ...leaseKeys,
        'dead',
        50,
        1,
        1,
        4,
      ),
    ).toBe(1);
    expect(
      decodeAcquire(
        await acquireRequest(
          5,
          keys.stats('t'),
          keys.inflight('t'),
          keys.done('t'),
          keys.queueMeta('t'),
          ...leaseKeys,
          'alive',
          50,
          1,
          1,
          4,
        ),
      ).kind,
    ).toBe('no-slot');
    await new Promise((res) => setTimeout(res, 80));
    expect(
      await acquireRequest(
        5,
        keys.stats('t'),
        keys.inflight('t'),
        keys.done('t'),
        keys.queueMeta('t'),
        ...leaseKeys,
        'alive',
        50,
        1,
        1,
        4,
      ),
    ).toBe(1);
  });
});

describe('acquire-request.lua: its arguments', () => {
  it('refuses a call with an argument left out, rather than defaulting it', async () => {
    const leaseKeys = ep.map((e) => keys.endpointLeases(e));
    const head = [4 + leaseKeys.length, keys.stats('args'), keys.inflight('args'), keys.done('args')] as const;
    const args = [keys.queueMeta('args'), ...leaseKeys, 'rid', 60_000, 100, 2, 4, 0, 0, 'sample', 200, 2] as const;
    // ARGV[11] (the factor on time-based progress) missing.
    await expect(r.acquireRequest(...head, ...args)).rejects.toThrow(/expected 11 arguments/);
    // ARGV[10] (the budget margin) not a number.
    await expect(r.acquireRequest(...head, ...args.slice(0, -1), '', 1)).rejects.toThrow(/ARGV\[10\]/);
    expect(decodeAcquire(await r.acquireRequest(...head, ...args, 1)).kind).toBe('acquired');
  });
});

describe('the budget-met rule (count-output-tokens, included by every script that counts tokens)', () => {
  it('records when the budget was met, once, from a commit, a restore or an aborted turn alike', async () => {
    const met = async (ds: string): Promise<string | null> => r.hget(keys.stats(ds), 'budgetMetMs');
    const restore = (ds: string, ...pairs: (string | number)[]): Promise<number> =>
      r.sinkRestore(keys.done(ds), keys.stats(ds), keys.failed(ds), keys.skipped(ds), keys.attempts(ds), ...pairs);
    const discard = (ds: string, id: string, tokens: number): Promise<number> =>
      r.discardAbortedTurn(
        keys.done(ds),
        keys.stats(ds),
        keys.inflight(ds),
        keys.endpointLeases(ep[0] ?? ''),
        keys.skipped(ds),
        id,
        tokens,
        `rid-${id}`,
      );
    for (const ds of ['met-c', 'met-r', 'met-d']) await r.hset(keys.stats(ds), 'tokenBudget', 100);
    await commit('met-c', 'a', 60, 'r1');
    await restore('met-r', 'a', 60);
    await discard('met-d', 'a#t1', 60);
    for (const ds of ['met-c', 'met-r', 'met-d']) expect(await met(ds)).toBeNull();
    await commit('met-c', 'b', 40, 'r2');
    await restore('met-r', 'b', 40);
    await discard('met-d', 'b#t1', 40);
    const first = await Promise.all(['met-c', 'met-r', 'met-d'].map(met));
    for (const t of first) expect(Number(t)).toBeGreaterThan(0);
    // Tokens after the budget was met leave its moment as it was.
    await commit('met-c', 'c', 10, 'r3');
    await restore('met-r', 'c', 10);
    await discard('met-d', 'c#t1', 10);
    expect(await Promise.all(['met-c', 'met-r', 'met-d'].map(met))).toEqual(first);
    // A dataset without a budget (no tokenBudget field) never meets one.
    await restore('met-none', 'a', 1_000_000);
    expect(await met('met-none')).toBeNull();
    expect(await r.hget(keys.stats('met-none'), 'outputTokens')).toBe('1000000');
  });
});

describe('renew-leases.lua', () => {
  it('after a stall that let the leases lapse, takes a slot again only while the endpoint is below its cap', async () => {
    const ep1 = 'http://stall:1';
    const leaseKeys = [keys.endpointLeases(ep1)];
    const take = (rid: string, ttl: number): Promise<number> =>
      acquireRequest(
        5,
        keys.stats('st'),
        keys.inflight('st'),
        keys.done('st'),
        keys.queueMeta('st'),
        ...leaseKeys,
        rid,
        ttl,
        1,
        2,
        4,
      );
    // Worker A holds both slots with a short lease, then stalls past it.
    expect(await take('a1', 40)).toBe(1);
    expect(await take('a2', 40)).toBe(1);
    await new Promise((res) => setTimeout(res, 60));
    // Worker B's acquire sweeps A's lapsed leases and takes one slot.
    expect(await take('b1', 60_000)).toBe(1);
    // A renews both: one slot is free (taken again), the other is not (lost).
    const codes = await r.renewLeases(
      4,
      keys.inflight('st'),
      leaseKeys[0] ?? '',
      keys.inflight('st'),
      leaseKeys[0] ?? '',
      60_000,
      2,
      'a1',
      'a2',
    );
    expect(codes).toEqual([2, 0]);
    expect(await r.zcard(leaseKeys[0] ?? '')).toBe(2);
    expect((await r.zrange(leaseKeys[0] ?? '', 0, -1)).sort()).toEqual(['a1', 'b1']);
    expect(await r.zscore(keys.inflight('st'), 'a2')).toBeNull();
    // A lease still live is just renewed.
    expect(await r.renewLeases(2, keys.inflight('st'), leaseKeys[0] ?? '', 60_000, 2, 'b1')).toEqual([1]);
  });
});

describe('probation (acquire-request.lua, end-probation.lua)', () => {
  it('a prompt on probation has its endpoint to itself until it ends or the probation lapses', async () => {
    const ep1 = 'http://probation:1';
    const leaseKeys = [keys.endpointLeases(ep1)];
    const take = (rid: string, probation: 0 | 1, probationMs = 60_000): Promise<number> =>
      acquireRequest(
        5,
        keys.stats('pb'),
        keys.inflight('pb'),
        keys.done('pb'),
        keys.queueMeta('pb'),
        ...leaseKeys,
        rid,
        60_000,
        1,
        10,
        4,
        probation,
        probationMs,
      );
    expect(await take('before', 0)).toBe(1);
    expect(await take('suspect', 1)).toBe(1);
    expect(await r.get(keys.endpointProbation(ep1))).toBe('suspect');
    expect(decodeAcquire(await take('other', 0)).kind).toBe('no-slot');
    expect(decodeAcquire(await take('suspect2', 1)).kind).toBe('no-slot');
    // Only the holder ends it.
    expect(await r.endProbation(keys.endpointProbation(ep1), 'other')).toBe(0);
    expect(await r.endProbation(keys.endpointProbation(ep1), 'suspect')).toBe(1);
    expect(await take('other', 0)).toBe(1);
    // It lapses on its own.
    expect(await take('suspect3', 1, 40)).toBe(1);
    expect(decodeAcquire(await take('x', 0)).kind).toBe('no-slot');
    await new Promise((res) => setTimeout(res, 60));
    expect(await take('x', 0)).toBe(1);
  });
});

describe('acquire-request.lua: a sample committed meanwhile', () => {
  it('is not sent again (a worker that lost its batch to another one)', async () => {
    const leaseKeys = [keys.endpointLeases('http://done:1')];
    const take = (rid: string, id: string): Promise<number> =>
      acquireRequest(
        5,
        keys.stats('dn'),
        keys.inflight('dn'),
        keys.done('dn'),
        keys.queueMeta('dn'),
        ...leaseKeys,
        rid,
        60_000,
        1,
        10,
        4,
        0,
        0,
        id,
      );
    expect(await take('r1', 's1')).toBe(1);
    await r.sadd(keys.done('dn'), 's2');
    expect(decodeAcquire(await take('r2', 's2')).kind).toBe('already-done');
    expect(await r.zscore(leaseKeys[0] ?? '', 'r2')).toBeNull();
  });
});

describe('acquire-request.lua: a paused dataset', () => {
  it('starts nothing while its queue is paused (the BullMQ meta field every pause route sets), and goes on once resumed', async () => {
    const leaseKeys = [keys.endpointLeases('http://pause:1')];
    const take = (ds: string, rid: string): Promise<number> =>
      acquireRequest(
        5,
        keys.stats(ds),
        keys.inflight(ds),
        keys.done(ds),
        keys.queueMeta(ds),
        ...leaseKeys,
        rid,
        60_000,
        1,
        10,
        4,
        0,
        0,
        rid,
      );
    await pauseDataset(r, keys, 'pz');
    expect(await isDatasetPaused(r, keys, 'pz')).toBe(true);
    expect(decodeAcquire(await take('pz', 'p1')).kind).toBe('paused');
    expect(await r.zcard(leaseKeys[0] ?? '')).toBe(0);
    expect(await r.zcard(keys.inflight('pz'))).toBe(0);
    // Another dataset on the same endpoint is not affected.
    expect(await take('other', 'o1')).toBe(1);
    await resumeDataset(r, keys, 'pz');
    expect(await isDatasetPaused(r, keys, 'pz')).toBe(false);
    expect(await take('pz', 'p1')).toBe(1);
  });
});

describe('claim-failed-3.lua and release-claims-1.lua', () => {
  it('only the job a failure names claims it, once per job; the record stays (marked) until commit or release', async () => {
    const rec = (job: string): string => JSON.stringify({ reason: 'HTTP 500', status: 500, attempts: 3, job });
    await r.hset(keys.failed('cl'), 'a', rec('j1'), 'b', rec('j2'), 'c', rec('j1'), 'd', 'not json');
    await r.hset(keys.attempts('cl'), 'a', 2);
    await r.sadd(keys.done('cl'), 'c');
    const claim = (job: string, ...ids: string[]): Promise<number[]> =>
      r.claimFailed(keys.done('cl'), keys.failed('cl'), keys.attempts('cl'), job, ...ids);
    expect(await claim('j1', 'a', 'b', 'c', 'd', 'e')).toEqual([1, -2, 0, -2, -1]);
    expect(JSON.parse((await r.hget(keys.failed('cl'), 'a')) ?? '{}')).toMatchObject({
      job: 'j1',
      retrying: true,
      status: 500,
    });
    expect(await r.hexists(keys.attempts('cl'), 'a')).toBe(0);
    // The same job claims again after a hand-back; attempts spent since the first claim stay.
    await r.hset(keys.attempts('cl'), 'a', 1);
    expect(await claim('j1', 'a')).toEqual([1]);
    expect(await r.hget(keys.attempts('cl'), 'a')).toBe('1');
    expect(await claim('j2', 'a')).toEqual([-2]);
    // Release drops only this job's claimed records.
    expect(await r.releaseClaims(keys.failed('cl'), 'j2', 'a', 'b')).toBe(0);
    expect(await r.releaseClaims(keys.failed('cl'), 'j1', 'a', 'b')).toBe(1);
    expect((await r.hkeys(keys.failed('cl'))).sort()).toEqual(['b', 'c', 'd']);
  });
});

describe('retry-failed-4.lua with the queue prefix', () => {
  it('leaves failures carried by a failed job or claimed by a running retry; gives back the rest', async () => {
    const ds = 'rf';
    const q = keys.queuePrefix(ds);
    const rec = (job: string | undefined, retrying = false): string =>
      JSON.stringify({ reason: 'x', ...(job === undefined ? {} : { job }), ...(retrying ? { retrying: true } : {}) });
    // jf: a failed job; ja: an active job (first delivery, or a retry running); jc: completed; jx: removed.
    for (const j of ['jf', 'ja', 'jc']) await r.hset(q + j, 'name', j);
    await r.zadd(q + 'failed', 1, 'jf');
    await r.zadd(q + 'completed', 1, 'jc');
    await r.hset(
      keys.failed(ds),
      'legacy',
      rec(undefined),
      'inFailedJob',
      rec('jf'),
      'firstDelivery',
      rec('ja'),
      'claimedRunning',
      rec('ja', true),
      'claimedCompleted',
      rec('jc', true),
      'removed',
      rec('jx'),
    );
    const n = await r.retryFailed(keys.failed(ds), keys.attempts(ds), keys.stats(ds), keys.producer(ds), q);
    expect(n).toBe(4);
    expect((await r.hkeys(keys.failed(ds))).sort()).toEqual(['claimedRunning', 'inFailedJob']);
    expect(await r.hget(keys.producer(ds), 'retryGen')).toBe('1');
  });
});
