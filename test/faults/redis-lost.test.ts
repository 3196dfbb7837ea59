// Redis lost entirely (a new, empty server; a deleted AOF) between two `run`s of the same run:
// the generation files are the truth. The second `run` rebuilds the committed ids and the
// token counters from them before anything is sent: no sample on disk is requested again,
// the counters equal the files, and the run completes with every prompt once.
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { closeRedisConnection, createRedisConnection, EmbeddedRedis, RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, sampleIdOfRid, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';

const { sim, tmp } = useHarness({
  // Short answers, fast: more records than the sink's end-of-files check reads (2,000 lines).
  sim: {
    timeScale: 15,
    maxRunningRequests: 64,
    seed: 83,
    outputLength: { distribution: 'lognormal', mean: 40, sigma: 0.5 },
  },
  tmp: true,
  cli: true,
});

/** Moves the `ts` of every record but the last `keep` back by `byMs`, keeping each line's length. */
function ageRecords(dir: string, keep: number, byMs: number): void {
  const parts = readdirSync(dir)
    .filter((f) => f.endsWith('.jsonl'))
    .sort();
  const total = parts.reduce(
    (n, f) =>
      n +
      readFileSync(path.join(dir, f), 'utf8')
        .split('\n')
        .filter((l) => l !== '').length,
    0,
  );
  let seen = 0;
  for (const f of parts) {
    const file = path.join(dir, f);
    const lines = readFileSync(file, 'utf8').split('\n');
    const aged = lines.map((l) => {
      if (l === '') return l;
      seen += 1;
      if (seen > total - keep) return l;
      return l.replace(/"ts":"([^"]+)"/, (_, ts: string) => `"ts":"${new Date(Date.parse(ts) - byMs).toISOString()}"`);
    });
    writeFileSync(file, aged.join('\n'));
  }
}

describe('Redis lost entirely', () => {
  it('a run resumed on an empty Redis rebuilds from its files: nothing on disk is generated again, counters equal the files', async () => {
    const dataDir = path.join(tmp.dir, 'redis');
    let server = new EmbeddedRedis({ dataDir, logger: quietLogger() });
    const { url, port } = await server.start();
    try {
      const run = 'lost';
      const prompts = 3_000;
      writePrompts(tmp.dir, run, prompts);
      const configPath = writeTestConfig(tmp.dir, {
        run,
        redis: { url, prefix: 'tm-lost' },
        sim,
        sglang: { concurrency: 64 },
        dataset: { maxNewTokens: 256, batchSize: 64 },
        workers: { shutdownGraceMs: 1_000 },
      });
      const runDir = path.join(tmp.dir, 'out', run);
      const keys = new RunKeys('tm-lost', run);

      // 1. Part of the prompts generated, then the run stopped.
      const first = spawnCli(['run', '-c', configPath]);
      await waitFor(() => readGenerations(runDir, 'ds').length >= 2_300, 'a part of the prompts on disk', 150_000, 500);
      first.child.kill('SIGTERM');
      expect(await first.exited, first.output().slice(-2_000)).toBe(143);
      const onDisk = new Set(readGenerations(runDir, 'ds').map((r) => r.id));
      expect(onDisk.size).toBeGreaterThanOrEqual(2_300);
      expect(onDisk.size).toBeLessThan(prompts);

      // A run that went on for hours: all but its last 100 records an hour old (same byte length).
      ageRecords(path.join(runDir, 'ds', 'generations'), 100, 3_600_000);

      // 2. Redis lost: stopped, its AOF deleted, a new empty server on the same port.
      await server.stop();
      rmSync(dataDir, { recursive: true, force: true });
      server = new EmbeddedRedis({ dataDir, port, logger: quietLogger() });
      await server.start();
      const check = createRedisConnection(url, { role: 'client', name: 'tokenmill:test', logger: quietLogger() });
      try {
        expect(await check.dbsize()).toBe(0);
      } finally {
        await closeRedisConnection(check);
      }
      const sentBefore = sim.stats().requests.length;

      // 3. The same run again: rebuilt from the files, then completed.
      const second = spawnCli(['run', '-c', configPath]);
      expect(await second.exited, second.output().slice(-3_000)).toBe(0);

      const resent = sim
        .stats()
        .requests.slice(sentBefore)
        .map((r) => sampleIdOfRid(r.rid))
        .filter((id) => onDisk.has(id));
      expect(resent, 'samples on disk requested again').toEqual([]);
      expect(second.output()).toMatch(/rebuilt \d+ committed ids and \d+ output tokens from the files/);

      const records = readGenerations(runDir, 'ds');
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(records.map((r) => r.id).sort()).toEqual(Array.from({ length: prompts }, (_, i) => `${run}-${i}`).sort());
      const conn = createRedisConnection(url, { role: 'client', name: 'tokenmill:test', logger: quietLogger() });
      try {
        const stats = await conn.hgetall(keys.stats('ds'));
        expect(Number(stats['records'])).toBe(prompts);
        expect(Number(stats['outputTokens'])).toBe(records.reduce((a, r) => a + r.completion_tokens, 0));
        expect(await conn.scard(keys.done('ds'))).toBe(prompts);
      } finally {
        await closeRedisConnection(conn);
      }
    } finally {
      await server.stop().catch(() => undefined);
    }
  }, 240_000);
});
