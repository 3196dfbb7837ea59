// Stopping at the worst moment: SIGTERM to `run` on an embedded Redis while requests are in
// flight and the server answers 503 "queue full" to many first tries. The process exits, its
// private redis-server with it, and a second `run` finishes the job without duplicates.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const { sim, tmp } = useHarness({
  sim: {
    timeScale: 10,
    maxRunningRequests: 16,
    seed: 61,
    outputLength: { distribution: 'lognormal', mean: 600, sigma: 0.6 },
    faults: { firstTry503Rate: 0.3 },
  },
  tmp: true,
  cli: true,
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('shutdown', () => {
  it('SIGTERM to `run` mid-generation with 503s in play: it exits 143, its embedded redis-server stops, a second run completes without duplicates', async () => {
    writePrompts(tmp.dir, 'stop', 120);
    const configPath = writeTestConfig(tmp.dir, {
      run: 'stop',
      sim,
      sglang: { requestTimeoutMs: 30_000 },
      dataset: { maxNewTokens: 4096 },
      workers: { shutdownGraceMs: 1_000 },
    });
    const runDir = path.join(tmp.dir, 'out', 'stop');
    const pidFile = path.join(runDir, 'redis', 'redis.pid');
    const first = spawnCli(['run', '-c', configPath]);
    await waitFor(
      () => readGenerations(runDir, 'ds').length >= 10 && sim.stats().running > 0 && sim.stats().failed > 0,
      'commits, requests in flight and 503s',
      60_000,
    );
    const redisPid = Number(readFileSync(pidFile, 'utf8').trim());
    expect(alive(redisPid)).toBe(true);
    const t0 = Date.now();
    first.child.kill('SIGTERM');
    const code = await Promise.race([first.exited, new Promise((r) => setTimeout(() => r('still running'), 20_000))]);
    // Stopped before the run completed: 143, so `tokenmill run && next` does not go on.
    expect(code, first.output().slice(-2_000)).toBe(143);
    expect(Date.now() - t0).toBeLessThan(20_000);
    await waitFor(() => !alive(redisPid), 'the embedded redis-server to exit', 10_000);
    expect(existsSync(pidFile)).toBe(false);

    const second = spawnCli(['run', '-c', configPath]);
    expect(await second.exited, second.output().slice(-2_000)).toBe(0);
    const out = readGenerations(runDir, 'ds');
    expect(duplicates(out.map((r) => r.id))).toEqual([]);
    expect(out.map((r) => r.id).sort()).toEqual(Array.from({ length: 120 }, (_, i) => `stop-${i}`).sort());
  }, 150_000);
});
