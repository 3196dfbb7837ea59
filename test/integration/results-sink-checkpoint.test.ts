// The results sink's recovery trusts the part files: a missing checkpoint is rebuilt from them,
// never answered by truncating lines that are no longer in Redis (issue 7, defect 3).
import { appendFileSync, readFileSync, rmSync, statSync, truncateSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RunKeys } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates } from '../helpers/pipeline.js';
import { type TestRedis } from '../helpers/redis.js';
import { commitResult, datasetStats, drainOnce, readParts, startSink } from '../helpers/results-sink.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true });

function setup(run: string): { keys: RunKeys; dir: string; conn: ReturnType<TestRedis['connection']> } {
  return {
    keys: new RunKeys(redis.prefix, run),
    dir: path.join(tmp.dir, run, 'ds', 'generations'),
    conn: redis.connection(),
  };
}

async function commitMany(conn: ReturnType<TestRedis['connection']>, keys: RunKeys, ids: string[]): Promise<void> {
  for (const [i, id] of ids.entries()) expect(await commitResult(conn, keys, 'ds', id, 5 + i)).toBe(1);
}

describe('results sink recovery without a checkpoint', () => {
  it('keeps every part file as it is, rebuilds the checkpoint from them and goes on appending', async () => {
    const { keys, dir, conn } = setup('nocp');
    const first = Array.from({ length: 8 }, (_, i) => `a${i}`);
    await commitMany(conn, keys, first);
    // Small parts: the 8 lines span several files.
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir, maxPartBytes: 200, readCount: 2 });
    const before = readParts(dir).map((r) => r.id);
    expect(before).toEqual(first);
    const part0 = statSync(path.join(dir, 'part-00000.jsonl')).size;
    expect(part0).toBeGreaterThan(0);
    // A copy that skipped dotfiles.
    rmSync(path.join(dir, '.sink-checkpoint.json'));
    const more = ['b0', 'b1', 'b2'];
    await commitMany(conn, keys, more);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir, maxPartBytes: 200, readCount: 2 });
    expect(statSync(path.join(dir, 'part-00000.jsonl')).size).toBe(part0);
    const lines = readParts(dir);
    expect(lines.map((r) => r.id)).toEqual([...first, ...more]);
    const stats = await datasetStats(conn, keys, 'ds');
    expect(stats.records).toBe(lines.length);
    expect(stats.outputTokens).toBe(lines.reduce((a, r) => a + r.completion_tokens, 0));
    expect(await conn.xlen(keys.results('ds'))).toBe(0);
    const cp = JSON.parse(readFileSync(path.join(dir, '.sink-checkpoint.json'), 'utf8')) as { records: number };
    expect(cp.records).toBe(lines.length);
  });

  it('cuts an incomplete last line only when its result is still in Redis, and writes that result once', async () => {
    const { keys, dir, conn } = setup('torn');
    await commitMany(conn, keys, ['t0', 't1', 't2']);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    await commitResult(conn, keys, 'ds', 't3', 7);
    rmSync(path.join(dir, '.sink-checkpoint.json'));
    // A crash mid-write: the first bytes of t3's line, no newline.
    const record = (await conn.xrange(keys.results('ds'), '-', '+'))[0]?.[1][1] ?? '';
    expect(record).toContain('"t3"');
    appendFileSync(path.join(dir, 'part-00000.jsonl'), record.slice(0, 40));
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    const lines = readParts(dir);
    expect(lines.map((r) => r.id)).toEqual(['t0', 't1', 't2', 't3']);
    expect(duplicates(lines.map((r) => r.id))).toEqual([]);
  });

  it('refuses to cut an incomplete last line whose result is no longer in Redis, naming the file', async () => {
    const { keys, dir, conn } = setup('torn-lost');
    await commitMany(conn, keys, ['u0', 'u1']);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    rmSync(path.join(dir, '.sink-checkpoint.json'));
    const file = path.join(dir, 'part-00000.jsonl');
    appendFileSync(file, '{"id":"u1","dataset":"ds","prompt_ids":[1,2');
    const size = statSync(file).size;
    await expect(startSink({ redis: conn, keys, dataset: 'ds', dir })).rejects.toThrow(
      new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} ends with an incomplete line.*u1`),
    );
    expect(statSync(file).size).toBe(size);
    // The lock was given back: a sink can start once the file is repaired.
    truncateSync(file, size - '{"id":"u1","dataset":"ds","prompt_ids":[1,2'.length);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    expect(readParts(dir).map((r) => r.id)).toEqual(['u0', 'u1']);
  });
});

describe('results sink recovery with a checkpoint', () => {
  it('refuses to start when a part is shorter than its checkpoint says, naming the file, and changes nothing', async () => {
    const { keys, dir, conn } = setup('shrunk');
    await commitMany(conn, keys, ['v0', 'v1', 'v2', 'v3']);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    const file = path.join(dir, 'part-00000.jsonl');
    const size = statSync(file).size;
    truncateSync(file, Math.floor(size / 2));
    await commitResult(conn, keys, 'ds', 'v4', 3);
    await expect(startSink({ redis: conn, keys, dataset: 'ds', dir })).rejects.toThrow(
      `${file} is ${Math.floor(size / 2)} bytes but the sink checkpoint`,
    );
    expect(statSync(file).size).toBe(Math.floor(size / 2));
    expect(await conn.xlen(keys.results('ds'))).toBe(1);
  });

  it('keeps complete lines written after the checkpoint (a crash before it) and does not write their results again', async () => {
    const { keys, dir, conn } = setup('adopt');
    await commitMany(conn, keys, ['w0', 'w1']);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    const cpPath = path.join(dir, '.sink-checkpoint.json');
    const cp = readFileSync(cpPath, 'utf8');
    await commitMany(conn, keys, ['w2', 'w3']);
    // A sink that wrote and fsynced w2, w3 and died before its checkpoint and trim.
    const entries = await conn.xrange(keys.results('ds'), '-', '+');
    appendFileSync(path.join(dir, 'part-00000.jsonl'), entries.map(([, f]) => `${f[1] ?? ''}\n`).join(''));
    expect(readFileSync(cpPath, 'utf8')).toBe(cp);
    await drainOnce({ redis: conn, keys, dataset: 'ds', dir });
    const lines = readParts(dir);
    expect(lines.map((r) => r.id)).toEqual(['w0', 'w1', 'w2', 'w3']);
    const stats = await datasetStats(conn, keys, 'ds');
    expect(stats.outputTokens).toBe(lines.reduce((a, r) => a + r.completion_tokens, 0));
    expect(await conn.xlen(keys.results('ds'))).toBe(0);
  });
});
