// sglang.concurrency: auto across worker processes: two `tokenmill worker` processes share one
// endpoint, exactly one steers it (the holder of its steering lease), the other takes over when
// the first is killed, and `status` (table and JSON) shows the value chosen and who chose it.
import { hostname } from 'node:os';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  RunKeys,
  endpointConcurrencyKey,
  endpointConcurrencyLeaseKey,
  parseEndpointConcurrency,
  type RunStatus,
} from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor, writePrompts, type CliProcess } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 20,
    maxRunningRequests: 16,
    seed: 4,
    outputLength: { distribution: 'lognormal', mean: 1500, sigma: 0.5 },
  },
  tmp: true,
  cli: true,
});
let configPath: string;

beforeAll(() => {
  writePrompts(tmp.dir, 'steer', 3_000);
  configPath = writeTestConfig(tmp.dir, {
    run: 'steer',
    redis,
    sim,
    sglang: {
      concurrency: 'auto',
      autoConcurrency: { min: 2, max: 64, start: 4, intervalMs: 800, maxQueued: 2 },
      requestTimeoutMs: 60_000,
    },
    datasets: [{ name: 'steer', prompts: 'steer.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 8192, batchSize: 8 }],
    workers: { shutdownGraceMs: 500 },
  });
});

async function cli(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  if (code !== 0) throw new Error(`tokenmill ${args.join(' ')} exited ${code}:\n${p.output()}`);
  return p.output();
}

function idOf(p: CliProcess): string {
  return `${hostname()}:${p.child.pid ?? '?'}`;
}

describe('sglang.concurrency: auto with two worker processes', () => {
  it('one worker steers the endpoint; when it is killed the other takes over; status shows the value', async () => {
    const conn = redis.connection('client');
    const keys = new RunKeys(redis.prefix, 'steer');
    const record = async (): Promise<ReturnType<typeof parseEndpointConcurrency>> =>
      parseEndpointConcurrency(await conn.hgetall(endpointConcurrencyKey(keys, sim.url)));
    const leaseKey = endpointConcurrencyLeaseKey(keys, sim.url);

    const producer = spawnCli(['produce', '-c', configPath]);
    const a = spawnCli(['worker', '--role', 'inference', '-c', configPath]);
    await waitFor(async () => (await record())?.controller === idOf(a), `worker A (${idOf(a)}) steering`, 60_000, 100);
    const b = spawnCli(['worker', '--role', 'inference', '-c', configPath]);
    // B is up and sending requests under the same cap.
    await waitFor(
      async () => Object.keys(await conn.hgetall(keys.endpointHealth())).some((f) => f.startsWith(`${idOf(b)} `)),
      'worker B reporting',
      60_000,
      100,
    );

    // While both live, every write comes from A and A holds the lease.
    const writes = new Set<number>();
    const deadline = Date.now() + 3_000;
    while (Date.now() < deadline) {
      const r = await record();
      expect(r?.controller).toBe(idOf(a));
      expect(await conn.get(leaseKey)).toMatch(new RegExp(`^${idOf(a)}:`));
      if (r !== undefined) writes.add(r.updatedMs);
      // The workers together keep at most the chosen number in flight (a lowered cap may still be draining).
      const leases = await conn.zcard(keys.endpointLeases(sim.url));
      expect(leases).toBeLessThanOrEqual(64);
      await new Promise((res) => setTimeout(res, 100));
    }
    expect(writes.size).toBeGreaterThanOrEqual(2);

    a.child.kill('SIGKILL');
    await a.exited;
    const killedAt = Date.now();
    const taken = await waitFor(
      async () => {
        const r = await record();
        return r?.controller === idOf(b) ? r : undefined;
      },
      `worker B (${idOf(b)}) taking over`,
      30_000,
      50,
    );
    // The lease lapses within its TTL (2 s for these windows), then B takes it on its next sample.
    expect(Date.now() - killedAt).toBeLessThan(10_000);
    expect(taken?.reason).toBe('resumed from the last value chosen');
    expect(await conn.get(leaseKey)).toMatch(new RegExp(`^${idOf(b)}:`));

    const table = await cli(['status', '-c', configPath]);
    expect(table).toMatch(new RegExp(`${sim.url.replace(/[.:/]/g, '\\$&')}: concurrency auto \\d+ \\(`));
    const json = JSON.parse(
      (await cli(['status', '-c', configPath, '--json'])).trim().split('\n').at(-1) ?? '{}',
    ) as RunStatus;
    const shown = json.endpoints.endpoints[0]?.concurrency;
    expect(shown?.controller).toBe(idOf(b));
    expect(shown?.cap).toBeGreaterThanOrEqual(2);
    expect(shown?.cap).toBeLessThanOrEqual(64);

    // A clean stop hands the lease back at once.
    b.child.kill('SIGTERM');
    expect(await b.exited).toBe(0);
    expect(await conn.get(leaseKey)).toBeNull();
    producer.child.kill('SIGTERM');
    await producer.exited;
  }, 180_000);
});
