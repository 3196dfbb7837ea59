// Crash safety of merge and rollback (docs/design.md, invariant 8): a child process runs the merge
// and SIGKILLs itself at each crash point; Python `datasets.load_from_disk` must then load the
// target as exactly the old dataset or exactly the new one. Retrying the same merge (same mergeKey,
// as a retried job would) must repair the leftovers and end with the new dataset exactly once:
// merged again when the crash came before the commit, skipped when after.
import { cp, readFile, readdir } from 'node:fs/promises';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { createRootLogger } from '../../src/shared/logger.js';
import {
  MERGE_CRASH_POINTS,
  mergeIntoTarget,
  rollbackTarget,
  type HfRow,
  type MergeCrashPoint,
} from '../../src/shared/hf-dataset/index.js';
import { makeRows, toColumns, type PyLoad } from '../fixtures/hf/rows.js';
import { useHarness } from '../helpers/fixture.js';
import { REPO_ROOT, runProcess, runPythonJson, type ProcessResult } from '../helpers/python.js';

const RUNNER = path.join(REPO_ROOT, 'test', 'helpers', 'hf-merge-runner.ts');
const SHARD_MIB = 0.01;

function runChild(job: Record<string, unknown>): Promise<ProcessResult> {
  return runProcess(process.execPath, ['--import', 'tsx', RUNNER, JSON.stringify(job)], {
    timeoutMs: 60_000,
    env: process.env,
  });
}

interface Case {
  name: string;
  op: 'merge' | 'rollback';
  target: string;
  /** Rows before the crashed operation, and after it if it had completed. */
  before: HfRow[] | null;
  after: HfRow[];
  /** What the target must hold after the crash: the old or the new dataset. */
  expect: 'before' | 'after';
  child: ProcessResult | undefined;
}

const A = makeRows('A', 60, 11);
const B = makeRows('B', 45, 12);
const C = makeRows('C', 25, 13);
const MERGE_KEY = 'run-1/B/tokenize-1';

