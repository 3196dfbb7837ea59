// Chaos: 5,500 prompts over two datasets (one with a token budget), producer and three
// workers as separate processes on a real Redis. A worker is killed with SIGKILL every few
// seconds for a minute and the producer once, while the server answers 503 "queue full" to
// the first try of 5 % of prompts and 500 to 2 % of all requests. Every dataset must end
// completed with nothing lost, nothing written twice, counters equal to the files, no prompt
// failed, and never more requests at the server than the configured cap.
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RunKeys } from '../../src/shared/index.js';
import { testDataset, writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, writePrompts, type CliProcess } from '../helpers/pipeline.js';

const CONCURRENCY = 24;
const A_PROMPTS = 3_000;
const B_PROMPTS = 2_500;
const B_BUDGET = 150_000;

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 20,
    maxRunningRequests: 128,
    seed: 51,
    outputLength: { distribution: 'lognormal', mean: 350, sigma: 0.6 },
    faults: { firstTry503Rate: 0.05, errorRate: 0.02 },
  },
  tmp: true,
  cli: true,
});

describe('chaos', () => {
  it('workers SIGKILLed every few seconds for a minute, the producer once, 503s and 5xx throughout: completed, 0 lost, 0 duplicates, 0 failed, the cap held', async () => {
    writePrompts(tmp.dir, 'A', A_PROMPTS);
    writePrompts(tmp.dir, 'B', B_PROMPTS);
    const configPath = writeTestConfig(tmp.dir, {
      run: 'chaos',
      redis,
      sim,
      // 5 attempts: with 2 % 500s, a prompt failing 5 times in a row is ~3e-9.
      sglang: { concurrency: CONCURRENCY, requestTimeoutMs: 30_000, maxAttempts: 5, healthCheckIntervalMs: 500 },
      datasets: [
        testDataset('A', { name: 'A', maxNewTokens: 4096, batchSize: 16 }),
        testDataset('B', { name: 'B', tokenBudget: B_BUDGET, maxNewTokens: 4096, batchSize: 16 }),
      ],
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000, leaseTtlMs: 1_500, shutdownGraceMs: 1_000 },
    });
    const runDir = path.join(tmp.dir, 'out', 'chaos');
    const keys = new RunKeys(redis.prefix, 'chaos');
    const conn = redis.connection('client');
    const records = async (ds: string): Promise<number> => Number((await conn.hget(keys.stats(ds), 'records')) ?? 0);

    let producer: CliProcess = spawnCli(['produce', '-c', configPath]);
    const workers: CliProcess[] = [0, 1, 2].map(() => spawnCli(['worker', '-c', configPath]));
    let workerKills = 0;
    let producerKilled = false;
    try {
      await waitFor(async () => (await records('A')) >= 50, 'first commits', 90_000).catch((e: unknown) => {
        throw new Error(
          `${String(e)}\nproducer: ${producer.output().slice(-2_000)}\nworker: ${workers[0]?.output().slice(-2_000) ?? ''}`,
        );
      });
      const chaosUntil = Date.now() + 60_000;
      let turn = 0;
      while (Date.now() < chaosUntil && (await records('A')) < A_PROMPTS) {
        await new Promise((r) => setTimeout(r, 3_000 + (turn % 3) * 500));
        const i = turn % workers.length;
        const victim = workers[i];
        if (victim !== undefined) {
          victim.child.kill('SIGKILL');
          await victim.exited;
          workerKills += 1;
          workers[i] = spawnCli(['worker', '-c', configPath]);
        }
        if (!producerKilled && turn === 4) {
          producer.child.kill('SIGKILL');
          await producer.exited;
          producerKilled = true;
          producer = spawnCli(['produce', '-c', configPath]);
        }
        turn += 1;
      }
      const code = await Promise.race([producer.exited, new Promise((r) => setTimeout(() => r('timeout'), 120_000))]);
      expect(code, producer.output().slice(-3_000)).toBe(0);
    } finally {
      for (const w of workers) w.child.kill('SIGTERM');
      await Promise.all(workers.map((w) => w.exited));
    }
    expect(workerKills).toBeGreaterThanOrEqual(5);
    expect(producerKilled).toBe(true);

    for (const ds of ['A', 'B']) {
      const out = readGenerations(runDir, ds);
      const stats = await conn.hgetall(keys.stats(ds));
      expect(stats.status, ds).toBe('completed');
      expect(duplicates(out.map((r) => r.id)), ds).toEqual([]);
      expect(Number(stats.records), ds).toBe(out.length);
      expect(
        out.reduce((a, r) => a + r.completion_tokens, 0),
        ds,
      ).toBe(Number(stats.outputTokens));
      expect(await conn.hlen(keys.failed(ds)), ds).toBe(0);
      expect(await conn.xlen(keys.results(ds)), ds).toBe(0);
    }
    // A: every prompt, once. B: stopped by its budget, within reason.
    expect(
      readGenerations(runDir, 'A')
        .map((r) => r.id)
        .sort(),
    ).toEqual(Array.from({ length: A_PROMPTS }, (_, i) => `A-${i}`).sort());
    const bTokens = Number(await conn.hget(keys.stats('B'), 'outputTokens'));
    expect(bTokens).toBeGreaterThanOrEqual(B_BUDGET);
    expect(bTokens).toBeLessThan(B_BUDGET * 1.5);
    expect(sim.stats().maxRunningObserved).toBeLessThanOrEqual(CONCURRENCY);
  }, 300_000);
});
