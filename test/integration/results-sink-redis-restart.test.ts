// Redis restarts under a running sink and comes back without its last writes (killed while an
// `appendfsync everysec` write was pending). What it lost is made exact here: the server comes
// back on a copy of its AOF taken earlier. The sink, not restarted, must notice the new server
// and reconcile before writing on: lost commits of lines on disk restored, entries it had
// already written and trimmed (they reappear behind its read position) dropped, a sample
// generated again after the restart not written twice; and it still drains to the end.
import { cpSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { EmbeddedRedis, RunKeys, closeRedisConnection, createRedisConnection } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, isProcessAlive, waitFor } from '../helpers/pipeline.js';
import { startFaultProxy, type FaultProxy } from '../helpers/fault-proxy.js';
import { quietLogger } from '../helpers/redis.js';
import { commitResult, datasetStats, readParts, startSink } from '../helpers/results-sink.js';

const { tmp } = useHarness({ tmp: true });

/** The text of every file of the server's append-only folder. */
function aofText(dataDir: string): string {
  const dir = path.join(dataDir, 'appendonlydir');
  return readdirSync(dir)
    .map((f) => readFileSync(path.join(dir, f), 'latin1'))
    .join('');
}

describe('results sink when Redis restarts under it', () => {
  it('restores what the new server lost, drops what reappeared and what was generated again; drains to the end', async () => {
    const dataDir = path.join(tmp.dir, 'redis');
    const first = new EmbeddedRedis({ dataDir, logger: quietLogger() });
    const { url, port } = await first.start();
    let second: EmbeddedRedis | undefined;
    // The sink reads through a proxy, so that it can be kept from reading for a while.
    const proxy: FaultProxy = await startFaultProxy({ target: { host: '127.0.0.1', port } });
    const keys = new RunKeys('tm-test', 'restart');
    const dir = path.join(tmp.dir, 'out', 'ds', 'generations');
    const sinkConn = createRedisConnection(proxy.url('redis'), {
      role: 'worker',
      name: 'tokenmill:test-sink',
      logger: quietLogger(),
    });
    const conn = createRedisConnection(url, { role: 'worker', name: 'tokenmill:test', logger: quietLogger() });
    const sink = await startSink({ redis: sinkConn, probe: conn, keys, dataset: 'ds', dir });
    try {
      const a = ['a0', 'a1', 'a2', 'a3', 'a4', 'a5'];
      const b = ['b0', 'b1', 'b2', 'b3', 'b4', 'b5'];
      // a*: committed while the sink cannot read them, then the AOF is copied: in the copy they
      // are committed and still in the stream (the sink's trims of them come after the copy).
      await proxy.setMode('blackhole');
      for (const [i, id] of a.entries()) expect(await commitResult(conn, keys, 'ds', id, 10 + i)).toBe(1);
      // The AOF holds the last of them (Redis writes it before its next event loop turn, syncs it once a second).
      await waitFor(() => aofText(dataDir).includes('a5'), 'the a* commits in the AOF', 5_000);
      const snapshot = path.join(tmp.dir, 'aof-copy');
      cpSync(path.join(dataDir, 'appendonlydir'), snapshot, { recursive: true });
      await proxy.setMode('pass');
      // b*: committed and written after the copy: the restarted server has never heard of them.
      for (const [i, id] of b.entries()) expect(await commitResult(conn, keys, 'ds', id, 20 + i)).toBe(1);
      await waitFor(
        async () => readParts(dir).length === 12 && (await conn.xlen(keys.results('ds'))) === 0,
        'all 12 lines written and trimmed',
        20_000,
      );

      const pid = first.pid;
      if (pid === undefined) throw new Error('no redis pid');
      process.kill(pid, 'SIGKILL');
      await waitFor(() => !isProcessAlive(pid), 'the killed redis-server gone', 5_000);
      rmSync(path.join(dataDir, 'appendonlydir'), { recursive: true, force: true });
      cpSync(snapshot, path.join(dataDir, 'appendonlydir'), { recursive: true });
      second = new EmbeddedRedis({ dataDir, port, logger: quietLogger() });
      await second.start();
      // b1 is generated again (its commit was lost) and committed on the new server: accepted
      // if this comes before the sink reconciles, refused after; written once either way.
      await commitResult(conn, keys, 'ds', 'b1', 99);

      await waitFor(
        async () => (await conn.xlen(keys.results('ds'))) === 0 && (await conn.scard(keys.done('ds'))) === 12,
        'the stream drained, every sample done',
        20_000,
      );
      await sink.drained();
      const lines = readParts(dir);
      expect(duplicates(lines.map((r) => r.id))).toEqual([]);
      expect(lines.map((r) => r.id)).toEqual([...a, ...b]);
      expect(lines.find((r) => r.id === 'b1')?.completion_tokens).toBe(21);
      const stats = await datasetStats(conn, keys, 'ds');
      expect(stats.records).toBe(12);
      expect(stats.outputTokens).toBe(lines.reduce((s, r) => s + r.completion_tokens, 0));
      expect(stats.outputTokensSq).toBe(lines.reduce((s, r) => s + r.completion_tokens ** 2, 0));
      // Everything on disk is done again: generating any of it once more commits nothing.
      expect(await commitResult(conn, keys, 'ds', 'b3', 7)).toBe(0);
      expect(await commitResult(conn, keys, 'ds', 'a2', 7)).toBe(0);
    } finally {
      await sink.stop().catch(() => undefined);
      await closeRedisConnection(sinkConn).catch(() => undefined);
      await closeRedisConnection(conn).catch(() => undefined);
      await proxy.close();
      await second?.stop();
      await first.stop().catch(() => undefined);
    }
  }, 90_000);
});
