/**
 * Redis refusing writes for its own sake, against a real redis-server: `OOM command not allowed`
 * (maxmemory reached, noeviction) raised inside a Lua script is said as what it is and what to
 * do, not as a script error; `MISCONF` likewise; and `run` warns at start when maxmemory is
 * small for the run.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { describeRedisRefusal, smallMaxmemoryWarning } from '../../src/cli/redis-memory.js';
import { RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 4,
    contextLength: 2048,
    outputLength: { distribution: 'fixed', mean: 16 },
  },
  tmp: 'tm-redis-memory-',
  cli: true,
});

afterEach(async () => {
  await redis.connection('client').config('SET', 'maxmemory', '0');
  await redis.connection('client').del('tm-oom-test', 'tm-oom-test-2');
});

async function usedMemory(): Promise<number> {
  const info = await redis.connection('client').info('memory');
  return Number(/^used_memory:(\d+)/m.exec(info)?.[1]);
}

describe('a Redis that refuses writes', () => {
  it('OOM inside a Lua script: one line saying Redis is out of memory and to raise maxmemory', async () => {
    const r = redis.connection('client');
    await r.config('SET', 'maxmemory-policy', 'noeviction');
    await r.config('SET', 'maxmemory', String((await usedMemory()) + 256 * 1024));
    // Redis checks memory before a command: the first write takes it over the limit, the next is refused.
    await r.eval("return redis.call('SET', KEYS[1], string.rep('x', 2000000))", 1, 'tm-oom-test');
    const e = await r.eval("return redis.call('SET', KEYS[1], 'y')", 1, 'tm-oom-test-2').then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(String(e)).toContain('OOM command not allowed');
    const line = describeRedisRefusal(e);
    expect(line).toMatch(/^Redis is out of memory: it refuses writes \(OOM/);
    expect(line).toContain('CONFIG SET maxmemory');
    expect(line).not.toContain('script');
  });

  it('MISCONF (as Redis words it when it cannot write its AOF): says it cannot persist and to free disk space', () => {
    const e = new Error(
      'MISCONF Errors writing to the AOF file: No space left on device. script: 2f5e…, on @user_script:41.',
    );
    expect(describeRedisRefusal(e)).toMatch(
      /^Redis cannot persist its data \(MISCONF.*Free space on the disk of its dir/,
    );
    expect(describeRedisRefusal(new Error('ERR unknown command'))).toBeUndefined();
  });
});

describe('maxmemory small for the run', () => {
  it('smallMaxmemoryWarning names maxmemory, the use and the need; nothing without a limit', async () => {
    const r = redis.connection('client');
    const keys = new RunKeys(redis.prefix, 'mem');
    await r.hset(keys.stats('big'), { prompts: 2_000_000, records: 0 });
    await r.config('SET', 'maxmemory', String(128 * 1024 * 1024));
    const w = await smallMaxmemoryWarning(r, keys, ['big']);
    expect(w).toMatch(
      /^Redis maxmemory is 128 MiB \(\d+ MiB used\); this run may need about [\d,]+ MiB \(2,000,000 prompts to go/,
    );
    await r.config('SET', 'maxmemory', '0');
    expect(await smallMaxmemoryWarning(r, keys, ['big'])).toBeUndefined();
  });

  it('run prints the warning once at start and still runs', async () => {
    const r = redis.connection('client');
    await r.config('SET', 'maxmemory', String(48 * 1024 * 1024));
    const dir = path.join(tmp.dir, 'small');
    mkdirSync(dir, { recursive: true });
    writePrompts(dir, 's', 8);
    const cfg = writeTestConfig(dir, {
      run: 'small',
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 2048 },
      datasets: [{ name: 's', prompts: 's.jsonl', tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 4 }],
    });
    const p = spawnCli(['run', '-c', cfg]);
    expect(await p.exited, p.output()).toBe(0);
    const warnings = p
      .output()
      .split('\n')
      .filter((l) => l.startsWith('tokenmill: warning: Redis maxmemory is 48 MiB'));
    expect(warnings, p.output()).toHaveLength(1);
  }, 90_000);
});
