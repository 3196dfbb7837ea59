// Power loss with `appendfsync everysec`: Redis loses its last second of writes while the sink's
// lines were fsynced. Commits on disk but gone from Redis are restored; a sample committed a
// second time is not written twice; the counters equal the files (issue 7, defect 9).
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RunKeys } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates } from '../helpers/pipeline.js';
import { commitResult, datasetStats, drainOnce, readParts } from '../helpers/results-sink.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true });

describe('results sink after Redis lost its last writes', () => {
  it('restores lost commits of lines on disk and drops second commits: no duplicates, counters equal the files', async () => {
    const keys = new RunKeys(redis.prefix, 'power');
    const dir = path.join(tmp.dir, 'power', 'ds', 'generations');
    const conn = redis.connection();
    const ids = Array.from({ length: 12 }, (_, i) => `p${i}`);
    const tokens = new Map(ids.map((id, i) => [id, 10 + i]));
    for (const id of ids) expect(await commitResult(conn, keys, 'ds', id, tokens.get(id) ?? 0)).toBe(1);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    expect(readParts(dir).map((r) => r.id)).toEqual(ids);

    // The OS crashed: the last commits vanished from Redis (done set and counters), not from disk.
    const lost = ['p9', 'p10', 'p11'];
    for (const id of lost) {
      const t = tokens.get(id) ?? 0;
      await conn
        .multi()
        .srem(keys.done('ds'), id)
        .hincrby(keys.stats('ds'), 'outputTokens', -t)
        .hincrby(keys.stats('ds'), 'records', -1)
        .hincrby(keys.stats('ds'), 'outputTokensSq', -t * t)
        .exec();
    }
    // Two of them were generated again (other outputs) and committed before the sink restarted.
    expect(await commitResult(conn, keys, 'ds', 'p10', 77)).toBe(1);
    expect(await commitResult(conn, keys, 'ds', 'p11', 3)).toBe(1);
    // And a sample never committed before, to be written normally.
    expect(await commitResult(conn, keys, 'ds', 'p12', 5)).toBe(1);

    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    const lines = readParts(dir);
    expect(duplicates(lines.map((r) => r.id))).toEqual([]);
    expect(lines.map((r) => r.id)).toEqual([...ids, 'p12']);
    const stats = await datasetStats(conn, keys, 'ds');
    expect(stats.records).toBe(lines.length);
    expect(stats.outputTokens).toBe(lines.reduce((a, r) => a + r.completion_tokens, 0));
    expect(stats.outputTokensSq).toBe(lines.reduce((a, r) => a + r.completion_tokens ** 2, 0));
    expect(await conn.xlen(keys.results('ds'))).toBe(0);
    // p9 is done again: generating it once more commits nothing.
    expect(await conn.sismember(keys.done('ds'), 'p9')).toBe(1);
    expect(await commitResult(conn, keys, 'ds', 'p9', 50)).toBe(0);
  });

  it('reconciles only the end of the files: a record older than the window is not looked at', async () => {
    const keys = new RunKeys(redis.prefix, 'window');
    const dir = path.join(tmp.dir, 'window', 'ds', 'generations');
    const conn = redis.connection();
    await commitResult(conn, keys, 'ds', 'w0', 4, { ts: new Date(Date.now() - 3_600_000).toISOString() });
    for (const id of ['w1', 'w2']) await commitResult(conn, keys, 'ds', id, 4);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    // w0 and w2 "vanished" from the done set; w0 is an hour older than the newest record: with a
    // window of 1 min and at least 2 lines read (readCount 1), only w2 and w1 are reconciled.
    await conn.srem(keys.done('ds'), 'w0', 'w2');
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir, readCount: 1, reconcileWindowMs: 60_000 });
    expect(await conn.sismember(keys.done('ds'), 'w2')).toBe(1);
    expect(await conn.sismember(keys.done('ds'), 'w0')).toBe(0);
  });
});
