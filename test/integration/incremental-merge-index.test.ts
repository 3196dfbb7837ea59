// The merge id index beside the training dataset (`.tokenmill/index/`): the merge and the
// tokenize step look sample keys up in it instead of reading the shards, and it stays exact:
// - a merge never reads an old shard (one made unreadable, same size and time, does not stop it)
//   and reports the old counts from the index;
// - a new row the target already holds refuses the merge, target unchanged;
// - a missing index, or an index file that describes another shard, is rebuilt from the shards
//   with a log line, and rows still go in exactly once;
// - a target written without any index or offsets (an older tokenmill) merges exactly, and a
//   round with nothing new into it records its index and offsets;
// - two datasets with the same ids stay distinct, in the index and in the target.
import {
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
  copyFileSync,
  existsSync,
} from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  DatasetMergeError,
  createRootLogger,
  indexFileOf,
  mergeIntoTarget,
  readDatasetMeta,
  readHfDataset,
  writeHfDataset,
  type ChatTokenizer,
  type HfRow,
} from '../../src/shared/index.js';
import { makeRows } from '../fixtures/hf/rows.js';
import { useHarness } from '../helpers/fixture.js';
import {
  appendRecords,
  bundledTokenizer,
  fullRound,
  generationRecord,
  type RoundSetup,
} from '../helpers/incremental-round.js';

const { tmp } = useHarness({ tmp: 'tm-inc-index-' });
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

const recs = (dataset: string, ids: string[]) => ids.map((id) => generationRecord(tok, dataset, id));

async function targetKeys(target: string): Promise<string[]> {
  const ds = await readHfDataset(target);
  const out: string[] = [];
  for await (const r of ds.rows()) out.push(`${String(r['dataset'])}/${String(r['id'])}`);
  return out.sort();
}

function rebuildLogs(dir: string): { shard: string; why: string }[] {
  return readFileSync(logFile, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l['msg'] === 'merge index: building the index of a shard from its rows' && l['dir'] === dir)
    .map((l) => ({ shard: String(l['shard']), why: String(l['why']) }));
}

function indexFiles(target: string): string[] {
  const dir = path.join(target, '.tokenmill', 'index');
  return existsSync(dir)
    ? readdirSync(dir)
        .filter((n) => n.endsWith('.keys'))
        .sort()
    : [];
}

