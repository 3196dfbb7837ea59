// Merging into the training dataset, checked with Python `datasets`: merges into folders that
// Python's save_to_disk created (int64 ids, its own shard names and metadata), rollback step by
// step, hard-linked reuse of old shards, and refusals that leave the target untouched.
import { createHash } from 'node:crypto';
import { cp, readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { createRootLogger } from '../../src/shared/logger.js';
import {
  DatasetMergeError,
  describeHfDataset,
  listMerges,
  mergeIntoTarget,
  rollbackTarget,
  writeHfDataset,
  type HfRow,
  type MergeResult,
  type RollbackResult,
} from '../../src/shared/hf-dataset/index.js';
import { makeRows, toColumns, type PyLoad } from '../fixtures/hf/rows.js';
import { useHarness } from '../helpers/fixture.js';
import { runPythonJson } from '../helpers/python.js';

const V = (dtype: string): Record<string, string> => ({ dtype, _type: 'Value' });
const L = (dtype: string): Record<string, unknown> => ({ feature: V(dtype), _type: 'List' });
const FULL_INT64 = {
  id: V('string'),
  dataset: V('string'),
  input_ids: L('int64'),
  loss_mask: L('int64'),
  num_tokens: V('int64'),
  finish_reason: V('string'),
};

/** Every file under `dir` (relative path → sha256), to prove a folder was not touched. */
async function fingerprintTree(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else
        out[path.relative(dir, p)] = createHash('sha256')
          .update(await readFile(p))
          .digest('hex');
    }
  };
  await walk(dir);
  return out;
}

function expectRows(py: PyLoad | undefined, rows: readonly HfRow[], columns = ['id', 'input_ids', 'loss_mask']): void {
  expect(py?.error).toBeUndefined();
  expect(py?.num_rows).toBe(rows.length);
  for (const c of columns) {
    expect(py?.data?.[c], `column ${c}`).toEqual(rows.map((r) => r[c as keyof HfRow]));
  }
}

