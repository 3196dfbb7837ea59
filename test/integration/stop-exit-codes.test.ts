// Every stop path of an unfinished command exits non-zero (143 after SIGTERM, 130 after SIGINT),
// so `tokenmill run && next` does not carry on; 0 only when the run completed. Real CLI children
// against the simulator and a private Redis.
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { useHarness } from '../helpers/fixture.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { readGenerations, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  // ~1 s per request: a signal lands mid-generation.
  sim: {
    timeScale: 8,
    maxRunningRequests: 16,
    seed: 23,
    outputLength: { distribution: 'lognormal', mean: 600, sigma: 0.6 },
  },
  tmp: true,
  cli: true,
});

function setup(run: string, prompts: number, extra: TestConfigSpec = {}): { configPath: string; runDir: string } {
  writePrompts(tmp.dir, run, prompts);
  const configPath = writeTestConfig(tmp.dir, {
    run,
    redis,
    sim,
    workers: { shutdownGraceMs: 1_000 },
    ...extra,
  });
  return { configPath, runDir: path.join(tmp.dir, 'out', run) };
}

async function exitWithin(cli: ReturnType<typeof spawnCli>, ms: number): Promise<number | string> {
  return Promise.race([cli.exited, new Promise<string>((r) => setTimeout(() => r('still running'), ms))]);
}

describe('stop paths exit non-zero when work is unfinished', () => {
  it('SIGTERM to `run` mid-generation exits 143 and says it is stopping', async () => {
    const { configPath, runDir } = setup('term-gen', 200);
    const run = spawnCli(['run', '-c', configPath]);
    await waitFor(() => readGenerations(runDir, 'ds').length >= 8, 'first commits on disk', 60_000);
    run.child.kill('SIGTERM');
    expect(await exitWithin(run, 30_000), run.output().slice(-2_000)).toBe(143);
    expect(run.output()).toMatch(/SIGTERM: stopping/);
    expect(readGenerations(runDir, 'ds').length).toBeLessThan(200);
  }, 120_000);

  it('SIGINT to `produce` mid-generation exits 130', async () => {
    const { configPath, runDir } = setup('int-produce', 200);
    const produce = spawnCli(['produce', '-c', configPath]);
    const worker = spawnCli(['worker', '-c', configPath]);
    await waitFor(() => readGenerations(runDir, 'ds').length >= 8, 'first commits on disk', 60_000);
    produce.child.kill('SIGINT');
    expect(await exitWithin(produce, 30_000), produce.output().slice(-2_000)).toBe(130);
    // A worker alone has nothing to finish: SIGTERM is its normal end.
    worker.child.kill('SIGTERM');
    expect(await exitWithin(worker, 30_000), worker.output().slice(-2_000)).toBe(0);
  }, 120_000);

  it('SIGTERM to `run` during post-processing exits 143; a completed run exits 0', async () => {
    // Many records and a slow simulator-free phase: the signal lands while the round is running.
    const { configPath } = setup('term-pp', 48);
    const run = spawnCli(['run', '-c', configPath]);
    await waitFor(() => /post-processing \S+:/.test(run.output()), 'the post-process round to start', 90_000);
    run.child.kill('SIGTERM');
    const code = await exitWithin(run, 30_000);
    const out = run.output();
    expect(out, 'the signal must land during the round').toMatch(/interrupted during post-processing/);
    expect(code, out.slice(-2_000)).toBe(143);

    const again = spawnCli(['run', '-c', configPath]);
    expect(await exitWithin(again, 90_000), again.output().slice(-2_000)).toBe(0);
  }, 240_000);

  it('SIGTERM to `postprocess` during its round exits 143 (not 130, the code of SIGINT)', async () => {
    const { configPath } = setup('term-ppcmd', 48);
    const produce = spawnCli(['produce', '-c', configPath]);
    const worker = spawnCli(['worker', '-c', configPath]);
    expect(await exitWithin(produce, 90_000), produce.output().slice(-2_000)).toBe(0);
    worker.child.kill('SIGTERM');
    await worker.exited;
    const pp = spawnCli(['postprocess', '-c', configPath]);
    await waitFor(() => /post-processing \S+/.test(pp.output()), 'the round to start', 60_000);
    pp.child.kill('SIGTERM');
    const code = await exitWithin(pp, 30_000);
    expect(pp.output(), 'the signal must land during the round').toMatch(/interrupted; the round stays queued/);
    expect(code, pp.output().slice(-2_000)).toBe(143);
  }, 240_000);
});