describe('the merge id index', () => {
  it('a merge reads no old shard: the counts come from the index, and an existing key refuses the merge', async () => {
    const target = path.join(tmp.dir, 'no-read', 'target');
    const runDir = path.join(tmp.dir, 'no-read', 'run');
    const first = makeRows('A-old', 300, 1);
    await mergeIntoTarget({ target, runDir, shardSizeMiB: 0.01, newRows: first, requireSampleKey: true });
    await mergeIntoTarget({
      target,
      runDir,
      shardSizeMiB: 0.01,
      newRows: makeRows('A-mid', 200, 2),
      requireSampleKey: true,
    });
    const meta = await readDatasetMeta(target);
    expect(meta.shards.length).toBeGreaterThan(3);
    expect(indexFiles(target)).toHaveLength(meta.shards.length);

    // Every shard but the first (whose schema the merge reads) is garbage of the same size and time.
    const saved = new Map<string, Buffer>();
    for (const s of meta.shards.slice(1)) {
      const file = path.join(target, s);
      const st = statSync(file);
      saved.set(s, readFileSync(file));
      writeFileSync(file, Buffer.alloc(st.size, 0xff));
      utimesSync(file, st.atime, st.mtime);
    }
    const r = await mergeIntoTarget({
      target,
      runDir,
      shardSizeMiB: 0.01,
      newRows: makeRows('A-new', 50, 3),
      requireSampleKey: true,
    });
    expect(r.report).toMatchObject({ ok: true, oldRows: 500, newRows: 50, rows: 550 });
    for (const [s, buf] of saved) {
      const file = path.join(target, s);
      const st = statSync(file);
      writeFileSync(file, buf);
      utimesSync(file, st.atime, st.mtime);
    }
    expect(await targetKeys(target)).toHaveLength(550);

    // A row the target holds (A/A-mid-7), among new ones: refused, nothing added.
    const before = readFileSync(path.join(target, 'state.json'), 'utf8');
    const again = [...makeRows('A-late', 3, 4), makeRows('A-mid', 8, 2)[7] as HfRow];
    const err = await mergeIntoTarget({
      target,
      runDir,
      shardSizeMiB: 0.01,
      newRows: again,
      requireSampleKey: true,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toMatch(/1 new rows are already in the target \("A\/A-mid-7"\)/);
    expect(readFileSync(path.join(target, 'state.json'), 'utf8')).toBe(before);
  });

  it('a missing index is rebuilt from the shards, with a log line, and rows go in once', async () => {
    const s = setup('missing');
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1', 'a-2']));
    await fullRound(s);
    rmSync(path.join(s.target, '.tokenmill', 'index'), { recursive: true });
    // A re-delivered a-1 after the offset, and a new a-3.
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-1', 'a-3']));
    const r = await fullRound(s);
    expect(r.results[0]).toMatchObject({ lines: 2, rows: 1, alreadyMerged: 1 });
    expect(rebuildLogs(s.target).map((l) => l.why)).toContain('missing');
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-3']);
    const shards = (await readDatasetMeta(s.target)).shards;
    expect(indexFiles(s.target)).toEqual(shards.map((sh) => path.basename(indexFileOf(s.target, sh))).sort());
  });

  it('an index file that describes another shard is rebuilt, and lookups stay exact', async () => {
    const s = setup('stale');
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1']));
    await fullRound(s);
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-2', 'a-3']));
    await fullRound(s);
    const [s0, s1] = (await readDatasetMeta(s.target)).shards;
    // Shard 1's index replaced by shard 0's: it would say a-2 and a-3 are not there.
    copyFileSync(indexFileOf(s.target, s0 as string), indexFileOf(s.target, s1 as string));
    rmSync(path.join(s.target, '.tokenmill', 'offsets'), { recursive: true });
    const r = await fullRound(s);
    expect(r.results[0]).toMatchObject({ lines: 4, rows: 0, alreadyMerged: 4 });
    expect(rebuildLogs(s.target)).toContainEqual({ shard: s1, why: 'made from another file' });
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-3']);
  });

  it('a target written without index or offsets (an older tokenmill) merges exactly, and gets its index', async () => {
    const s = setup('older');
    const old = (id: string): HfRow => ({
      id,
      dataset: 'A',
      input_ids: [1, 2, 3],
      loss_mask: [0, 1, 1],
      num_tokens: 3,
      finish_reason: 'stop',
    });
    await writeHfDataset(s.target, [old('a-0'), old('a-1'), { ...old('a-1'), dataset: 'B' }], { shardSizeMiB: 1 });
    expect(existsSync(path.join(s.target, '.tokenmill'))).toBe(false);
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1', 'a-2', 'a-3']));
    const r = await fullRound(s);
    expect(r.results[0]).toMatchObject({ lines: 4, rows: 2, alreadyMerged: 2 });
    expect(r.merged.report).toMatchObject({ oldRows: 3, newRows: 2, rows: 5 });
    expect(await targetKeys(s.target)).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-3', 'B/a-1']);
    expect(indexFiles(s.target)).toHaveLength((await readDatasetMeta(s.target)).shards.length);
  });

  it('a round with nothing new into an older target writes its index and offsets: the next round reads nothing', async () => {
    const s = setup('older-nothing-new');
    const old = (id: string): HfRow => ({
      id,
      dataset: 'A',
      input_ids: [1, 2, 3],
      loss_mask: [0, 1, 1],
      num_tokens: 3,
      finish_reason: 'stop',
    });
    await writeHfDataset(s.target, [old('a-0'), old('a-1')], { shardSizeMiB: 1 });
    appendRecords(s.runDir, 'A', 0, recs('A', ['a-0', 'a-1']));
    const r1 = await fullRound(s);
    expect(r1.merged.status).toBe('nothing-new');
    expect(r1.results[0]).toMatchObject({ lines: 2, rows: 0, alreadyMerged: 2 });
    expect(indexFiles(s.target)).toHaveLength(1);
    const rebuilt = rebuildLogs(s.target).length;
    const r2 = await fullRound(s);
    expect(r2.results[0]).toMatchObject({ lines: 0, rows: 0 });
    expect(rebuildLogs(s.target)).toHaveLength(rebuilt);
  });

  it('two datasets with the same ids stay distinct', async () => {
    const s = setup('same-ids', ['A', 'B']);
    appendRecords(s.runDir, 'A', 0, recs('A', ['x-0', 'x-1']));
    appendRecords(s.runDir, 'B', 0, recs('B', ['x-0', 'x-1', 'x-2']));
    const r1 = await fullRound(s);
    expect(r1.merged.report).toMatchObject({ newRows: 5 });
    // x-2 is in the target for B only: A's x-2 is new.
    appendRecords(s.runDir, 'A', 0, recs('A', ['x-2']));
    // Read everything again: every key of both datasets is found, A/x-2 is not.
    rmSync(path.join(s.target, '.tokenmill', 'offsets'), { recursive: true });
    const r2 = await fullRound(s);
    const byName = Object.fromEntries(r2.results.map((d) => [d.dataset, d]));
    expect(byName['A']).toMatchObject({ lines: 3, rows: 1, alreadyMerged: 2 });
    expect(byName['B']).toMatchObject({ lines: 3, rows: 0, alreadyMerged: 3 });
    expect(await targetKeys(s.target)).toEqual(['A/x-0', 'A/x-1', 'A/x-2', 'B/x-0', 'B/x-1', 'B/x-2']);
  });
});
