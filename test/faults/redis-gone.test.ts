// Redis gone under a running `tokenmill run` (redis-server kill -9'd, as an OOM kill does):
// the outage is said in lines a person reads (once, then a reminder, not a flood); the embedded
// server is restarted on its AOF and the run completes; with an external Redis that stays
// away, SIGTERM still ends the run within the grace period + 30 s, with a non-zero code.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { EmbeddedRedis } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';

const { sim, tmp } = useHarness({
  sim: {
    timeScale: 10,
    maxRunningRequests: 16,
    seed: 71,
    outputLength: { distribution: 'lognormal', mean: 600, sigma: 0.6 },
  },
  tmp: true,
  cli: true,
});

const GRACE_MS = 1_000;

function setup(run: string, prompts: number, redisUrl?: string): { configPath: string; runDir: string; ids: string[] } {
  writePrompts(tmp.dir, run, prompts);
  return {
    configPath: writeTestConfig(tmp.dir, {
      run,
      redis: redisUrl,
      sim,
      workers: { shutdownGraceMs: GRACE_MS, lockDurationMs: 3_000, stalledIntervalMs: 1_000, leaseTtlMs: 3_000 },
    }),
    runDir: path.join(tmp.dir, 'out', run),
    ids: Array.from({ length: prompts }, (_, i) => `${run}-${i}`),
  };
}

function outageLines(output: string): string[] {
  return output
    .split('\n')
    .filter((l) => /^tokenmill: Redis at .* (is not answering|still not answering|is back)/.test(l));
}

describe('Redis gone mid-run', () => {
  it("the embedded redis-server kill -9'd: `run` says so, restarts it on its AOF, and completes with each prompt once", async () => {
    const { configPath, runDir, ids } = setup('emb-kill', 120);
    const run = spawnCli(['run', '-c', configPath]);
    await waitFor(() => readGenerations(runDir, 'ds').length >= 16, 'first commits on disk', 90_000);
    const pid = Number(readFileSync(path.join(runDir, 'redis', 'redis.pid'), 'utf8').trim());
    process.kill(pid, 'SIGKILL');
    await waitFor(
      () => /Redis at redis:\/\/127\.0\.0\.1:\d+\/? is not answering/.test(run.output()),
      'the outage line',
      15_000,
    );
    const code = await Promise.race([run.exited, new Promise((r) => setTimeout(() => r('still running'), 120_000))]);
    expect(code, run.output().slice(-3_000)).toBe(0);
    expect(run.output()).toMatch(/is back after/);
    const out = readGenerations(runDir, 'ds');
    expect(duplicates(out.map((r) => r.id))).toEqual([]);
    expect(out.map((r) => r.id).sort()).toEqual([...ids].sort());
  }, 200_000);

  it('an external Redis killed and not restarted: a line, a reminder (not a flood), and SIGTERM ends `run` within grace + 30 s, non-zero', async () => {
    const server = new EmbeddedRedis({ dataDir: path.join(tmp.dir, 'ext-redis'), logger: quietLogger() });
    const { url } = await server.start();
    try {
      const { configPath, runDir } = setup('ext-kill', 400, url);
      const run = spawnCli(['run', '-c', configPath]);
      await waitFor(() => readGenerations(runDir, 'ds').length >= 16, 'first commits on disk', 90_000);
      const pid = server.pid;
      if (pid === undefined) throw new Error('no redis pid');
      process.kill(pid, 'SIGKILL');
      await waitFor(
        () => outageLines(run.output()).some((l) => l.includes('is not answering')),
        'the outage line',
        15_000,
      );
      // Stays away for longer than one reminder period (30 s).
      await waitFor(
        () => outageLines(run.output()).some((l) => l.includes('still not answering')),
        'the reminder',
        45_000,
      );
      const lines = outageLines(run.output());
      expect(lines.filter((l) => l.includes('is not answering'))).toHaveLength(1);
      expect(lines.length).toBeLessThanOrEqual(3);
      const t0 = Date.now();
      run.child.kill('SIGTERM');
      const code = await Promise.race([
        run.exited,
        new Promise((r) => setTimeout(() => r('still running'), GRACE_MS + 40_000)),
      ]);
      expect(code, run.output().slice(-3_000)).toBe(143);
      expect(Date.now() - t0).toBeLessThan(GRACE_MS + 32_000);
      expect(run.output()).toMatch(/SIGTERM: stopping/);
    } finally {
      await server.stop().catch(() => undefined);
    }
  }, 200_000);
});
