// `drained()` checks the stream on the probe connection: the sink's own connection is blocked
// in XREAD most of the time, and a check queued behind it waited out the block (the last
// 200 ms of every run).
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RunKeys } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { waitFor } from '../helpers/pipeline.js';
import { commitResult, readParts, startSink } from '../helpers/results-sink.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true });

describe('results sink: drained', () => {
  it('resolves through the probe connection while the sink connection is blocked; waits for entries not yet written', async () => {
    const keys = new RunKeys(redis.prefix, 'drained');
    const dir = path.join(tmp.dir, 'drained', 'ds', 'generations');
    const sinkConn = redis.connection('worker');
    const probe = redis.connection('worker');
    const conn = redis.connection('worker');
    const sink = await startSink({ redis: sinkConn, probe, keys, dataset: 'ds', dir });
    const unblockKey = `${redis.prefix}:drained-test-unblock`;
    let blockReleased = false;
    try {
      for (const id of ['a0', 'a1', 'a2']) await commitResult(conn, keys, 'ds', id, 3);
      await sink.drained();
      expect(readParts(dir).map((r) => r.id)).toEqual(['a0', 'a1', 'a2']);

      // The sink's connection stays blocked until the test releases it.
      const blocked = sinkConn.blpop(unblockKey, 0).then(() => {
        blockReleased = true;
      });
      await waitFor(
        async () => String(await conn.client('LIST')).includes('cmd=blpop'),
        'the sink connection to block',
        10_000,
      );
      await sink.drained();
      expect(blockReleased).toBe(false);

      // An entry the sink has not written yet: drained() waits for it.
      await commitResult(conn, keys, 'ds', 'a3', 3);
      let drained = false;
      const draining = sink.drained().then(() => {
        drained = true;
      });
      await new Promise((r) => setTimeout(r, 50));
      expect(drained).toBe(false);
      await conn.lpush(unblockKey, 'go');
      await blocked;
      await draining;
      expect(readParts(dir).map((r) => r.id)).toEqual(['a0', 'a1', 'a2', 'a3']);
    } finally {
      if (!blockReleased) await conn.lpush(unblockKey, 'go');
      await sink.stop();
      for (const c of [sinkConn, probe, conn]) await c.quit();
    }
  }, 60_000);
});
