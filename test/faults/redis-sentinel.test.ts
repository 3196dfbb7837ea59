// Redis that fails over: a primary, a replica and three Sentinels on loopback, a pipeline (producer
// with its sink, two inference workers, real CLI children) configured with `redis.sentinels`. The
// primary is killed with SIGKILL mid-run and the Sentinels promote the replica. The run must
// complete on the new primary with every prompt once in the files, the counters equal to the
// files, no request over the per-endpoint cap at the simulator, and the budget held.
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { RunKeys, closeRedisConnection, createRedisConnection, type ConfigInput } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';
import { startSentinelCluster, type SentinelCluster } from '../helpers/sentinel.js';
import {
  duplicates,
  readGenerations,
  spawnCli,
  waitFor,
  writeConfig,
  writePrompts,
  type CliProcess,
} from '../helpers/pipeline.js';

const CONCURRENCY = 8;
const A_PROMPTS = 160;
const B_PROMPTS = 400;
const B_BUDGET = 40_000;
const MAX_NEW_TOKENS = 2048;

const { sim, tmp } = useHarness({
  sim: {
    timeScale: 20,
    maxRunningRequests: 64,
    seed: 71,
    outputLength: { distribution: 'lognormal', mean: 500, sigma: 0.5 },
  },
  tmp: true,
  cli: true,
});

let cluster: SentinelCluster | undefined;
afterAll(async () => {
  await cluster?.stop();
});

describe('Redis with Sentinel', () => {
  it('the primary killed with SIGKILL mid-run, the replica promoted: completed, each prompt once, counters equal to the files, the cap and the budget held', async () => {
    const c = await startSentinelCluster(path.join(tmp.dir, 'redis'), { downAfterMs: 1_000, failoverTimeoutMs: 5_000 });
    cluster = c;
    const oldPrimaryRunId = await c.runId(c.primary.port);
    writePrompts(tmp.dir, 'A', A_PROMPTS);
    writePrompts(tmp.dir, 'B', B_PROMPTS);
    const prefix = 'tmsent';
    const config: ConfigInput = {
      run: 'failover',
      redis: { sentinels: c.addresses, name: c.name, prefix },
      sglang: {
        endpoints: [sim.url],
        concurrency: CONCURRENCY,
        requestTimeoutMs: 60_000,
        maxAttempts: 3,
        healthCheckIntervalMs: 500,
      },
      datasets: [
        { name: 'A', prompts: 'A.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: MAX_NEW_TOKENS, batchSize: 8 },
        { name: 'B', prompts: 'B.jsonl', tokenBudget: B_BUDGET, maxNewTokens: MAX_NEW_TOKENS, batchSize: 8 },
      ],
      output: { dir: 'out' },
      workers: { lockDurationMs: 3_000, stalledIntervalMs: 1_000, leaseTtlMs: 2_000, shutdownGraceMs: 1_000 },
    };
    const configPath = writeConfig(tmp.dir, config, 'failover.yaml');
    const runDir = path.join(tmp.dir, 'out', 'failover');
    const keys = new RunKeys(prefix, 'failover');
    // The test's own reads go through the Sentinels too.
    const sentinelUrl = `redis-sentinel://${c.addresses.join(',')}/${c.name}`;
    const conn = createRedisConnection(sentinelUrl, { role: 'worker', name: 'tokenmill:test', logger: quietLogger() });
    const records = async (ds: string): Promise<number> => Number((await conn.hget(keys.stats(ds), 'records')) ?? 0);

    const producer: CliProcess = spawnCli(['produce', '-c', configPath]);
    const workers: CliProcess[] = [0, 1].map(() => spawnCli(['worker', '-c', configPath]));
    try {
      await waitFor(
        async () => (await records('A')) >= 30 && sim.stats().running > 0,
        'first commits with requests running',
        120_000,
      ).catch((e: unknown) => {
        throw new Error(
          `${String(e)}\nproducer: ${producer.output().slice(-2_000)}\nworker: ${workers[0]?.output().slice(-2_000) ?? ''}`,
        );
      });
      const committedBeforeKill = await records('A');
      expect(committedBeforeKill).toBeLessThan(A_PROMPTS);
      c.primary.child.kill('SIGKILL');
      await waitFor(
        async () => (await c.masterPort()) === c.replica.port,
        'the Sentinels to promote the replica',
        60_000,
        200,
      );
      // A new primary is a new server to the sink: its run id differs, so it reconciles the files.
      expect(await c.runId(c.replica.port)).not.toBe(oldPrimaryRunId);
      // Work goes on after the switch.
      await waitFor(async () => (await records('A')) > committedBeforeKill, 'commits on the new primary', 60_000);
      const code = await Promise.race([producer.exited, new Promise((r) => setTimeout(() => r('timeout'), 180_000))]);
      expect(code, `producer:\n${producer.output().slice(-4_000)}`).toBe(0);
    } finally {
      for (const w of workers) w.child.kill('SIGTERM');
      await Promise.all(workers.map((w) => w.exited));
    }

    try {
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
      }
      expect(
        readGenerations(runDir, 'A')
          .map((r) => r.id)
          .sort(),
      ).toEqual(Array.from({ length: A_PROMPTS }, (_, i) => `A-${i}`).sort());
      // B ends by its budget: reached, and over it by no more than what the last requests in flight can add.
      const bTokens = Number(await conn.hget(keys.stats('B'), 'outputTokens'));
      expect(bTokens).toBeGreaterThanOrEqual(B_BUDGET);
      expect(bTokens).toBeLessThanOrEqual(B_BUDGET + CONCURRENCY * MAX_NEW_TOKENS);
      expect(readGenerations(runDir, 'B').length).toBeLessThan(B_PROMPTS);
      expect(sim.stats().maxRunningObserved).toBeLessThanOrEqual(CONCURRENCY);
      // `status` reads the finished run through the Sentinels, from the new primary.
      const status = spawnCli(['status', '-c', configPath, '--json']);
      expect(await status.exited, status.output()).toBe(0);
      const printed = JSON.parse(status.stdout().trim().split('\n').at(-1) ?? '{}') as {
        datasets: Array<{ name: string; status: string; records: number }>;
      };
      expect(printed.datasets.map((d) => [d.name, d.status, d.records])).toEqual([
        ['A', 'completed', A_PROMPTS],
        ['B', 'completed', readGenerations(runDir, 'B').length],
      ]);
    } finally {
      await closeRedisConnection(conn);
    }
  }, 300_000);
});
