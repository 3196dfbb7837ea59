// `postprocess.verifyWithPython`: before the swap, the merged dataset is loaded by Python's own
// `datasets.load_from_disk` in a child process — with `datasets` 3.6 and 5.x (the two test
// environments). A merge whose result Python cannot load is refused and the target stays as it
// was; a missing interpreter, or one without `datasets`, is refused before any work, naming
// `postprocess.python`. Last, the config setting reaches the merge of a `postprocess` round.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { describeHfDataset, mergeIntoTarget, type HfRow } from '../../src/shared/hf-dataset/index.js';
import { makeRows, toColumns, type PyLoad } from '../fixtures/hf/rows.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli } from '../helpers/pipeline.js';
import { ensurePythonEnv, runPythonJson } from '../helpers/python.js';

const V = (dtype: string): Record<string, string> => ({ dtype, _type: 'Value' });
/** The features of tokenmill's columns, as Python `datasets` 5.x spells them when it saves. */
const TOKENMILL_FEATURES_AS_5X = {
  id: V('string'),
  dataset: V('string'),
  input_ids: { feature: V('int32'), _type: 'List' },
  loss_mask: { feature: V('int32'), _type: 'List' },
  num_tokens: V('int32'),
  finish_reason: V('string'),
};

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-verify-py-', cli: true });
let py5: string;
let py3: string;
/** A Python with no `datasets` (a bare virtual environment). */
let pyBare: string;

beforeAll(async () => {
  [py5, py3] = await Promise.all([ensurePythonEnv('main'), ensurePythonEnv('datasets3')]);
  execFileSync(py5, ['-m', 'venv', '--without-pip', path.join(tmp.dir, 'bare')]);
  pyBare = path.join(tmp.dir, 'bare', 'bin', 'python');
}, 300_000);

function mergeOpts(target: string, rows: HfRow[], python: string): Parameters<typeof mergeIntoTarget>[0] {
  return { target, newRows: rows, runDir: path.join(tmp.dir, 'run'), shardSizeMiB: 1, verifyWithPython: { python } };
}

async function loadIn(env: 'main' | 'datasets3', dir: string): Promise<PyLoad> {
  const out = await runPythonJson<{ results: PyLoad[] }>(
    'hf_datasets.py',
    [],
    { ops: [{ op: 'load', dir, data: true }] },
    { env },
  );
  const r = out.results[0];
  if (r === undefined) throw new Error('no result');
  return r;
}

describe('postprocess.verifyWithPython', () => {
  it('merges verified by datasets 3.6 and then by 5.x are swapped in', async () => {
    const target = path.join(tmp.dir, 'verified');
    const a = makeRows('a', 30, 1);
    const b = makeRows('b', 20, 2);
    const first = await mergeIntoTarget(mergeOpts(target, a, py3));
    expect(first.report).toMatchObject({ ok: true, rows: 30, problems: [] });
    const second = await mergeIntoTarget(mergeOpts(target, b, py5));
    expect(second.report).toMatchObject({ ok: true, rows: 50, problems: [] });
    const loaded = await loadIn('datasets3', target);
    expect(loaded.ok, loaded.error).toBe(true);
    expect(loaded.data?.['id']).toEqual([...a, ...b].map((r) => r.id));
  }, 120_000);

  it('refuses the swap when Python cannot load the merged dataset; the target stays as it was', async () => {
    // A target saved by Python datasets 5.x spells its list features "List", which 3.6 cannot
    // read; the merge keeps the target's dataset_info.json, so 3.6 cannot load the result.
    const target = path.join(tmp.dir, 'by-5x');
    const old = makeRows('p', 12, 3);
    await runPythonJson('hf_datasets.py', [], {
      ops: [{ op: 'save', dir: target, columns: toColumns(old), features: TOKENMILL_FEATURES_AS_5X, num_shards: 1 }],
    });
    const stateBefore = readFileSync(path.join(target, 'state.json'), 'utf8');

    const refused = mergeIntoTarget(mergeOpts(target, makeRows('q', 5, 4), py3));
    await expect(refused).rejects.toThrow(/merge refused, the target is unchanged/);
    await expect(refused).rejects.toThrow(
      new RegExp(
        `Python datasets 3\\.6\\.\\d+ \\(${py3.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\) cannot load the merged dataset \\(datasets\\.load_from_disk\\): .*Feature type 'List' not found`,
      ),
    );
    expect(readFileSync(path.join(target, 'state.json'), 'utf8')).toBe(stateBefore);
    const after = await loadIn('main', target);
    expect(after.num_rows).toBe(12);
    expect(after.data?.['id']).toEqual(old.map((r) => r.id));

    // The same merge, verified by the Python that wrote the target, goes through.
    const ok = await mergeIntoTarget(mergeOpts(target, makeRows('q', 5, 4), py5));
    expect(ok.report).toMatchObject({ ok: true, rows: 17 });
  }, 120_000);

  it('a missing interpreter, or one without datasets, is refused at the start of the merge, naming postprocess.python', async () => {
    const target = path.join(tmp.dir, 'never');
    await expect(mergeIntoTarget(mergeOpts(target, makeRows('x', 3), '/nonexistent/python3'))).rejects.toThrow(
      'postprocess.verifyWithPython: cannot run the Python interpreter "/nonexistent/python3" (postprocess.python): spawn /nonexistent/python3 ENOENT',
    );
    await expect(mergeIntoTarget(mergeOpts(target, makeRows('x', 3), pyBare))).rejects.toThrow(
      `postprocess.verifyWithPython: "${pyBare}" (postprocess.python) cannot import datasets: ModuleNotFoundError: No module named 'datasets'; ` +
        'set postprocess.python to an interpreter with `datasets` installed, or turn postprocess.verifyWithPython off',
    );
    expect(existsSync(target)).toBe(false);
  }, 60_000);

  it('the config setting reaches the merge of a `postprocess` round', async () => {
    const conversations = Array.from({ length: 4 }, (_, i) =>
      JSON.stringify({
        id: `c${i}`,
        conversations: [
          { role: 'user', content: `question ${i}` },
          { role: 'assistant', content: `answer ${i}` },
        ],
      }),
    );
    writeFileSync(path.join(tmp.dir, 'conv.jsonl'), `${conversations.join('\n')}\n`);
    const configFor = (run: string, python: string): string =>
      writeTestConfig(
        tmp.dir,
        {
          run,
          redis,
          datasets: [{ name: 'conv', conversations: 'conv.jsonl' }],
          postprocess: { verifyWithPython: true, python },
        },
        `${run}.yaml`,
      );
    const bare = spawnCli(['postprocess', '-c', configFor('bare', pyBare)]);
    expect(await bare.exited, bare.output()).toBe(1);
    expect(bare.output()).toContain(`"${pyBare}" (postprocess.python) cannot import datasets: ModuleNotFoundError`);
    expect(existsSync(path.join(tmp.dir, 'out', 'bare', 'train-dataset'))).toBe(false);

    const good = spawnCli(['postprocess', '-c', configFor('good', py3)]);
    expect(await good.exited, good.output()).toBe(0);
    expect((await describeHfDataset(path.join(tmp.dir, 'out', 'good', 'train-dataset'))).rows).toBe(4);
  }, 120_000);
});
