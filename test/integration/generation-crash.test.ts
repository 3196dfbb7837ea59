// Crash and resume with real processes: the CLI runs as child processes that are SIGKILLed.
import { describe, expect, it } from 'vitest';
import { RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, sampleIdOfRid, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';
import path from 'node:path';

const { redis, sim, tmp } = useHarness({
  redis: true,
  // Slow enough that a kill lands mid-generation: ~1 s per request.
  sim: {
    timeScale: 8,
    maxRunningRequests: 16,
    seed: 11,
    outputLength: { distribution: 'lognormal', mean: 600, sigma: 0.6 },
  },
  tmp: true,
  cli: true,
});

function setup(
  run: string,
  prompts: number,
  shutdownGraceMs = 2_000,
): { configPath: string; runDir: string; keys: RunKeys; ids: string[] } {
  writePrompts(tmp.dir, run, prompts);
  return {
    configPath: writeTestConfig(tmp.dir, {
      run,
      redis,
      sim,
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000, leaseTtlMs: 2_000, shutdownGraceMs },
    }),
    runDir: path.join(tmp.dir, 'out', run),
    keys: new RunKeys(redis.prefix, run),
    ids: Array.from({ length: prompts }, (_, i) => `${run}-${i}`),
  };
}

async function committed(keys: RunKeys): Promise<number> {
  return Number((await redis.connection('client').hget(keys.stats('ds'), 'records')) ?? 0);
}

/** Every prompt written once, the counter equal to the files, nothing left in flight. */
async function expectExactlyOnce(runDir: string, keys: RunKeys, ids: string[]): Promise<void> {
  const conn = redis.connection('client');
  const records = readGenerations(runDir, 'ds');
  expect(duplicates(records.map((r) => r.id))).toEqual([]);
  expect(records.map((r) => r.id).sort()).toEqual([...ids].sort());
  const stats = await conn.hgetall(keys.stats('ds'));
  expect(Number(stats.records)).toBe(ids.length);
  expect(records.reduce((a, r) => a + r.completion_tokens, 0)).toBe(Number(stats.outputTokens));
  expect(await conn.xlen(keys.results('ds'))).toBe(0);
}

describe('generation survives crashes', () => {
  it('a worker killed with SIGKILL mid-generation: its batch returns, committed samples are not sent again', async () => {
    const { configPath, runDir, keys, ids } = setup('killworker', 96);
    const producer = spawnCli(['produce', '-c', configPath]);
    const w1 = spawnCli(['worker', '-c', configPath]);
    await waitFor(async () => (await committed(keys)) >= 16, 'first commits', 60_000);
    w1.child.kill('SIGKILL');
    const killedAt = Date.now();
    expect(await w1.exited).toBe('SIGKILL');
    const before = new Set(
      readGenerations(runDir, 'ds')
        .filter((r) => Date.parse(r.ts) < killedAt - 50)
        .map((r) => r.id),
    );
    const w2 = spawnCli(['worker', '-c', configPath]);
    try {
      expect(await producer.exited, producer.output()).toBe(0);
    } finally {
      w2.child.kill('SIGTERM');
      await w2.exited;
    }
    await expectExactlyOnce(runDir, keys, ids);
    // A sample committed before the kill was sent exactly once.
    const sends = new Map<string, number>();
    for (const r of sim.stats().requests.filter((x) => x.rid.startsWith('ds/killworker-'))) {
      const id = sampleIdOfRid(r.rid);
      sends.set(id, (sends.get(id) ?? 0) + 1);
    }
    expect(before.size).toBeGreaterThan(0);
    for (const id of before) expect(sends.get(id), id).toBe(1);
  }, 120_000);

  it('SIGTERM: the worker stops taking work, aborts what outlives the grace period and hands it back', async () => {
    // A grace period far shorter than a request: whatever is in flight at SIGTERM is aborted.
    const { configPath, runDir, keys, ids } = setup('sigterm', 64, 50);
    const producer = spawnCli(['produce', '-c', configPath]);
    const w1 = spawnCli(['worker', '-c', configPath]);
    await waitFor(async () => (await committed(keys)) >= 8 && sim.stats().running > 0, 'requests in flight', 60_000);
    const abortedBeforeTerm = sim.stats().aborted;
    w1.child.kill('SIGTERM');
    // A clean exit, within the grace period and some margin.
    const t0 = Date.now();
    expect(await w1.exited, w1.output()).toBe(0);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(await redis.connection('client').zcard(keys.inflight('ds'))).toBe(0);
    expect(sim.stats().aborted).toBeGreaterThan(abortedBeforeTerm);
    // Its batches went back to the queue, not to the failed list.
    const failedJobs = await redis.connection('client').zcard(`${keys.bullPrefix}:generate-ds:failed`);
    expect(failedJobs).toBe(0);
    const w2 = spawnCli(['worker', '-c', configPath]);
    try {
      expect(await producer.exited, producer.output()).toBe(0);
    } finally {
      w2.child.kill('SIGTERM');
      expect(await w2.exited).toBe(0);
    }
    await expectExactlyOnce(runDir, keys, ids);
  }, 120_000);

  for (const point of ['after-write', 'after-checkpoint'] as const) {
    it(`a sink killed ${point.replace('-', ' ')} (before Redis is trimmed) neither loses nor duplicates a line`, async () => {
      const { configPath, runDir, keys, ids } = setup(`sink-${point}`, 40);
      const crashed = spawnCli(['run', '-c', configPath, '--crash-at', point]);
      expect(await crashed.exited, crashed.output()).toBe('SIGKILL');
      expect(readGenerations(runDir, 'ds').length).toBeGreaterThan(0);
      const again = spawnCli(['run', '-c', configPath]);
      expect(await again.exited, again.output()).toBe(0);
      await expectExactlyOnce(runDir, keys, ids);
    }, 120_000);
  }

  it('the run process killed and started again finishes with no duplicates and no gaps', async () => {
    const { configPath, runDir, keys, ids } = setup('resume', 80);
    const first = spawnCli(['run', '-c', configPath]);
    await waitFor(async () => (await committed(keys)) >= 20, 'first commits', 60_000);
    first.child.kill('SIGKILL');
    expect(await first.exited).toBe('SIGKILL');
    expect(await committed(keys)).toBeLessThan(ids.length);
    const second = spawnCli(['run', '-c', configPath]);
    expect(await second.exited, second.output()).toBe(0);
    await expectExactlyOnce(runDir, keys, ids);
  }, 120_000);
});