describe('mergeIntoTarget / rollbackTarget with Python datasets', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-merge-' });
  let runDir: string;
  const old = makeRows('B1_glaive', 120, 1);
  const newA = makeRows('B2_code', 90, 2);
  const newB = makeRows('B3_math', 40, 3);
  const minimal = makeRows('B4_min', 30, 4);
  const paths = (name: string): string => path.join(tmp.dir, name);

  let merge1: MergeResult;
  let merge2: MergeResult;
  let rollback1: RollbackResult;
  let rollback2: RollbackResult;
  const linkCheck: { shard: string; sameInode: boolean; nlink: number }[] = [];
  let thirdRollback: unknown;
  let minimalMerge: MergeResult;
  let final: PyLoad[];

  beforeAll(async () => {
    createRootLogger({ level: 'silent' });
    runDir = paths('run');
    const minCols = toColumns(old);
    await runPythonJson('hf_datasets.py', [], {
      ops: [
        { op: 'save', dir: paths('py-full'), columns: toColumns(old), features: FULL_INT64, num_shards: 2 },
        {
          op: 'save',
          dir: paths('py-min'),
          columns: { id: minCols['id'], input_ids: minCols['input_ids'], loss_mask: minCols['loss_mask'] },
          features: { id: V('string'), input_ids: L('int64'), loss_mask: L('int64') },
        },
        {
          op: 'save',
          dir: paths('py-bad-mask'),
          columns: { ...toColumns(old), loss_mask: old.map((r) => r.loss_mask.map(String)) },
          features: { ...FULL_INT64, loss_mask: L('string') },
        },
        {
          op: 'save',
          dir: paths('py-extra'),
          columns: { ...toColumns(old), text: old.map((r) => `text of ${r.id}`) },
          features: { ...FULL_INT64, text: V('string') },
        },
      ],
    });

    // Merge 1: rows into the Python dataset; the hook sees the complete merged folder before the swap.
    const target = paths('py-full');
    const oldShards = ['data-00000-of-00002.arrow', 'data-00001-of-00002.arrow'];
    merge1 = await mergeIntoTarget({
      target,
      newRows: newA,
      runDir,
      shardSizeMiB: 0.01,
      decode: (ids) => ids.slice(0, 5).join(' '),
      verifyMerged: async (dir) => {
        for (const s of oldShards) {
          const [a, b] = await Promise.all([stat(path.join(target, s)), stat(path.join(dir, s))]);
          linkCheck.push({ shard: s, sameInode: a.ino === b.ino && a.dev === b.dev, nlink: b.nlink });
        }
        return [];
      },
    });
    await cp(target, paths('snap-after-1'), { recursive: true });

    // Merge 2: from a folder written by writeHfDataset (int32), converted to the target's int64.
    await writeHfDataset(paths('staged-b'), newB, { shardSizeMiB: 1 });
    merge2 = await mergeIntoTarget({ target, newRows: { stagedDir: paths('staged-b') }, runDir, shardSizeMiB: 1 });
    await cp(target, paths('snap-after-2'), { recursive: true });

    rollback1 = await rollbackTarget({ target, runDir });
    await cp(target, paths('snap-rollback-1'), { recursive: true });
    rollback2 = await rollbackTarget({ target, runDir });
    thirdRollback = await rollbackTarget({ target, runDir }).catch((e: unknown) => e);

    minimalMerge = await mergeIntoTarget({ target: paths('py-min'), newRows: minimal, runDir, shardSizeMiB: 1 });

    const out = await runPythonJson<{ results: PyLoad[] }>('hf_datasets.py', [], {
      ops: [
        { op: 'load', dir: paths('snap-after-1'), data: true },
        { op: 'load', dir: paths('snap-after-2'), data: true },
        { op: 'load', dir: paths('snap-rollback-1'), data: true },
        { op: 'load', dir: target, data: true },
        { op: 'load', dir: paths('py-min'), data: true },
      ],
    });
    final = out.results;
  }, 120_000);

  it('merges rows into a dataset saved by Python: old rows then new, exact values, int64 kept', () => {
    const py = final[0];
    expectRows(py, [...old, ...newA], ['id', 'dataset', 'input_ids', 'loss_mask', 'num_tokens', 'finish_reason']);
    expect(py?.arrow_types['input_ids']).toBe('list<item: int64>');
    expect(py?.arrow_types['num_tokens']).toBe('int64');
    // Python's own shard names stay, new shards follow them.
    const files = (py?.files ?? []).map((f) => path.basename(f));
    expect(files.slice(0, 2)).toEqual(['data-00000-of-00002.arrow', 'data-00001-of-00002.arrow']);
    expect(files.length).toBe(merge1.report.shards);
    expect(files.length).toBeGreaterThan(3);
  });

  it('reports what it validated', async () => {
    const tokens = (rows: HfRow[]): number => rows.reduce((a, r) => a + r.input_ids.length, 0);
    const sup = (rows: HfRow[]): number => rows.reduce((a, r) => a + r.loss_mask.reduce((x, y) => x + y, 0), 0);
    const r = merge1.report;
    expect(r).toMatchObject({
      ok: true,
      firstMerge: false,
      oldRows: 120,
      newRows: 90,
      rows: 210,
      oldTokens: tokens(old),
      newTokens: tokens(newA),
      tokens: tokens(old) + tokens(newA),
      supervisedTokens: sup(old) + sup(newA),
      linkedShards: 2,
      copiedShards: 0,
      problems: [],
    });
    expect(r.lossMaskCoverage).toBeCloseTo((sup(old) + sup(newA)) / (tokens(old) + tokens(newA)), 12);
    expect(r.checkedSamples).toBe(16);
    expect(r.samples.every((s) => s.matches && s.index >= 120 && typeof s.text === 'string' && s.text.length > 0)).toBe(
      true,
    );
    const onDisk = JSON.parse(await readFile(merge1.reportPath, 'utf8')) as { rows: number; ok: boolean };
    expect(onDisk).toMatchObject({ ok: true, rows: 210 });
    expect(path.dirname(merge1.reportPath)).toBe(runDir);
  });

  it('reuses the old shards by hard link, never by copy', () => {
    expect(linkCheck).toEqual([
      { shard: 'data-00000-of-00002.arrow', sameInode: true, nlink: 2 },
      { shard: 'data-00001-of-00002.arrow', sameInode: true, nlink: 2 },
    ]);
  });

  it('merges a staged folder, converting int32 to the int64 target', () => {
    expectRows(final[1], [...old, ...newA, ...newB]);
    expect(final[1]?.arrow_types['loss_mask']).toBe('list<item: int64>');
    expect(merge2.report).toMatchObject({ ok: true, oldRows: 210, newRows: 40, rows: 250 });
  });

  it('rolls back one merge at a time, down to the dataset Python wrote, then refuses', async () => {
    expect(rollback1).toMatchObject({
      undoneMergeId: merge2.report.mergeId,
      undoneNewRows: 40,
      restored: { rows: 210 },
    });
    expectRows(final[2], [...old, ...newA]);
    expect(rollback2).toMatchObject({
      undoneMergeId: merge1.report.mergeId,
      restored: { rows: 120, shards: 2 },
      remainingMerges: 0,
    });
    expectRows(final[3], old, ['id', 'dataset', 'input_ids', 'loss_mask', 'num_tokens', 'finish_reason']);
    // The undone merges' shards are gone: the folder holds Python's files again.
    const names = (await readdir(paths('py-full'))).filter((n) => n.endsWith('.arrow')).sort();
    expect(names).toEqual(['data-00000-of-00002.arrow', 'data-00001-of-00002.arrow']);
    expect(thirdRollback).toBeInstanceOf(DatasetMergeError);
    expect((thirdRollback as Error).message).toMatch(/nothing to roll back/);
    expect(await listMerges(paths('py-full'))).toEqual([]);
  });

  it('leaves out columns the target does not have, and says so', () => {
    expect(minimalMerge.report.droppedColumns).toEqual(['dataset', 'num_tokens', 'finish_reason']);
    expect(final[4]?.arrow_types).toEqual({
      id: 'string',
      input_ids: 'list<item: int64>',
      loss_mask: 'list<item: int64>',
    });
    expectRows(final[4], [...old, ...minimal]);
  });

  it('refuses an incompatible column type with a clear message and leaves the target untouched', async () => {
    const target = paths('py-bad-mask');
    const before = await fingerprintTree(target);
    const err = await mergeIntoTarget({ target, newRows: newA, runDir, shardSizeMiB: 1 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toMatch(
      /cannot merge: column loss_mask is list<string> in the target but list<int32> in the new rows/,
    );
    expect(await fingerprintTree(target)).toEqual(before);
    expect((await readdir(tmp.dir)).filter((n) => n.includes('.merge-') || n.endsWith('.lock'))).toEqual([]);
  });

  it('refuses a target column the new rows cannot fill', async () => {
    const target = paths('py-extra');
    const before = await fingerprintTree(target);
    await expect(mergeIntoTarget({ target, newRows: newA, runDir, shardSizeMiB: 1 })).rejects.toThrow(
      /the target has column text \(string\) but the new rows do not/,
    );
    expect(await fingerprintTree(target)).toEqual(before);
  });
});

describe('mergeIntoTarget: failed validation and first merges', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-merge-fail-' });
  beforeAll(async () => {
    createRootLogger({ level: 'silent' });
  });

  it('creates the target on the first merge; that merge cannot be rolled back', async () => {
    const target = path.join(tmp.dir, 'train');
    const r = await mergeIntoTarget({
      target,
      newRows: makeRows('A', 20),
      runDir: path.join(tmp.dir, 'run'),
      shardSizeMiB: 1,
    });
    expect(r.report).toMatchObject({ ok: true, firstMerge: true, oldRows: 0, newRows: 20, rows: 20, shards: 1 });
    await expect(rollbackTarget({ target, runDir: path.join(tmp.dir, 'run') })).rejects.toThrow(
      /it created .*no earlier dataset/,
    );
    expect(await readdir(tmp.dir)).toEqual(expect.arrayContaining(['train', 'run']));
    expect((await readdir(tmp.dir)).filter((n) => n !== 'train' && n !== 'run')).toEqual([]);
  });

  it('a failed validation throws with the report, writes it, and leaves the target untouched', async () => {
    const target = path.join(tmp.dir, 'train');
    const runDir = path.join(tmp.dir, 'run-fail');
    const before = await fingerprintTree(target);
    const err = await mergeIntoTarget({
      target,
      newRows: makeRows('B', 10),
      runDir,
      shardSizeMiB: 1,
      verifyMerged: () => Promise.resolve(['the trainer could not load it']),
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    const report = (err as DatasetMergeError).report;
    expect(report).toMatchObject({
      ok: false,
      oldRows: 20,
      newRows: 10,
      rows: 30,
      problems: ['the trainer could not load it'],
    });
    const files = await readdir(runDir);
    expect(files).toHaveLength(1);
    expect(JSON.parse(await readFile(path.join(runDir, files[0]!), 'utf8'))).toMatchObject({ ok: false });
    expect(await fingerprintTree(target)).toEqual(before);
  });

  it('merges the rows of one mergeKey once; after a rollback they can be merged again', async () => {
    const target = path.join(tmp.dir, 'keyed');
    const runDir = path.join(tmp.dir, 'run');
    await mergeIntoTarget({ target, newRows: makeRows('A', 10), runDir, shardSizeMiB: 1 });
    const first = await mergeIntoTarget({
      target,
      newRows: makeRows('B', 5),
      runDir,
      shardSizeMiB: 1,
      mergeKey: 'run/B/1',
    });
    const again = await mergeIntoTarget({
      target,
      newRows: makeRows('B', 5),
      runDir,
      shardSizeMiB: 1,
      mergeKey: 'run/B/1',
    });
    expect(first.alreadyMerged).toBe(false);
    expect(again).toMatchObject({ alreadyMerged: true, report: { mergeId: first.report.mergeId, rows: 15 } });
    expect((await describeHfDataset(target)).rows).toBe(15);
    await rollbackTarget({ target, runDir });
    const after = await mergeIntoTarget({
      target,
      newRows: makeRows('B', 5),
      runDir,
      shardSizeMiB: 1,
      mergeKey: 'run/B/1',
    });
    expect(after).toMatchObject({ alreadyMerged: false, report: { rows: 15 } });
    expect((await describeHfDataset(target)).rows).toBe(15);
  });

  it('refuses new rows without any supervised token, and an empty merge', async () => {
    const target = path.join(tmp.dir, 'train');
    const before = await fingerprintTree(target);
    const unsupervised = makeRows('C', 5).map((r) => ({ ...r, loss_mask: r.loss_mask.map(() => 0) }));
    await expect(
      mergeIntoTarget({ target, newRows: unsupervised, runDir: path.join(tmp.dir, 'run'), shardSizeMiB: 1 }),
    ).rejects.toThrow(/loss-mask coverage of the new rows is 0/);
    await expect(
      mergeIntoTarget({ target, newRows: [], runDir: path.join(tmp.dir, 'run'), shardSizeMiB: 1 }),
    ).rejects.toThrow(/no new rows/);
    expect(await fingerprintTree(target)).toEqual(before);
  });
});
