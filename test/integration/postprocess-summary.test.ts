// The post-process summary when generations were cut at maxNewTokens, from real `run` and
// `postprocess` child processes against the simulator: a round where every record is dropped
// says so (not "the training dataset already holds every row") with what to do, and a dataset
// that loses a large share of its records gets a warning.
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { describeHfDataset, type ConfigInput, type MergeJobResult } from '../../src/shared/index.js';
import { LARGE_DROP_FRACTION } from '../../src/cli/drop-summary.js';
import { readGenerations, spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { useHarness } from '../helpers/fixture.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  // Every completion is 20–100 tokens long: maxNewTokens 10 cuts all, 40 cuts most.
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 9,
    outputLength: { distribution: 'uniform', mean: 60, min: 20, max: 100 },
  },
  tmp: true,
  cli: true,
});

function configFor(run: string, datasets: ConfigInput['datasets']): string {
  return writeConfig(
    tmp.dir,
    {
      run,
      redis: { url: redis.url, prefix: redis.prefix },
      sglang: { endpoints: [sim.url], concurrency: 16, requestTimeoutMs: 30_000 },
      datasets,
      output: { dir: 'out' },
      workers: { shutdownGraceMs: 2_000 },
    },
    `${run}.yaml`,
  );
}

async function cli(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  expect(code, p.output()).toBe(0);
  return p.output();
}

describe('post-process summary of truncated generations', () => {
  it('every record truncated: says they were all dropped and what to do (`run`), the counts by reason in `postprocess --json`', async () => {
    writePrompts(tmp.dir, 'cut-prompts', 20);
    const config = configFor('allcut', [
      { name: 'cut', prompts: 'cut-prompts.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 10, batchSize: 8 },
    ]);
    const runDir = path.join(tmp.dir, 'out', 'allcut');
    const out = await cli(['run', '-c', config]);
    const records = readGenerations(runDir, 'cut');
    expect(records).toHaveLength(20);
    expect(records.every((r) => r.finish_reason.type === 'length')).toBe(true);

    const advice =
      '20 dropped: finish_reason length (cut at maxNewTokens) — raise maxNewTokens of dataset cut (now 10) or set postprocess.keepTruncated: true';
    expect(out).not.toContain('already holds every row');
    expect(out).toMatch(
      /post-processing allcut-pp-1: nothing merged: 20 of 20 records were dropped \(20 finish_reason length \(cut at maxNewTokens\)\)/,
    );
    expect(out).toContain(`cut: 20 of 20 records (100.0%) — ${advice}`);
    expect(out).toContain(
      'warning: cut: 100.0% of its records were dropped (more than 20.0%): 20 finish_reason length (cut at maxNewTokens)',
    );
    // `postprocess --json`: the result carries the counts by reason; the warning goes to stderr.
    const json = await cli(['postprocess', '-c', config, '--json']);
    const result = JSON.parse(json.split('\n').find((l) => l.startsWith('{"flowId"')) ?? '{}') as MergeJobResult;
    expect(result.status).toBe('nothing-new');
    expect(result.datasets[0]).toMatchObject({
      dataset: 'cut',
      lines: 20,
      rows: 0,
      alreadyMerged: 0,
      droppedTruncated: 20,
    });
    expect(json).toContain('tokenmill: warning: cut: 100.0% of its records were dropped');
  }, 120_000);

  it('most records truncated: the merged round lists the drops and warns', async () => {
    writePrompts(tmp.dir, 'most-prompts', 40);
    const config = configFor('mostcut', [
      { name: 'most', prompts: 'most-prompts.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 40, batchSize: 8 },
    ]);
    const runDir = path.join(tmp.dir, 'out', 'mostcut');
    const out = await cli(['run', '-c', config]);
    const records = readGenerations(runDir, 'most');
    expect(records).toHaveLength(40);
    const cut = records.filter((r) => r.finish_reason.type === 'length').length;
    const kept = records.length - cut;
    expect(kept).toBeGreaterThan(0);
    expect(cut / records.length).toBeGreaterThan(LARGE_DROP_FRACTION);

    expect(out).toMatch(/post-processing mostcut-pp-\d: merged into the training dataset/);
    const pct = `${((100 * cut) / 40).toFixed(1)}%`;
    expect(out).toContain(
      `most: ${cut} of 40 records (${pct}) — ${cut} dropped: finish_reason length (cut at maxNewTokens) — raise maxNewTokens of dataset most (now 40) or set postprocess.keepTruncated: true`,
    );
    expect(out).toContain(
      `warning: most: ${pct} of its records were dropped (more than 20.0%): ${cut} finish_reason length (cut at maxNewTokens)`,
    );
    expect((await describeHfDataset(path.join(runDir, 'train-dataset'))).rows).toBe(kept);
  }, 120_000);
});
