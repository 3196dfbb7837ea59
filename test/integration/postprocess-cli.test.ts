// The post-processing verbs as users run them: `run` (generate → tokenize → merge) against the
// simulator, `postprocess`, `rollback`, `status`, `produce` queuing a round for
// `worker --role postprocess`, each a real child process.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { openRunContextFor } from '../../src/cli/run-context.js';
import {
  describeHfDataset,
  loadConfig,
  type ConfigInput,
  type MergeJobResult,
  type RunStatus,
} from '../../src/shared/index.js';
import { waitForRound } from '../../src/workers/postprocess/flow.js';
import { readGenerations, spawnCli, waitFor, writeConfig, writePrompts, type CliProcess } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';
import { useHarness } from '../helpers/fixture.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 5,
    outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.8 },
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

async function finished(cli: CliProcess): Promise<{ code: number | string; out: string }> {
  const code = await cli.exited;
  return { code, out: cli.output() };
}

function jsonLine<T>(out: string, startsWith: string): T {
  const line = out.split('\n').find((l) => l.startsWith(startsWith));
  if (line === undefined) throw new Error(`no line starting with ${startsWith} in:\n${out}`);
  return JSON.parse(line) as T;
}

function phasesOf(status: RunStatus): Record<string, string> {
  return Object.fromEntries(status.phases.map((p) => [p.name, p.status]));
}

