// Committing results in groups (CommitBatcher): one pipeline per group, each result still
// exactly once, commands riding on a group run after its commits, and a group that cannot
// reach Redis fails every commit in it (and tells its rider).
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { RunKeys, withScripts, type ScriptedRedis } from '../../src/shared/index.js';
import { CommitBatcher, type FinishedRequest } from '../../src/workers/inference/sample-records.js';
import { useHarness } from '../helpers/fixture.js';

const ENDPOINT = 'http://127.0.0.1:1';

function finished(
  keys: RunKeys,
  dataset: string,
  id: string,
  tokens: number,
  rid: string,
  endpoint = ENDPOINT,
): FinishedRequest {
  return {
    req: {
      dataset,
      sample: { id, line: 1, promptIds: [1, 2, 3], maxNewTokens: 64 },
      sampling: {},
      maxAttempts: 3,
      priorExpectedTokens: 32,
      attemptsSpent: 0,
    },
    rid,
    endpointUrl: endpoint,
    leaseKey: keys.endpointLeases(endpoint),
    workerId: 'test',
    result: {
      outputIds: Array.from({ length: tokens }, (_, i) => i),
      promptTokens: 3,
      completionTokens: tokens,
      finishReason: { type: 'length', length: tokens },
      text: '',
      droppedLeadingIds: 0,
      metaInfo: {},
    },
  };
}

/** Counts the pipelines a connection sends (the round trips of the groups). */
function countPipelines(redis: ScriptedRedis): { count: () => number } {
  let n = 0;
  const original = redis.pipeline.bind(redis);
  redis.pipeline = ((...args: Parameters<typeof original>) => {
    n += 1;
    return original(...args);
  }) as typeof redis.pipeline;
  return { count: () => n };
}

