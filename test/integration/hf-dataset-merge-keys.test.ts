// Merging into targets tokenmill cannot match rows with, the merge lock after a PID was reused,
// and rows without end-of-turn supervision:
// - a target made by Python `datasets` in SpecForge's pre-tokenized shape (`{input_ids,
//   loss_mask}`), or with `id` but no `dataset`, is refused by the round (both its tokenize step
//   and its merge) with a message naming the missing columns and the fix; the fix, run as the
//   message spells it, makes the target mergeable, and rows are then added exactly once;
// - a lock naming this very process's PID with another start time (a restarted container) is
//   cleared; one with the right start time is respected;
// - a round whose datasets have more than 5 % of rows without end-of-turn supervision says so
//   in the report's warnings and in a warn log.
import { createHash } from 'node:crypto';
import { openSync, readFileSync } from 'node:fs';
import { readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { createRootLogger, logger } from '../../src/shared/logger.js';
import { DatasetMergeError, mergeIntoTarget, writeHfDataset, type HfRow } from '../../src/shared/hf-dataset/index.js';
import type { TokenizeResult } from '../../src/shared/index.js';
import { mergedSampleIds, processMerge } from '../../src/workers/postprocess/processor.js';
import { makeRows, toColumns, type PyLoad } from '../fixtures/hf/rows.js';
import { useHarness } from '../helpers/fixture.js';
import { runPython, runPythonJson } from '../helpers/python.js';

const V = (dtype: string): Record<string, string> => ({ dtype, _type: 'Value' });
const S = (dtype: string): Record<string, unknown> => ({ feature: V(dtype), _type: 'List' });

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

/** Start time of this process as Linux records it: field 22 of /proc/self/stat. */
function myStartTime(): string {
  const text = readFileSync('/proc/self/stat', 'utf8');
  const start = text.slice(text.lastIndexOf(')') + 2).split(' ')[19];
  if (start === undefined) throw new Error('no start time in /proc/self/stat');
  return start;
}

const { tmp } = useHarness({ tmp: 'tm-hf-merge-keys-' });
let logFile: string;
const paths = (name: string): string => path.join(tmp.dir, name);

beforeAll(async () => {
  logFile = paths('log.ndjson');
  const fd = openSync(logFile, 'a');
  createRootLogger({ level: 'warn', destination: fd });
});

describe('a target without the sample-key columns dataset and id', () => {
  const old = makeRows('specforge', 52, 11);
  const fresh = makeRows('B1_glaive', 50, 12);
  let keyError: unknown;

  beforeAll(async () => {
    const cols = toColumns(old);
    await runPythonJson('hf_datasets.py', [], {
      ops: [
        {
          op: 'save',
          dir: paths('pretok'),
          columns: { input_ids: cols['input_ids'], loss_mask: cols['loss_mask'] },
          features: { input_ids: S('int64'), loss_mask: S('int64') },
        },
        {
          op: 'save',
          dir: paths('ids-only'),
          columns: { id: cols['id'], input_ids: cols['input_ids'], loss_mask: cols['loss_mask'] },
          features: { id: V('string'), input_ids: S('int64'), loss_mask: S('int64') },
        },
      ],
    });
  }, 180_000);

  it('the round refuses the pre-tokenized target, naming both columns and the fix; nothing is added', async () => {
    const target = paths('pretok');
    const before = await fingerprintTree(target);
    // The tokenize step asks for the target's ids first: refused there, before anything is staged.
    keyError = await mergedSampleIds(target, 'B1_glaive').catch((e: unknown) => e);
    expect(keyError).toBeInstanceOf(DatasetMergeError);
    expect((keyError as Error).message).toMatch(
      /has no column dataset and no column id, so its rows cannot be matched/,
    );
    expect((keyError as Error).message).toMatch(
      /add_column\("dataset", \["<name>"\] \* len\(ds\)\)\.add_column\("id", \[str\(i\) for i in range\(len\(ds\)\)\]\)/,
    );
    // The merge of a round refuses it too (a target swapped in between both steps).
    const err = await mergeIntoTarget({
      target,
      newRows: fresh,
      runDir: paths('run'),
      shardSizeMiB: 1,
      requireSampleKey: true,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toMatch(/no column dataset and no column id/);
    expect(await fingerprintTree(target)).toEqual(before);
  });

  it('a target with id but no dataset column is refused, naming dataset only', async () => {
    const err = await mergedSampleIds(paths('ids-only'), 'B1_glaive').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toMatch(/it has no column dataset, so/);
    expect((err as Error).message).not.toMatch(/no column id/);
    const merged = await mergeIntoTarget({
      target: paths('ids-only'),
      newRows: fresh,
      runDir: paths('run'),
      shardSizeMiB: 1,
      requireSampleKey: true,
    }).catch((e: unknown) => e);
    expect((merged as Error).message).toMatch(/it has no column dataset, so/);
  });

  it('the fix as the message spells it makes the target mergeable, and rows go in exactly once', async () => {
    const m = /— (ds = datasets\.load_from_disk\(OLD\);.*?ds\.save_to_disk\(NEW\)) —/.exec((keyError as Error).message);
    expect(m).not.toBeNull();
    const fixed = paths('pretok-keyed');
    const script = paths('fix.py');
    const code = (m?.[1] ?? '')
      .replace('OLD', JSON.stringify(paths('pretok')))
      .replace('NEW', JSON.stringify(fixed))
      .replace('"<name>"', '"specforge"')
      .split('; ')
      .join('\n');
    await writeFile(script, `import datasets\n${code}\n`);
    await runPython(script);

    // What a round does: skip the rows the target holds, merge the rest; twice with the same rows.
    const rounds: number[] = [];
    for (let round = 0; round < 2; round++) {
      const have = await mergedSampleIds(fixed, 'B1_glaive');
      const rows = fresh.filter((r) => !have.has(r.id));
      if (rows.length > 0) {
        await mergeIntoTarget({
          target: fixed,
          newRows: rows,
          runDir: paths('run'),
          shardSizeMiB: 1,
          requireSampleKey: true,
          mergeKey: `round-${round}`,
        });
      }
      rounds.push(rows.length);
    }
    expect(rounds).toEqual([50, 0]);
    const loaded = await runPythonJson<{ results: PyLoad[] }>('hf_datasets.py', [], {
      ops: [{ op: 'load', dir: fixed, data: true }],
    });
    const py = loaded.results[0];
    expect(py?.error).toBeUndefined();
    expect(py?.num_rows).toBe(52 + 50);
    expect(py?.data?.['input_ids']).toEqual([...old, ...fresh].map((r) => r.input_ids));
    expect(py?.data?.['dataset']).toEqual([...old.map(() => 'specforge'), ...fresh.map((r) => r.dataset)]);
  });
});

describe('the merge lock after a restart reused the PID', () => {
  const rows = (n: number): HfRow[] => makeRows('L', n, 21);

  it('a lock naming this PID with another start time is cleared', async () => {
    const target = paths('lock-reused');
    const lockPath = `${target}.lock`;
    const stale = {
      pid: process.pid,
      host: hostname(),
      since: '2026-01-01T00:00:00.000Z',
      startTime: String(Number(myStartTime()) + 4242),
    };
    await writeFile(lockPath, JSON.stringify(stale));
    const r = await mergeIntoTarget({ target, newRows: rows(8), runDir: paths('run'), shardSizeMiB: 1 });
    expect(r.report.rows).toBe(8);
    expect(await readdir(tmp.dir)).not.toContain('lock-reused.lock');
    const log = await readFile(logFile, 'utf8');
    expect(log).toMatch(/removing a stale lock/);
    expect(log).toMatch(/the PID was reused/);
  });

  it('a lock of this live process with its own start time is respected', async () => {
    const target = paths('lock-live');
    const lockPath = `${target}.lock`;
    const live = { pid: process.pid, host: hostname(), since: new Date().toISOString(), startTime: myStartTime() };
    await writeFile(lockPath, JSON.stringify(live));
    const err = await mergeIntoTarget({ target, newRows: rows(8), runDir: paths('run'), shardSizeMiB: 1 }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toMatch(new RegExp(`is locked by process ${process.pid} on `));
    expect(JSON.parse(await readFile(lockPath, 'utf8'))).toEqual(live);
    await rm(lockPath);
  });

  it('the lock a merge takes records its start time', async () => {
    const target = paths('lock-own');
    const seen: unknown[] = [];
    await mergeIntoTarget({
      target,
      newRows: rows(4),
      runDir: paths('run'),
      shardSizeMiB: 1,
      verifyMerged: async () => {
        seen.push(JSON.parse(await readFile(`${target}.lock`, 'utf8')));
        return [];
      },
    });
    expect(seen).toEqual([expect.objectContaining({ pid: process.pid, startTime: myStartTime() })]);
  });
});

describe('rows without end-of-turn supervision', () => {
  function tokenizeResult(
    dataset: string,
    stagedDir: string,
    rows: number,
    stopWithoutEndOfTurn: number,
  ): TokenizeResult {
    return {
      dataset,
      kind: 'generations',
      stagedDir,
      lines: rows,
      rows,
      tokens: 0,
      supervisedTokens: 0,
      alreadyMerged: 0,
      keptTruncated: 0,
      stopWithoutEndOfTurn,
      droppedTruncated: 0,
      droppedAborted: 0,
      droppedEmpty: 0,
      droppedUnsupervised: 0,
      duplicates: 0,
      invalid: 0,
      invalidExamples: [],
      durationMs: 1,
    };
  }

  it('a round where more than 5 % of a dataset\u2019s rows lack it says so in the report and the log; 5 % or less does not', async () => {
    const target = paths('eot-target');
    await mergeIntoTarget({ target, newRows: makeRows('seed', 5, 31), runDir: paths('run'), shardSizeMiB: 1 });
    await writeHfDataset(paths('staged/A'), makeRows('A', 100, 32), { shardSizeMiB: 1 });
    await writeHfDataset(paths('staged/B'), makeRows('B', 100, 33), { shardSizeMiB: 1 });
    const result = await processMerge(
      { flowId: 'round-eot', target, runDir: paths('run'), shardSizeMiB: 1, mergeKey: 'round-eot/1' },
      {
        childResults: () =>
          Promise.resolve([
            tokenizeResult('A', paths('staged/A'), 100, 6),
            tokenizeResult('B', paths('staged/B'), 100, 5),
          ]),
        setPhase: () => Promise.resolve(),
        roundCompleted: () => Promise.resolve(),
        logger: logger('postprocess-test'),
      },
    );
    expect(result.status).toBe('merged');
    const warnings = result.report?.warnings ?? [];
    expect(warnings.filter((w) => /end-of-turn/.test(w))).toEqual([
      expect.stringMatching(
        /^dataset A: 6 of 100 rows \(6%, more than 5%\) stopped without the end-of-turn token.*stop-token handling/,
      ),
    ]);
    const full = JSON.parse(await readFile(result.report?.reportPath ?? '', 'utf8')) as {
      warnings: string[];
      ok: boolean;
    };
    expect(full.ok).toBe(true);
    expect(full.warnings.some((w) => w.startsWith('dataset A: 6 of 100'))).toBe(true);
    const log = (await readFile(logFile, 'utf8')).split('\n').filter((l) => l.includes('end-of-turn supervision'));
    expect(log).toHaveLength(1);
    expect(log[0]).toMatch(/"level":40/);
  });
});
