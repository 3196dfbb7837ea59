// One writer per dataset: the sink lock is a fencing token. A sink whose lock lapsed and was
// taken over writes nothing more and stops; renewal never extends another holder's lock; a
// second sink says who holds the lock while it waits (issue 7, defect 7).
import { spawn } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import { hostname } from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { LockLostError, ProcessLock, RunKeys, type Logger } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, repoRoot, waitFor } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';
import { commitResult, datasetStats, readParts, startSink } from '../helpers/results-sink.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true });
const children: ReturnType<typeof spawn>[] = [];

afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
});

/** A logger whose lines (parsed) are kept in `lines`. */
function capturingLogger(): { logger: Logger; lines: { level: number; msg: string; holder?: string }[] } {
  const lines: { level: number; msg: string; holder?: string }[] = [];
  const dest = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l !== '') lines.push(JSON.parse(l) as (typeof lines)[number]);
      cb();
    },
  });
  return { logger: pino({ level: 'info' }, dest), lines };
}

describe('results sink fencing', () => {
  it('a sink process frozen longer than its lock TTL, then resumed, writes nothing more and exits non-zero', async () => {
    const keys = new RunKeys(redis.prefix, 'frozen');
    const dir = path.join(tmp.dir, 'frozen', 'ds', 'generations');
    const job = { redisUrl: redis.url, prefix: redis.prefix, run: 'frozen', dataset: 'ds', dir, lockTtlMs: 1_000 };
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', path.join(repoRoot, 'test/helpers/results-sink-runner.ts'), JSON.stringify(job)],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    children.push(child);
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | string>((resolve) =>
      child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)),
    );
    const conn = redis.connection();
    let b: Awaited<ReturnType<typeof startSink>> | undefined;
    try {
      await waitFor(() => out.includes('ready'), 'the sink process to start', 30_000);
      for (const id of ['a0', 'a1', 'a2']) await commitResult(conn, keys, 'ds', id, 3);
      await waitFor(() => readParts(dir).length === 3, 'the sink process to write', 10_000);
      child.kill('SIGSTOP');
      await waitFor(async () => (await conn.exists(keys.sinkLock('ds'))) === 0, 'its lock to lapse', 10_000);
      b = await startSink({ redis: redis.connection(), keys, dataset: 'ds', dir, lockTtlMs: 1_000 });
      // The frozen process is blocked on XREAD: these entries reach it when it resumes.
      for (const id of ['b0', 'b1', 'b2', 'b3']) await commitResult(conn, keys, 'ds', id, 3);
      await b.drained();
      child.kill('SIGCONT');
      expect(await exited, out).toBe(3);
      expect(out).toContain('lost the lock');
      for (const id of ['c0', 'c1']) await commitResult(conn, keys, 'ds', id, 3);
      await b.drained();
      const ids = readParts(dir).map((r) => r.id);
      expect(duplicates(ids)).toEqual([]);
      expect(ids.sort()).toEqual(['a0', 'a1', 'a2', 'b0', 'b1', 'b2', 'b3', 'c0', 'c1']);
    } finally {
      child.kill('SIGKILL');
      await b?.stop();
    }
  });

  it('a sink whose lock lapsed and was taken over writes nothing more and stops; the files have no duplicates', async () => {
    const keys = new RunKeys(redis.prefix, 'fence');
    const dir = path.join(tmp.dir, 'fence', 'ds', 'generations');
    // A long TTL: the first sink's renewal does not run during the test, only its fence does.
    const a = await startSink({ redis: redis.connection(), keys, dataset: 'ds', dir, lockTtlMs: 60_000 });
    const b = { sink: undefined as Awaited<ReturnType<typeof startSink>> | undefined };
    try {
      const conn = redis.connection();
      for (const id of ['x0', 'x1', 'x2']) await commitResult(conn, keys, 'ds', id, 4);
      await a.drained();
      // The lock lapses (a Redis outage or a freeze longer than its TTL) and a second sink takes it.
      await conn.del(keys.sinkLock('ds'));
      b.sink = await startSink({ redis: redis.connection(), keys, dataset: 'ds', dir, lockTtlMs: 60_000 });
      const aFailed = a.failed.catch((e: unknown) => e);
      // Both sinks read these entries; only the holder may write them.
      for (const id of ['y0', 'y1', 'y2', 'y3']) await commitResult(conn, keys, 'ds', id, 4);
      await b.sink.drained();
      const err = await aFailed;
      expect(err).toBeInstanceOf(LockLostError);
      expect((err as LockLostError).holder?.token).toBe(await conn.get(keys.sinkLock('ds')));
      await expect(a.drained()).rejects.toBeInstanceOf(LockLostError);
      // More results go to the holder only.
      for (const id of ['z0', 'z1']) await commitResult(conn, keys, 'ds', id, 4);
      await b.sink.drained();
      const ids = readParts(dir).map((r) => r.id);
      expect(duplicates(ids)).toEqual([]);
      expect(ids.sort()).toEqual(['x0', 'x1', 'x2', 'y0', 'y1', 'y2', 'y3', 'z0', 'z1']);
      expect((await datasetStats(conn, keys, 'ds')).records).toBe(ids.length);
    } finally {
      await a.stop();
      await b.sink?.stop();
    }
  });

  it('a part file that changed under a running sink (a late write of a stale sink) is recovered from, not written over', async () => {
    const keys = new RunKeys(redis.prefix, 'changed');
    const dir = path.join(tmp.dir, 'changed', 'ds', 'generations');
    const conn = redis.connection();
    const sink = await startSink({ redis: redis.connection(), keys, dataset: 'ds', dir });
    try {
      await commitResult(conn, keys, 'ds', 'f0', 2);
      await sink.drained();
      // Complete lines appended by another writer: kept, counted, and their samples done.
      const line = readParts(dir)[0];
      appendFileSync(
        path.join(dir, 'part-00000.jsonl'),
        `${JSON.stringify({ ...line, id: 'f9', completion_tokens: 6 })}\n`,
      );
      await commitResult(conn, keys, 'ds', 'f1', 2);
      await waitFor(() => readParts(dir).length === 3, 'f1 to be written after the recovery', 10_000);
      await sink.drained();
    } finally {
      await sink.stop();
    }
    const lines = readParts(dir);
    expect(lines.map((r) => r.id)).toEqual(['f0', 'f9', 'f1']);
    const stats = await datasetStats(conn, keys, 'ds');
    expect(stats.records).toBe(3);
    expect(stats.outputTokens).toBe(10);
    expect(await conn.sismember(keys.done('ds'), 'f9')).toBe(1);
  });

  it('renewal is compare-and-set: it never extends a lock another process took, and reports the loss', async () => {
    const key = `${redis.prefix}:renew-cas`;
    const conn = redis.connection();
    const lock = new ProcessLock(conn, key, 300, quietLogger());
    const lost: LockLostError[] = [];
    lock.onLost((e) => lost.push(e));
    expect(await lock.tryAcquire()).toBe(true);
    // Its lock lapsed meanwhile and another process holds the key now, for 600 ms.
    const other = `elsewhere:4242:${Date.now()}:abcd`;
    await conn.set(key, other, 'PX', 600);
    await waitFor(() => lost.length > 0, 'the loss to be noticed', 3_000);
    expect(lock.lost).toBe(true);
    expect(lost[0]?.holder?.host).toBe('elsewhere');
    expect(lost[0]?.message).toContain('elsewhere:4242 since');
    // Not renewed by the old holder: it expires on its own.
    await waitFor(async () => (await conn.exists(key)) === 0, "the other holder's key to expire", 3_000);
    await expect(lock.confirm()).rejects.toBeInstanceOf(LockLostError);
    await lock.release();
  });

  it('a second sink says who holds the lock, at warn level and again while it waits, then takes over when it is released', async () => {
    const keys = new RunKeys(redis.prefix, 'second');
    const dir = path.join(tmp.dir, 'second', 'ds', 'generations');
    const a = await startSink({ redis: redis.connection(), keys, dataset: 'ds', dir });
    const { logger, lines } = capturingLogger();
    const starting = startSink({ redis: redis.connection(), keys, dataset: 'ds', dir, waitReportMs: 150, logger });
    try {
      await waitFor(
        () => lines.filter((l) => l.level === 40 && l.msg.includes('another process writes its results')).length >= 2,
        'two reports of the holder',
        10_000,
      );
      const report = lines.find((l) => l.level === 40) ?? { msg: '' };
      expect(report.msg).toContain(`${hostname()}:${process.pid} since `);
      expect(report.msg).toContain('dataset ds');
    } finally {
      await a.stop();
    }
    const b = await starting;
    await commitResult(redis.connection(), keys, 'ds', 'q0', 2);
    await b.drained();
    await b.stop();
    expect(readParts(dir).map((r) => r.id)).toEqual(['q0']);
  });
});