describe('commits in groups', () => {
  const { redis } = useHarness({ redis: true });

  it('results finishing together go in one pipeline; a sample committed twice in the same group counts once', async () => {
    const keys = new RunKeys(redis.prefix, 'groups');
    const conn = withScripts(redis.connection());
    const pipelines = countPipelines(conn);
    const batcher = new CommitBatcher(conn, keys);
    const ds = 'ds';
    const leaseKey = keys.endpointLeases(ENDPOINT);
    const requests: FinishedRequest[] = [];
    for (let i = 0; i < 100; i += 1) requests.push(finished(keys, ds, `p${i}`, 10 + (i % 7), `${ds}/p${i}#a`));
    // Ten samples delivered twice (a re-delivered batch): the second answer comes in the same group.
    for (let i = 0; i < 10; i += 1) requests.push(finished(keys, ds, `p${i}`, 99, `${ds}/p${i}#b`));
    await conn.zadd(leaseKey, ...requests.flatMap((r) => [Date.now() + 60_000, r.rid]));
    await conn.zadd(keys.inflight(ds), ...requests.flatMap((r) => [Date.now() + 60_000, r.rid]));

    const outcomes = await Promise.all(requests.map((r) => batcher.commit(r)));

    expect(outcomes.slice(0, 100).every((o) => o.kind === 'committed')).toBe(true);
    expect(outcomes.slice(100).every((o) => o.kind === 'duplicate')).toBe(true);
    expect(pipelines.count()).toBe(1);
    const expected = requests.slice(0, 100).reduce((a, r) => a + r.result.completionTokens, 0);
    const [tokens, records] = await conn.hmget(keys.stats(ds), 'outputTokens', 'records');
    expect(Number(tokens)).toBe(expected);
    expect(Number(records)).toBe(100);
    expect(await conn.xlen(keys.results(ds))).toBe(100);
    // Every request's leases are released, the duplicates' too.
    expect(await conn.zcard(leaseKey)).toBe(0);
    expect(await conn.zcard(keys.inflight(ds))).toBe(0);
    // The record on disk is the first answer's, never the duplicate's.
    const entries = (await conn.xrange(keys.results(ds), '-', '+')) as [string, string[]][];
    const first = entries
      .map(([, f]) => JSON.parse(f[1] ?? '{}') as { id: string; completion_tokens: number })
      .find((r) => r.id === 'p3');
    expect(first?.completion_tokens).toBe(13);
  });

  it('a group of several datasets and endpoints: one call per dataset and endpoint, each result counted in its own dataset, every lease released', async () => {
    const keys = new RunKeys(redis.prefix, 'mixed');
    const conn = withScripts(redis.connection());
    const pipelines = countPipelines(conn);
    const batcher = new CommitBatcher(conn, keys);
    const endpoints = [ENDPOINT, 'http://127.0.0.1:2'];
    const requests: FinishedRequest[] = [];
    for (let i = 0; i < 40; i += 1) {
      const ds = i % 2 === 0 ? 'even' : 'odd';
      const ep = endpoints[i % 4 < 2 ? 0 : 1] ?? ENDPOINT;
      requests.push(finished(keys, ds, `p${i}`, i + 1, `${ds}/p${i}#a`, ep));
    }
    requests.push(finished(keys, 'odd', 'p1', 50, 'odd/p1#b', endpoints[1])); // a second answer, on the other endpoint
    for (const r of requests) {
      await conn.zadd(r.leaseKey, Date.now() + 60_000, r.rid);
      await conn.zadd(keys.inflight(r.req.dataset), Date.now() + 60_000, r.rid);
    }
    const outcomes = await Promise.all(requests.map((r) => batcher.commit(r)));
    expect(outcomes.map((o) => o.kind)).toEqual([...Array.from({ length: 40 }, () => 'committed'), 'duplicate']);
    expect(pipelines.count()).toBe(1);
    for (const ds of ['even', 'odd']) {
      const mine = requests.slice(0, 40).filter((r) => r.req.dataset === ds);
      const [tokens, records] = await conn.hmget(keys.stats(ds), 'outputTokens', 'records');
      expect(Number(records)).toBe(20);
      expect(Number(tokens)).toBe(mine.reduce((a, r) => a + r.result.completionTokens, 0));
      const ids = ((await conn.xrange(keys.results(ds), '-', '+')) as [string, string[]][]).map(
        ([, f]) => (JSON.parse(f[1] ?? '{}') as { id: string }).id,
      );
      expect(ids.sort()).toEqual(mine.map((r) => r.req.sample.id).sort());
      expect(await conn.zcard(keys.inflight(ds))).toBe(0);
    }
    for (const ep of endpoints) expect(await conn.zcard(keys.endpointLeases(ep))).toBe(0);
  });

  it('commits that arrive while a group is in flight go together in the next one', async () => {
    const keys = new RunKeys(redis.prefix, 'next');
    const conn = withScripts(redis.connection());
    const pipelines = countPipelines(conn);
    const batcher = new CommitBatcher(conn, keys);
    const first = batcher.commit(finished(keys, 'ds', 'a', 5, 'ds/a#1'));
    // Let the first group leave, then finish 50 more while it is on its way.
    await new Promise((r) => setImmediate(r));
    const later = Array.from({ length: 50 }, (_, i) => batcher.commit(finished(keys, 'ds', `b${i}`, 5, `ds/b${i}#1`)));
    const outcomes = await Promise.all([first, ...later]);
    expect(outcomes.every((o) => o.kind === 'committed')).toBe(true);
    expect(pipelines.count()).toBe(2);
    expect(Number(await conn.hget(keys.stats('ds'), 'records'))).toBe(51);
  });

  it("a rider's commands run after the group's commits, in the same round trip: the slots they freed are free", async () => {
    const keys = new RunKeys(redis.prefix, 'rider');
    const conn = withScripts(redis.connection());
    const pipelines = countPipelines(conn);
    const leaseKey = keys.endpointLeases(ENDPOINT);
    const seen: { freed: number; leasesLeft: unknown }[] = [];
    const batcher = new CommitBatcher(conn, keys, (pipeline, freed) => {
      void pipeline.zcard(leaseKey);
      return (replies) => seen.push({ freed, leasesLeft: replies?.[0]?.[1] });
    });
    const requests = Array.from({ length: 8 }, (_, i) => finished(keys, 'ds', `p${i}`, 4, `ds/p${i}#1`));
    await conn.zadd(
      leaseKey,
      ...requests.flatMap((r) => [Date.now() + 60_000, r.rid]),
      Date.now() + 60_000,
      'someone-else',
    );
    await Promise.all(requests.map((r) => batcher.commit(r)));
    expect(pipelines.count()).toBe(1);
    expect(seen).toEqual([{ freed: 8, leasesLeft: 1 }]);
  });

  it('a group that cannot reach Redis fails every commit in it, and its rider is told', async () => {
    const keys = new RunKeys(redis.prefix, 'down');
    const conn = withScripts(
      new Redis(redis.url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, lazyConnect: true }),
    );
    conn.on('error', () => undefined);
    const told: unknown[] = [];
    const batcher = new CommitBatcher(conn, keys, (pipeline) => {
      void pipeline.ping();
      return (replies) => told.push(replies);
    });
    const results = await Promise.allSettled(
      Array.from({ length: 5 }, (_, i) => batcher.commit(finished(keys, 'ds', `p${i}`, 4, `ds/p${i}#1`))),
    );
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    // Told once: the pipeline failed as a whole (null) or each of its commands did.
    expect(told).toHaveLength(1);
    const replies = told[0] as [Error | null, unknown][] | null;
    expect(replies === null || (replies.length === 1 && replies[0]?.[0] instanceof Error)).toBe(true);
    conn.disconnect();
    // Nothing was committed: the samples are sent again and counted then.
    const check = redis.connection('client');
    expect(await check.exists(keys.done('ds'))).toBe(0);
  });
});
