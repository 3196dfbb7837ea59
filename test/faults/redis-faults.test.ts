// Redis itself fails under a running pipeline: frozen (SIGSTOP) past every lease and lock TTL,
// and killed with SIGKILL then restarted on the same AOF. Producer and workers are real child
// processes; the SGLang simulator counts how many requests ever ran at once.
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { EmbeddedRedis, RunKeys, createRedisConnection, closeRedisConnection } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';
import { duplicates, isProcessAlive, readGenerations, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, startSim } = useHarness({ redis: true, tmp: true, cli: true });
const CONCURRENCY = 8;

function setup(
  run: string,
  prompts: number,
  url: string,
  endpoint: string,
): { configPath: string; runDir: string; keys: RunKeys; ids: string[] } {
  writePrompts(tmp.dir, run, prompts);
  return {
    configPath: writeTestConfig(tmp.dir, {
      run,
      redis: { url, prefix: redis.prefix },
      sim: endpoint,
      sglang: { concurrency: CONCURRENCY, maxAttempts: 2 },
      dataset: { maxNewTokens: 4096, batchSize: 4 },
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000, leaseTtlMs: 1_000, shutdownGraceMs: 2_000 },
    }),
    runDir: path.join(tmp.dir, 'out', run),
    keys: new RunKeys(redis.prefix, run),
    ids: Array.from({ length: prompts }, (_, i) => `${run}-${i}`),
  };
}