describe('merge and rollback killed at every step leave a loadable dataset', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-crash-' });
  let runDir: string;
  const cases: Case[] = [];
  let afterCrash: PyLoad[];
  let afterRepair: PyLoad[];
  const repairs: string[][] = [];
  const retriedAlreadyMerged: (boolean | undefined)[] = [];

  beforeAll(async () => {
    createRootLogger({ level: 'silent' });
    runDir = path.join(tmp.dir, 'run');

    // A base dataset made by a first merge, copied for each case.
    const base = path.join(tmp.dir, 'base');
    await mergeIntoTarget({ target: base, newRows: A, runDir, shardSizeMiB: SHARD_MIB });
    // And one saved by Python, with int64 ids.
    const pyBase = path.join(tmp.dir, 'py-base');
    const L64 = { feature: { dtype: 'int64', _type: 'Value' }, _type: 'List' };
    const S = { dtype: 'string', _type: 'Value' };
    await runPythonJson('hf_datasets.py', [], {
      ops: [
        {
          op: 'save',
          dir: pyBase,
          columns: toColumns(A),
          features: {
            id: S,
            dataset: S,
            input_ids: L64,
            loss_mask: L64,
            num_tokens: { dtype: 'int64', _type: 'Value' },
            finish_reason: S,
          },
          num_shards: 2,
        },
      ],
    });

    const committedAt: MergeCrashPoint = 'after-swap';
    for (const point of MERGE_CRASH_POINTS) {
      const target = path.join(tmp.dir, `merge-${point}`);
      await cp(base, target, { recursive: true });
      cases.push({
        name: `merge into an existing target, killed ${point}`,
        op: 'merge',
        target,
        before: A,
        after: [...A, ...B],
        expect: point === committedAt ? 'after' : 'before',
        child: undefined,
      });
    }
    for (const point of ['after-validate', 'between-renames'] as const) {
      const target = path.join(tmp.dir, `py-${point}`);
      await cp(pyBase, target, { recursive: true });
      cases.push({
        name: `merge into a Python dataset, killed ${point}`,
        op: 'merge',
        target,
        before: A,
        after: [...A, ...B],
        expect: 'before',
        child: undefined,
      });
    }
    for (const point of ['after-link', 'after-journal', 'after-swap'] as const) {
      const target = path.join(tmp.dir, `first-${point}`);
      cases.push({
        name: `first merge, killed ${point}`,
        op: 'merge',
        target,
        before: null,
        after: B,
        expect: point === committedAt ? 'after' : 'before',
        child: undefined,
      });
    }

    // Two children at a time (each works on its own target).
    const queue = [...cases];
    const worker = async (): Promise<void> => {
      for (let c = queue.shift(); c !== undefined; c = queue.shift()) {
        const point = c.name.split('killed ')[1];
        c.child = await runChild({
          op: 'merge',
          target: c.target,
          runDir,
          shardSizeMiB: SHARD_MIB,
          rows: { prefix: 'B', count: 45, seed: 12 },
          mergeKey: MERGE_KEY,
          crashAt: point,
        });
      }
    };
    await Promise.all([worker(), worker()]);

    // Rollback killed after restoring state.json, before removing the undone merge's shards.
    const rb = path.join(tmp.dir, 'rollback');
    await cp(base, rb, { recursive: true });
    await mergeIntoTarget({ target: rb, newRows: B, runDir, shardSizeMiB: SHARD_MIB });
    cases.push({
      name: 'rollback killed rollback-after-swap',
      op: 'rollback',
      target: rb,
      before: [...A, ...B],
      after: A,
      expect: 'after',
      child: await runChild({ op: 'rollback', target: rb, runDir, crashAt: 'rollback-after-swap' }),
    });

    afterCrash = (
      await runPythonJson<{ results: PyLoad[] }>('hf_datasets.py', [], {
        ops: cases.map((c) => ({ op: 'load', dir: c.target, data: true })),
      })
    ).results;

    // The retried merge (or, after the rollback, the next merge) repairs whatever the crash
    // left and goes through.
    for (const c of cases) {
      try {
        const r =
          c.op === 'merge'
            ? await mergeIntoTarget({
                target: c.target,
                newRows: B,
                runDir,
                shardSizeMiB: SHARD_MIB,
                mergeKey: MERGE_KEY,
              })
            : await mergeIntoTarget({ target: c.target, newRows: C, runDir, shardSizeMiB: SHARD_MIB });
        retriedAlreadyMerged.push(r.alreadyMerged);
        repairs.push(r.repaired);
      } catch (e: unknown) {
        retriedAlreadyMerged.push(undefined);
        repairs.push([`merge failed: ${e instanceof Error ? e.message : String(e)}`]);
      }
    }
    afterRepair = (
      await runPythonJson<{ results: PyLoad[] }>('hf_datasets.py', [], {
        ops: cases.map((c) => ({ op: 'load', dir: c.target, data: true })),
      })
    ).results;
  }, 180_000);

  const expectDataset = (py: PyLoad | undefined, rows: HfRow[] | null, label: string): void => {
    if (rows === null) {
      expect(py?.ok, `${label}: no dataset expected`).toBe(false);
      return;
    }
    expect(py?.error, label).toBeUndefined();
    expect(py?.num_rows, label).toBe(rows.length);
    expect(py?.data?.['id'], label).toEqual(rows.map((r) => r.id));
    expect(py?.data?.['input_ids'], label).toEqual(rows.map((r) => r.input_ids));
    expect(py?.data?.['loss_mask'], label).toEqual(rows.map((r) => r.loss_mask));
  };

  it('the child really died by SIGKILL at its crash point', () => {
    for (const c of cases) expect(c.child?.signal, `${c.name}: ${c.child?.stderr ?? ''}`).toBe('SIGKILL');
  });

  it('after the crash, Python loads the old or the new dataset, never a mix', () => {
    cases.forEach((c, i) => expectDataset(afterCrash[i], c.expect === 'before' ? c.before : c.after, c.name));
  });

  it('the retried merge repairs the leftovers and ends with the new rows exactly once', async () => {
    for (const [i, c] of cases.entries()) {
      expect(repairs[i]?.join('\n') ?? '', c.name).not.toMatch(/^merge failed/);
      if (c.op === 'merge') {
        expectDataset(afterRepair[i], c.after, `${c.name}, then retried`);
        expect(retriedAlreadyMerged[i], `${c.name}: retry skipped because already committed`).toBe(
          c.expect === 'after',
        );
      } else {
        expectDataset(afterRepair[i], [...c.after, ...C], `${c.name}, then merged again`);
      }
      // Nothing but the listed shards, the metadata and the control folder remains.
      const state = JSON.parse(await readFile(path.join(c.target, 'state.json'), 'utf8')) as {
        _data_files: { filename: string }[];
      };
      const listed = state._data_files.map((f) => f.filename).sort();
      const present = (await readdir(c.target))
        .filter((n) => n !== 'state.json' && n !== 'dataset_info.json' && n !== '.tokenmill')
        .sort();
      expect(present, c.name).toEqual(listed);
      expect((await readdir(path.join(c.target, '.tokenmill'))).sort(), c.name).toEqual(['history', 'index']);
      // The id index: one file per listed shard; those of an undone merge went with its shards.
      expect((await readdir(path.join(c.target, '.tokenmill', 'index'))).sort(), c.name).toEqual(
        listed.map((f) => `${f}.keys`),
      );
    }
    const siblings = (await readdir(tmp.dir)).filter((n) => n.includes('.merge-') || n.endsWith('.lock'));
    expect(siblings).toEqual([]);
  });

  it('the repair said what it did when there was something to undo', () => {
    const byName = new Map(cases.map((c, i) => [c.name, repairs[i] ?? []]));
    expect(byName.get('merge into an existing target, killed between-renames')?.join('\n')).toMatch(
      /removed merge .* not in effect/,
    );
    expect(byName.get('merge into an existing target, killed after-link')?.join('\n')).toMatch(
      /removed staging folder/,
    );
    expect(byName.get('first merge, killed after-journal')?.join('\n')).toMatch(/removed unfinished merge folder/);
    expect(byName.get('rollback killed rollback-after-swap')?.join('\n')).toMatch(/removed merge .* not in effect/);
  });

  it('a rollback after the repairs restores the dataset before the retried merge', async () => {
    const c = cases.find((x) => x.name === 'merge into an existing target, killed between-renames') as Case;
    const r = await rollbackTarget({ target: c.target, runDir });
    expect(r.restored.rows).toBe(A.length);
    expect(r.removedFiles.length).toBeGreaterThan(0);
    const again = await mergeIntoTarget({
      target: c.target,
      newRows: B,
      runDir,
      shardSizeMiB: SHARD_MIB,
      mergeKey: MERGE_KEY,
    });
    expect(again.alreadyMerged).toBe(false);
    expect(again.report.rows).toBe(A.length + B.length);
  });
});
