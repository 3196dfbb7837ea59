// One producer per run: a second one fails at once and names the holder; a producer whose lock
// was taken over (after a Redis outage or a freeze longer than its TTL) stops feeding and exits
// non-zero instead of feeding the queues alongside the new holder.
import { describe, expect, it } from 'vitest';
import { RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 5,
    maxRunningRequests: 8,
    seed: 71,
    outputLength: { distribution: 'lognormal', mean: 800, sigma: 0.4 },
  },
  tmp: true,
  cli: true,
});

function setup(run: string): { configPath: string; keys: RunKeys } {
  writePrompts(tmp.dir, run, 400);
  const configPath = writeTestConfig(tmp.dir, { run, redis, sim, sglang: { concurrency: 8 } });
  return { configPath, keys: new RunKeys(redis.prefix, run) };
}

describe('the producer lock', () => {
  it('a second `produce` on the same run fails at once, naming the process that holds the lock', async () => {
    const { configPath, keys } = setup('twice');
    const conn = redis.connection('client');
    const first = spawnCli(['produce', '-c', configPath]);
    await waitFor(
      async () => (await conn.hget(keys.stats('ds'), 'status')) === 'in_progress',
      'the first producer feeding',
      60_000,
    );
    const t0 = Date.now();
    const second = spawnCli(['produce', '-c', configPath]);
    expect(await second.exited, second.output()).toBe(1);
    expect(Date.now() - t0).toBeLessThan(30_000);
    expect(second.output()).toContain('another producer is running');
    expect(second.output()).toContain(`:${first.child.pid ?? '?'}`);
    // The first one is untouched.
    expect(first.child.exitCode).toBeNull();
    first.child.kill('SIGTERM');
    // Stopped before its prompts were all sent: unfinished, so 143.
    expect(await first.exited).toBe(143);
  }, 120_000);

  it('a producer whose lock was taken over stops and exits non-zero', async () => {
    const { configPath, keys } = setup('takeover');
    const conn = redis.connection('client');
    const p = spawnCli(['produce', '-c', configPath]);
    await waitFor(
      async () => (await conn.hget(keys.stats('ds'), 'status')) === 'in_progress',
      'the producer feeding',
      60_000,
    );
    // What another producer does once the lock lapsed: the key now names someone else.
    await conn.set(keys.producerLock(), 'otherhost:4242:1700000000000:abcdef12', 'PX', 60_000);
    const code = await Promise.race([p.exited, new Promise((r) => setTimeout(() => r('still running'), 40_000))]);
    expect(code, p.output().slice(-2_000)).not.toBe(0);
    expect(code).not.toBe('still running');
    expect(p.output()).toMatch(/lost the lock/);
  }, 120_000);
});