async function expectExactlyOnce(url: string, runDir: string, keys: RunKeys, ids: string[]): Promise<void> {
  const conn = createRedisConnection(url, { role: 'client', name: 'tokenmill:test', logger: quietLogger() });
  try {
    const records = readGenerations(runDir, 'ds');
    expect(duplicates(records.map((r) => r.id))).toEqual([]);
    expect(records.map((r) => r.id).sort()).toEqual([...ids].sort());
    const stats = await conn.hgetall(keys.stats('ds'));
    expect(Number(stats.records)).toBe(ids.length);
    expect(records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(Number(stats.outputTokens));
    expect(await conn.hlen(keys.failed('ds'))).toBe(0);
  } finally {
    await closeRedisConnection(conn);
  }
}

/**
 * Freezes Redis (SIGSTOP) for 4 s once `when` holds (requests running at the server, records
 * committed), with two worker processes and a producer running: longer than the lease TTL
 * (1 s) and the batch lock (2 s), so everything lapses at once. Before the leases can lapse,
 * each worker aborts what it runs (the fence): when Redis comes back, a slot swept by another
 * worker's acquire has nothing running on it. The run must complete, each prompt once, the cap
 * held throughout.
 */
async function freezeRun(
  run: string,
  seed: number,
  when: (running: number, records: number) => boolean,
  what: string,
): Promise<void> {
  // Requests of several seconds, so that many are running at the sim when Redis comes back.
  const sim = await startSim({
    timeScale: 8,
    maxRunningRequests: 64,
    seed,
    outputLength: { distribution: 'lognormal', mean: 2500, sigma: 0.4 },
  });
  const { configPath, runDir, keys, ids } = setup(run, 48, redis.url, sim.url);
  const conn = redis.connection('client');
  const producer = spawnCli(['produce', '-c', configPath]);
  const w1 = spawnCli(['worker', '-c', configPath]);
  const w2 = spawnCli(['worker', '-c', configPath]);
  try {
    await waitFor(
      async () => when(sim.stats().running, Number((await conn.hget(keys.stats('ds'), 'records')) ?? 0)),
      what,
      90_000,
    );
    const pid = redis.server.pid;
    if (pid === undefined) throw new Error('no redis pid');
    process.kill(pid, 'SIGSTOP');
    // While Redis is frozen the requests in flight finish (their commits wait)…
    const drained = await waitFor(() => sim.stats().running === 0, 'the requests in flight finished', 5_000).then(
      () => true,
      () => false,
    );
    // …and none starts: a window in which nothing may happen (the point of the test).
    await new Promise((r) => setTimeout(r, 1_000));
    const runningInFreeze = sim.stats().running;
    process.kill(pid, 'SIGCONT');
    expect(drained, 'requests in flight finished within 5 s of the freeze').toBe(true);
    expect(runningInFreeze).toBe(0);
    expect(await producer.exited, producer.output()).toBe(0);
  } finally {
    w1.child.kill('SIGTERM');
    w2.child.kill('SIGTERM');
    await Promise.all([w1.exited, w2.exited]);
  }
  expect(sim.stats().maxRunningObserved).toBeLessThanOrEqual(CONCURRENCY);
  await expectExactlyOnce(redis.url, runDir, keys, ids);
}

describe('Redis faults under a running pipeline', () => {
  it('a freeze (SIGSTOP) longer than the lease and lock TTLs: completes, no duplicates, the per-endpoint cap holds', async () => {
    await freezeRun('freeze', 31, (running, records) => running >= CONCURRENCY && records >= 4, 'both workers busy');
  }, 150_000);

  it('the same freeze while the last prompts of the dataset run: their aborted requests are sent again, the run ends', async () => {
    // 48 prompts, 8 slots: from 40 committed on, what runs is the dataset's last prompts.
    await freezeRun(
      'freeze-last',
      33,
      (running, records) => running > 0 && records >= 40 && records < 48,
      'the last prompts running',
    );
  }, 150_000);

  it('redis-server killed with SIGKILL mid-run and restarted on the same AOF: completes, nothing committed is lost, no duplicates', async () => {
    const sim = await startSim({
      timeScale: 20,
      maxRunningRequests: 64,
      seed: 32,
      outputLength: { distribution: 'lognormal', mean: 800, sigma: 0.5 },
    });
    // A server of its own: this test kills it.
    const dataDir = path.join(tmp.dir, 'redis-kill');
    const first = new EmbeddedRedis({ dataDir, logger: quietLogger() });
    const { url, port } = await first.start();
    let second: EmbeddedRedis | undefined;
    const { configPath, runDir, keys, ids } = setup('rkill', 96, url, sim.url);
    const producer = spawnCli(['produce', '-c', configPath]);
    const w1 = spawnCli(['worker', '-c', configPath]);
    const w2 = spawnCli(['worker', '-c', configPath]);
    try {
      const conn = createRedisConnection(url, { role: 'client', name: 'tokenmill:test', logger: quietLogger() });
      let before = 0;
      try {
        await waitFor(
          async () => (before = Number((await conn.hget(keys.stats('ds'), 'records')) ?? 0)) >= 24,
          'first commits',
          60_000,
        );
        // Committed ids before the kill: every one of them must still be committed after it.
        before = await conn.scard(keys.done('ds'));
      } finally {
        await closeRedisConnection(conn).catch(() => undefined);
      }
      const doneBefore = before;
      const pid = first.pid;
      if (pid === undefined) throw new Error('no redis pid');
      process.kill(pid, 'SIGKILL');
      await waitFor(() => !isProcessAlive(pid), 'the killed redis-server gone', 5_000);
      second = new EmbeddedRedis({ dataDir, port, logger: quietLogger() });
      await second.start();
      expect(await producer.exited, producer.output()).toBe(0);
      const after = createRedisConnection(url, { role: 'client', name: 'tokenmill:test', logger: quietLogger() });
      try {
        expect(await after.scard(keys.done('ds'))).toBeGreaterThanOrEqual(doneBefore);
      } finally {
        await closeRedisConnection(after);
      }
    } finally {
      w1.child.kill('SIGTERM');
      w2.child.kill('SIGTERM');
      await Promise.all([w1.exited, w2.exited]);
    }
    await expectExactlyOnce(url, runDir, keys, ids);
    await second?.stop();
    await first.stop().catch(() => undefined);
  }, 150_000);
});