describe('post-processing from the command line', () => {
  const run = 'cli';
  let configPath: string;
  let runDir: string;
  let target: string;
  let rowsAfterRun = 0;

  beforeAll(() => {
    writePrompts(tmp.dir, 'cli-prompts', 24);
    configPath = configFor(run, [
      { name: 'ds', prompts: 'cli-prompts.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 1024, batchSize: 8 },
    ]);
    runDir = path.join(tmp.dir, 'out', run);
    target = path.join(runDir, 'train-dataset');
  });

  it('`run` generates, tokenizes and merges; `status` shows the phases; the target loads in Python', async () => {
    const { code, out } = await finished(spawnCli(['run', '-c', configPath, '--json']));
    expect(code, out).toBe(0);
    const printed = jsonLine<RunStatus & { postprocess: MergeJobResult }>(out, '{"run"');
    expect(phasesOf(printed)).toMatchObject({ generate: 'completed', tokenize: 'completed', merge: 'completed' });
    const records = readGenerations(runDir, 'ds');
    expect(records.length).toBe(24);
    // Generations cut at maxNewTokens are dropped (postprocess.keepTruncated is false).
    const kept = records.filter((r) => r.finish_reason.type === 'stop').map((r) => r.id);
    expect(kept.length).toBeGreaterThan(0);
    expect(printed.postprocess.status).toBe('merged');
    expect(printed.postprocess.report).toMatchObject({
      firstMerge: true,
      newRows: kept.length,
      rows: kept.length,
      problems: [],
    });
    expect(printed.postprocess.datasets[0]).toMatchObject({
      dataset: 'ds',
      lines: 24,
      rows: kept.length,
      droppedTruncated: 24 - kept.length,
    });
    rowsAfterRun = kept.length;

    const py = await runPythonJson<{ results: { ok: boolean; num_rows: number; data: Record<string, unknown[]> }[] }>(
      'hf_datasets.py',
      [],
      {
        ops: [{ op: 'load', dir: target, data: true }],
      },
    );
    expect(py.results[0]?.ok).toBe(true);
    expect(((py.results[0]?.data['id'] ?? []) as string[]).sort()).toEqual([...kept].sort());

    const status = await finished(spawnCli(['status', '-c', configPath, '--json']));
    expect(status.code, status.out).toBe(0);
    expect(phasesOf(jsonLine<RunStatus>(status.out, '{"run"'))).toMatchObject({
      tokenize: 'completed',
      merge: 'completed',
    });
  }, 120_000);

  it('`postprocess` appends new generations; `rollback` restores the dataset before that merge, and refuses to undo the first', async () => {
    const [first] = readGenerations(runDir, 'ds').filter((r) => r.finish_reason.type === 'stop');
    if (first === undefined) throw new Error('no kept generation');
    const extra = ['extra-0', 'extra-1'].map((id) => JSON.stringify({ ...first, id }));
    // Generations brought in from elsewhere: any *.jsonl beside the sink's own part files.
    writeFileSync(path.join(runDir, 'ds', 'generations', 'imported-00000.jsonl'), `${extra.join('\n')}\n`);

    const pp = await finished(spawnCli(['postprocess', '-c', configPath]));
    expect(pp.code, pp.out).toBe(0);
    expect(pp.out).toContain(`post-processing ${run}-pp-2: merged into the training dataset`);
    expect(pp.out).toContain(`rows                ${rowsAfterRun} -> ${rowsAfterRun + 2} (+2)`);
    expect(pp.out).toMatch(/loss-mask coverage {2}\d+\.\d%/);
    expect((await describeHfDataset(target)).rows).toBe(rowsAfterRun + 2);

    const rb = await finished(spawnCli(['rollback', '-c', configPath]));
    expect(rb.code, rb.out).toBe(0);
    expect(rb.out).toContain('2 rows removed');
    expect(rb.out).toContain(`restored: ${rowsAfterRun} rows`);
    const after = await describeHfDataset(target);
    expect(after.rows).toBe(rowsAfterRun);
    expect(after.problems).toEqual([]);

    const refused = await finished(spawnCli(['rollback', '-c', configPath]));
    expect(refused.code, refused.out).toBe(1);
    expect(refused.out).toMatch(/tokenmill: cannot roll back merge .*: it created/);
    expect((await describeHfDataset(target)).rows).toBe(rowsAfterRun);
  }, 60_000);

  it('`produce` queues a round once generation is complete; `worker --role postprocess` serves it and stops on SIGTERM', async () => {
    const worker = spawnCli(['worker', '-c', configPath, '--role', 'postprocess']);
    try {
      await waitFor(() => worker.output().includes('post-processing worker ready'), 'the worker to start', 30_000);
      const produce = await finished(spawnCli(['produce', '-c', configPath]));
      expect(produce.code, produce.out).toBe(0);
      expect(produce.out).toContain(`post-processing ${run}-pp-3 queued`);
      const ctx = await openRunContextFor(loadConfig({ path: configPath }));
      try {
        const outcome = await waitForRound(ctx.redis, ctx.keys, `${run}-pp-3`);
        // The rows the rollback removed come back.
        expect(outcome).toMatchObject({
          status: 'completed',
          result: { status: 'merged', report: { newRows: 2, rows: rowsAfterRun + 2 } },
        });
      } finally {
        await ctx.close();
      }
    } finally {
      worker.child.kill('SIGTERM');
    }
    expect(await worker.exited, worker.output()).toBe(0);
  }, 90_000);
});

describe('a failing post-process round from the command line', () => {
  it('`postprocess` exits non-zero with the failed tokenize job’s reason; `status` shows the phases failed', async () => {
    writeFileSync(path.join(tmp.dir, 'broken.jsonl'), 'this is not JSON\n{"id": "x"}\n');
    const configPath = configFor('clibad', [{ name: 'broken', conversations: 'broken.jsonl' }]);
    const pp = await finished(spawnCli(['postprocess', '-c', configPath]));
    expect(pp.code, pp.out).toBe(1);
    expect(pp.out).toContain(
      'tokenmill: post-processing clibad-pp-1 failed: tokenize broken: dataset broken: 2 of 2 lines are invalid (at most 5% allowed)',
    );
    expect(pp.out).toContain('broken.jsonl:1: invalid JSON');
    const status = await finished(spawnCli(['status', '-c', configPath, '--json']));
    expect(phasesOf(jsonLine<RunStatus>(status.out, '{"run"'))).toMatchObject({ tokenize: 'failed', merge: 'failed' });
  }, 60_000);
});
