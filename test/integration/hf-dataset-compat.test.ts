// The training dataset against the `datasets` versions trainers pin: what tokenmill writes (a
// fresh dataset, and a target grown by two merges) must load with `load_from_disk` in
// `datasets` 3.6 (the last before 4.0, which knows list features only as `Sequence`) and in the
// current 5.x, with the same rows; and tokenmill must read folders that either version wrote
// (`Sequence` from 3.x, `List` from 4.x/5.x).
import { readFile } from 'node:fs/promises';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  mergeIntoTarget,
  readHfDataset,
  readShardSchema,
  writeHfDataset,
  type HfRow,
  type HfWriteResult,
} from '../../src/shared/hf-dataset/index.js';
import { makeRows, toColumns, type PyLoad } from '../fixtures/hf/rows.js';
import { useHarness } from '../helpers/fixture.js';
import { runPythonJson, type PythonEnvName } from '../helpers/python.js';

const SHARD_MIB = 0.02; // 20 KiB: a few hundred rows make several shards
const SEQ = (dtype: string): Record<string, unknown> => ({ feature: { dtype, _type: 'Value' }, _type: 'Sequence' });
const LIST = (dtype: string): Record<string, unknown> => ({ feature: { dtype, _type: 'Value' }, _type: 'List' });
const VALUE = (dtype: string): Record<string, unknown> => ({ dtype, _type: 'Value' });

interface PyOut {
  versions: { datasets: string; pyarrow: string };
  results: PyLoad[];
}

function load(env: PythonEnvName, dirs: readonly string[]): Promise<PyOut> {
  return runPythonJson<PyOut>(
    'hf_datasets.py',
    [],
    { ops: dirs.map((dir) => ({ op: 'load', dir, data: true })) },
    { env, timeoutMs: 180_000 },
  );
}

function expectRows(d: PyLoad | undefined, rows: readonly HfRow[]): void {
  expect(d?.error).toBeUndefined();
  expect(d?.ok).toBe(true);
  expect(d?.num_rows).toBe(rows.length);
  expect(d?.data).toEqual(toColumns(rows));
}

describe('datasets 3.x and 5.x both load what tokenmill writes', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-compat-' });
  const rows = makeRows('B1_glaive', 300, 11);
  const rows64 = makeRows('B2_code', 40, 12);
  const more = makeRows('B3_more', 120, 13);
  let written: HfWriteResult;
  let py3: PyOut;
  let py5: PyOut;

  beforeAll(async () => {
    written = await writeHfDataset(path.join(tmp.dir, 'fresh'), rows, { shardSizeMiB: SHARD_MIB });
    await writeHfDataset(path.join(tmp.dir, 'wide'), rows64, {
      shardSizeMiB: 1,
      inputIdsType: 'int64',
      lossMaskType: 'int8',
    });
    // A target created by a merge, then grown by a second one (new shards listed after the old).
    const target = path.join(tmp.dir, 'merged');
    const runDir = path.join(tmp.dir, 'run');
    await mergeIntoTarget({ target, newRows: rows, runDir, shardSizeMiB: SHARD_MIB, mergeKey: 'compat-1/a' });
    await mergeIntoTarget({ target, newRows: more, runDir, shardSizeMiB: SHARD_MIB, mergeKey: 'compat-2/b' });
    const dirs = ['fresh', 'wide', 'merged'].map((d) => path.join(tmp.dir, d));
    [py3, py5] = await Promise.all([load('datasets3', dirs), load('main', dirs)]);
  }, 600_000);

  it('spells list features `Sequence` in dataset_info.json and in every shard’s metadata', async () => {
    const want = {
      id: VALUE('string'),
      dataset: VALUE('string'),
      input_ids: SEQ('int32'),
      loss_mask: SEQ('int32'),
      num_tokens: VALUE('int32'),
      finish_reason: VALUE('string'),
    };
    const info = JSON.parse(await readFile(path.join(tmp.dir, 'fresh', 'dataset_info.json'), 'utf8')) as {
      features: unknown;
    };
    expect(info.features).toEqual(want);
    expect(written.shards.length).toBeGreaterThan(1);
    for (const s of written.shards) {
      const schema = await readShardSchema(path.join(tmp.dir, 'fresh', s));
      expect(JSON.parse(schema.metadata.get('huggingface') ?? '{}')).toEqual({ info: { features: want } });
    }
  });

  it('datasets 3.6 loads them with identical rows', () => {
    expect(py3.versions.datasets).toMatch(/^3\./);
    expectRows(py3.results[0], rows);
    expectRows(py3.results[1], rows64);
    expect(py3.results[1]?.arrow_types).toMatchObject({
      input_ids: 'list<item: int64>',
      loss_mask: 'list<item: int8>',
    });
    expectRows(py3.results[2], [...rows, ...more]);
    expect(py3.results[0]?.features['input_ids']).toMatch(/^Sequence\(feature=Value\(dtype='int32'/);
  });

  it('the current datasets (5.x) loads them with identical rows, as `List` features', () => {
    expect(py5.versions.datasets).toMatch(/^5\./);
    expectRows(py5.results[0], rows);
    expectRows(py5.results[1], rows64);
    expectRows(py5.results[2], [...rows, ...more]);
    expect(py5.results[0]?.features['input_ids']).toBe("List(Value('int32'))");
    expect(py5.results[1]?.features['loss_mask']).toBe("List(Value('int8'))");
  });
});

describe('tokenmill reads folders written by datasets 3.x (`Sequence`) and 5.x (`List`)', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-compat-py-' });
  const rows = makeRows('B4_py', 60, 21);

  beforeAll(async () => {
    const features = (list: (t: string) => Record<string, unknown>): Record<string, unknown> => ({
      id: VALUE('string'),
      dataset: VALUE('string'),
      input_ids: list('int32'),
      loss_mask: list('int8'),
      num_tokens: VALUE('int32'),
      finish_reason: VALUE('string'),
    });
    const save = (env: PythonEnvName, dir: string, list: (t: string) => Record<string, unknown>): Promise<PyOut> =>
      runPythonJson<PyOut>(
        'hf_datasets.py',
        [],
        {
          ops: [
            {
              op: 'save',
              dir: path.join(tmp.dir, dir),
              columns: toColumns(rows),
              features: features(list),
              num_shards: 2,
            },
          ],
        },
        { env, timeoutMs: 180_000 },
      );
    await Promise.all([save('datasets3', 'by-3x', SEQ), save('main', 'by-5x', LIST)]);
  }, 600_000);

  it.each([
    ['by-3x', 'Sequence'],
    ['by-5x', 'List'],
  ])('%s: features spelled %s, same rows', async (dir, spelling) => {
    const ds = await readHfDataset(path.join(tmp.dir, dir));
    expect((ds.features['input_ids'] as { _type: string })._type).toBe(spelling);
    expect(ds.meta.shards).toHaveLength(2);
    const read: unknown[] = [];
    for await (const r of ds.rows()) read.push(r);
    expect(read).toEqual(rows);
  });
});
