// Incremental tokenize: a round reads only the generation lines written since the last merged
// round (offsets committed with the training dataset's version), and stays exact when those
// offsets cannot be trusted:
// - a second round reads only the lines appended to a part file and the lines of a new part;
//   a round with nothing new reads nothing; a last line without its newline is read again once
//   complete;
// - a merge killed before its swap leaves the old offsets: the next round reads those lines
//   again and merges each row once; a merge killed after its swap leaves nothing to read again;
// - a generations folder rewritten (a part shorter, or different bytes) is read in full, with a
//   log line, and rows already merged are not added again;
// - other tokenize settings (keepTruncated) read every line again;
// - the target, with its .tokenmill/index and offsets, loads in Python with every row once.
import { spawnSync } from 'node:child_process';
import { openSync, readFileSync, readdirSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { createRootLogger, readHfDataset, readCommittedOffsets, type ChatTokenizer } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import {
  appendRecords,
  bundledTokenizer,
  fullRound,
  generationRecord,
  generationsDir,
  tokenizeRound,
  type RoundSetup,
} from '../helpers/incremental-round.js';
import { repoRoot } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';

const { tmp } = useHarness({ tmp: 'tm-inc-tokenize-' });
let tok: ChatTokenizer;
let logFile: string;

beforeAll(async () => {
  logFile = path.join(tmp.dir, 'log.ndjson');
  createRootLogger({ level: 'info', destination: openSync(logFile, 'a') });
  tok = await bundledTokenizer();
});

function setup(name: string, datasets: string[] = ['A']): RoundSetup {
  const dir = path.join(tmp.dir, name);
  return {
    runDir: path.join(dir, 'run'),
    target: path.join(dir, 'target'),
    datasets,
    logger: createRootLogger({ level: 'info', destination: openSync(logFile, 'a') }),
  };
}

const recs = (dataset: string, ids: string[], finish: 'stop' | 'length' = 'stop') =>
  ids.map((id) => generationRecord(tok, dataset, id, finish));

async function targetKeys(target: string): Promise<string[]> {
  const ds = await readHfDataset(target);
  const out: string[] = [];
  for await (const r of ds.rows()) out.push(`${String(r['dataset'])}/${String(r['id'])}`);
  return out.sort();
}

function logLines(msg: string): Record<string, unknown>[] {
  return readFileSync(logFile, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l['msg'] === msg);
}

describe('incremental tokenize', () => {
  it('a second round reads only the lines written since; a round with nothing new reads nothing', async () => {
    const s = setup('second');
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1', 'a-2']));
    const r1 = await fullRound(s);
    expect(r1.merged.status).toBe('merged');
    expect(r1.results[0]).toMatchObject({ lines: 3, rows: 3, alreadyMerged: 0 });

    // The sink appends to the part it has open and starts a new one.
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-3', 'a-4']));
    appendRecords(s.runDir, 'A', 1, recs('A', ['a-5']));
    const r2 = await fullRound(s);
    expect(r2.results[0]).toMatchObject({ lines: 3, rows: 3, alreadyMerged: 0, duplicates: 0 });
    expect(r2.merged.report).toMatchObject({ oldRows: 3, newRows: 3, rows: 6 });
    const committed = await readCommittedOffsets(s.target);
    const partSize = (n: number) =>
      readFileSync(path.join(generationsDir(s.runDir, 'A'), `part-0000${n}.jsonl`)).length;
    expect(committed.datasets['A']?.files).toMatchObject({
      'part-00000.jsonl': { bytes: partSize(0), lines: 5 },
      'part-00001.jsonl': { bytes: partSize(1), lines: 1 },
    });

    const r3 = await fullRound(s);
    expect(r3.results[0]).toMatchObject({ lines: 0, rows: 0, alreadyMerged: 0 });
    expect(r3.merged.status).toBe('nothing-new');
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-3', 'A/a-4', 'A/a-5']);
  });

  it('a line repeated after the offset (a re-delivered result) counts as already merged, not added', async () => {
    const s = setup('redelivered');
    const first = recs('A', ['a-0', 'a-1']);
    appendRecords(s.runDir, 'A', 0, first);
    await fullRound(s);
    appendRecords(s.runDir, 'A', 0, [first[1]!, ...recs('A', ['a-2'])]);
    const r2 = await fullRound(s);
    expect(r2.results[0]).toMatchObject({ lines: 2, rows: 1, alreadyMerged: 1 });
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2']);
  });

  it('a last line without its newline is read, and read again once complete (offsets stop at complete lines)', async () => {
    const s = setup('torn');
    const part0 = appendRecords(s.runDir, 'A', 0, recs('A', ['a-0']));
    writeFileSync(part0, JSON.stringify(recs('A', ['a-1'])[0]), { flag: 'a' });
    const r1 = await fullRound(s);
    expect(r1.results[0]).toMatchObject({ lines: 2, rows: 2 });
    expect((await readCommittedOffsets(s.target)).datasets['A']?.files['part-00000.jsonl']?.lines).toBe(1);
    writeFileSync(part0, '\n', { flag: 'a' });
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-2']));
    const r2 = await fullRound(s);
    expect(r2.results[0]).toMatchObject({ lines: 2, rows: 1, alreadyMerged: 1 });
    expect((await readCommittedOffsets(s.target)).datasets['A']?.files['part-00000.jsonl']?.lines).toBe(3);
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2']);
  });

  for (const crashAt of ['after-journal', 'after-swap'] as const) {
    it(`a merge killed at ${crashAt} leaves offsets that match the target: every row once`, async () => {
      const s = setup(`crash-${crashAt}`);
      appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1']));
      await fullRound(s);
      appendRecords(s.runDir, 'A', 0, recs('A', ['a-2', 'a-3']));
      const { flowId, results } = await tokenizeRound(s);
      expect(results[0]).toMatchObject({ lines: 2, rows: 2 });
      const jobFile = path.join(s.runDir, `child-${crashAt}.json`);
      writeFileSync(
        jobFile,
        JSON.stringify({
          setup: { runDir: s.runDir, target: s.target, datasets: s.datasets },
          flowId,
          results,
          crashAt,
        }),
      );
      const child = spawnSync(
        process.execPath,
        ['--import', 'tsx', path.join(repoRoot, 'test/helpers/incremental-merge-child.ts'), jobFile],
        { cwd: repoRoot, encoding: 'utf8' },
      );
      expect(child.signal).toBe('SIGKILL');

      const committed = await readCommittedOffsets(s.target);
      const swapped = crashAt === 'after-swap';
      expect(committed.datasets['A']?.files['part-00000.jsonl']?.lines).toBe(swapped ? 4 : 2);
      const r3 = await fullRound(s);
      // Before the swap: the two lines are read again and merged; after it: nothing to read.
      expect(r3.results[0]).toMatchObject(swapped ? { lines: 0, rows: 0 } : { lines: 2, rows: 2, alreadyMerged: 0 });
      expect(r3.merged.status).toBe(swapped ? 'nothing-new' : 'merged');
      expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-3']);
    });
  }

  it('a rewritten or shortened generations folder is read in full, with a log line, and stays exact', async () => {
    const s = setup('rewritten');
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1', 'a-2']));
    await fullRound(s);
    // Shortened: part 0 cut to its first line, and a new record in it.
    const part0 = path.join(generationsDir(s.runDir, 'A'), 'part-00000.jsonl');
    const firstLine = readFileSync(part0, 'utf8').split('\n')[0] ?? '';
    truncateSync(part0, Buffer.byteLength(firstLine) + 1);
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-9']));
    const r2 = await fullRound(s);
    expect(r2.results[0]).toMatchObject({ lines: 2, rows: 1, alreadyMerged: 1 });
    const full = logLines('reading every generation line of the dataset (no usable offsets)');
    expect(full.some((l) => String(l['reason']).includes('part-00000.jsonl has'))).toBe(true);

    // Rewritten with the same length: other bytes where the offset says "already read".
    const text = readFileSync(part0, 'utf8');
    writeFileSync(part0, text.replace('a-0', 'a-7'));
    const r3 = await fullRound(s);
    expect(r3.results[0]).toMatchObject({ lines: 2, rows: 1, alreadyMerged: 1 });
    expect(
      logLines('reading every generation line of the dataset (no usable offsets)').some((l) =>
        String(l['reason']).includes('rewritten'),
      ),
    ).toBe(true);

    // A part that disappeared.
    appendRecords(s.runDir, 'A', 1, recs('A', ['a-5']));
    await fullRound(s);
    rmSync(path.join(generationsDir(s.runDir, 'A'), 'part-00001.jsonl'));
    const r5 = await fullRound(s);
    expect(r5.results[0]).toMatchObject({ lines: 2, rows: 0, alreadyMerged: 2 });
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-5', 'A/a-7', 'A/a-9']);
  });

  it('other tokenize settings read every line again: truncated lines dropped before are kept now', async () => {
    const s = setup('settings');
    appendRecords(s.runDir, 'A', 0, [...recs('A', ['a-0']), ...recs('A', ['a-cut'], 'length')]);
    const r1 = await fullRound(s);
    expect(r1.results[0]).toMatchObject({ lines: 2, rows: 1, droppedTruncated: 1 });
    const r2 = await fullRound({ ...s, keepTruncated: true });
    expect(r2.results[0]).toMatchObject({ lines: 2, rows: 1, alreadyMerged: 1, keptTruncated: 1 });
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-cut']);
  });

  it('the target with its index and offsets loads in Python with every row once', async () => {
    const targets = readdirSync(tmp.dir)
      .map((d) => path.join(tmp.dir, d, 'target'))
      .filter((t) => {
        try {
          return readdirSync(t).includes('state.json');
        } catch {
          return false;
        }
      });
    expect(targets.length).toBeGreaterThanOrEqual(5);
    const script = [
      'import json, sys, datasets',
      'out = {}',
      'for t in json.loads(sys.argv[1]):',
      '    ds = datasets.load_from_disk(t)',
      '    out[t] = sorted(f"{d}/{i}" for d, i in zip(ds["dataset"], ds["id"]))',
      'print(json.dumps(out))',
    ].join('\n');
    const scriptFile = path.join(tmp.dir, 'load.py');
    writeFileSync(scriptFile, script);
    const loaded = await runPythonJson<Record<string, string[]>>(scriptFile, [JSON.stringify(targets)]);
    for (const t of targets) expect(loaded[t]).toEqual(await targetKeys(t));
  });
});
