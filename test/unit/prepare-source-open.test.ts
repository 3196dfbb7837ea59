import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import type { PromptSource } from '../../src/shared/config/source.js';
import { naturalCompare } from '../../src/producers/prepare/source-files.js';
import { openSource, SourceError } from '../../src/producers/prepare/source.js';
import type { SourceRow } from '../../src/producers/prepare/source-types.js';
import { useTempDir } from '../helpers/temp.js';

const root = useTempDir('tm-source-open-');

let n = 0;
/** A fresh folder holding `files` (relative path → content). */
function folder(files: Record<string, string>): string {
  const dir = path.join(root, `d${n++}`);
  mkdirSync(dir, { recursive: true });
  for (const [rel, content] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    writeFileSync(path.join(dir, rel), content);
  }
  return dir;
}

const jsonl = (...rows: unknown[]): string =>
  `${rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n')}\n`;
const src = (p: string, extra: Partial<PromptSource> = {}): PromptSource => ({ path: p, format: 'auto', ...extra });

async function rowsOf(s: PromptSource): Promise<SourceRow[]> {
  const out: SourceRow[] = [];
  for await (const r of (await openSource(s)).rows()) out.push(r);
  return out;
}

describe('openSource on JSONL', () => {
  it('detects ShareGPT and gives each row its id, turns and place; bad rows are malformed, not errors', async () => {
    const dir = folder({
      'a.jsonl': jsonl(
        {
          id: 'x1',
          conversations: [
            { from: 'human', value: 'hi' },
            { from: 'gpt', value: 'hello' },
          ],
        },
        '{"id": "x2", "conversations": [',
        { id: 'x3', conversations: [{ from: 'narrator', value: 'once' }] },
        { conversations: [{ from: 'human', value: 'no id' }] },
      ),
    });
    const file = path.join(dir, 'a.jsonl');
    const opened = await openSource(src(file));
    expect(opened).toMatchObject({
      files: [file],
      format: 'sharegpt',
      detectedFrom: 'column conversations[].from/value in the first row',
    });
    expect(opened.notes).toBeUndefined();
    const rows = await rowsOf(src(file));
    expect(rows[0]).toEqual({
      ok: true,
      id: 'x1',
      messages: [
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'hello' },
      ],
      where: { file, row: 0, line: 1 },
    });
    expect(rows[1]).toMatchObject({
      ok: false,
      where: { file, row: 1, line: 2 },
      excerpt: '{"id": "x2", "conversations": [',
    });
    expect(rows[2]).toMatchObject({
      ok: false,
      reason: expect.stringContaining('conversations[0].from is "narrator": not a known role') as unknown,
      where: { row: 2, line: 3 },
    });
    expect(rows[3]).toEqual({
      ok: true,
      messages: [{ role: 'user', content: 'no id' }],
      where: { file, row: 3, line: 4 },
    });
  });

  it('reads a folder of JSONL files recursively in natural order, skipping hidden folders and README', async () => {
    const dir = folder({
      'part-10.jsonl': jsonl({ prompt: 'ten' }),
      'part-2.jsonl': jsonl({ prompt: 'two' }),
      'sub/part-1.jsonl': jsonl({ prompt: 'sub one' }),
      '.cache/huggingface/x.jsonl': jsonl({ prompt: 'cached' }),
      'README.md': '# data',
      'dataset_infos.json': '{}',
    });
    const opened = await openSource(src(dir));
    expect(opened.files.map((f) => path.relative(dir, f))).toEqual([
      'part-2.jsonl',
      'part-10.jsonl',
      path.join('sub', 'part-1.jsonl'),
    ]);
    expect(opened.format).toBe('prompt');
    expect((await rowsOf(src(dir))).map((r) => (r.ok ? r.messages[0]?.content : r.reason))).toEqual([
      'two',
      'ten',
      'sub one',
    ]);
  });

  it('follows links to files and folders, as older hub downloads leave them', async () => {
    const cache = folder({
      'blobs/abc': jsonl({ prompt: 'linked file' }),
      'snap/data/b.jsonl': jsonl({ prompt: 'in linked folder' }),
    });
    const dir = folder({ 'a.jsonl': jsonl({ prompt: 'plain' }) });
    symlinkSync(path.join(cache, 'blobs/abc'), path.join(dir, 'c.jsonl'));
    symlinkSync(path.join(cache, 'snap/data'), path.join(dir, 'data'));
    symlinkSync(dir, path.join(dir, 'data', 'loop'));
    const opened = await openSource(src(dir));
    expect(opened.files.map((f) => path.relative(dir, f))).toEqual([
      'a.jsonl',
      'c.jsonl',
      path.join('data', 'b.jsonl'),
    ]);
    expect((await rowsOf(src(dir))).map((r) => r.ok && r.messages[0]?.content)).toEqual([
      'plain',
      'linked file',
      'in linked folder',
    ]);
  });

  it('takes the train split of a folder of split shards and says so; a pattern picks another', async () => {
    const dir = folder({
      'data/train-00000-of-00002.jsonl': jsonl({ prompt: 't0' }),
      'data/train-00001-of-00002.jsonl': jsonl({ prompt: 't1' }),
      'data/test-00000-of-00001.jsonl': jsonl({ prompt: 'e0' }),
    });
    const opened = await openSource(src(dir));
    expect(opened.files.map((f) => path.basename(f))).toEqual([
      'train-00000-of-00002.jsonl',
      'train-00001-of-00002.jsonl',
    ]);
    expect(opened.notes).toEqual([
      `${dir} holds the splits test, train: reading train (2 files); set source.path to ${path.join(dir, 'data', 'test-*.jsonl')} or the like for another`,
    ]);
    const test = await rowsOf(src(path.join(dir, 'data', 'test-*.jsonl')));
    expect(test.map((r) => r.ok && r.messages[0]?.content)).toEqual(['e0']);
  });

  it('takes train among splits named by file or folder', async () => {
    const byFile = folder({
      'data/train.jsonl': jsonl({ prompt: 'tr' }),
      'data/validation.jsonl': jsonl({ prompt: 'va' }),
    });
    const opened = await openSource(src(byFile));
    expect(opened.files).toEqual([path.join(byFile, 'data', 'train.jsonl')]);
    expect(opened.notes?.[0]).toContain(
      `set source.path to ${path.join(byFile, 'data', 'validation.jsonl')} or the like`,
    );
    const byFolder = folder({
      'test/part-0.jsonl': jsonl({ prompt: 'te' }),
      'train/part-0.jsonl': jsonl({ prompt: 'tr0' }),
      'train/part-1.jsonl': jsonl({ prompt: 'tr1' }),
    });
    expect((await rowsOf(src(byFolder))).map((r) => r.ok && r.messages[0]?.content)).toEqual(['tr0', 'tr1']);
    expect((await openSource(src(byFolder))).notes?.[0]).toBe(
      `${byFolder} holds the splits test, train: reading train (2 files); set source.path to ${path.join(byFolder, 'test')} or the like for another`,
    );
    // A folder where some files name no split is read whole.
    const mixed = folder({ 'train.jsonl': jsonl({ prompt: 'a' }), 'extra.jsonl': jsonl({ prompt: 'b' }) });
    expect((await openSource(src(mixed))).files).toHaveLength(2);
  });

  it('refuses splits without train, naming them and a pattern to set', async () => {
    const dir = folder({
      'data/train_sft-00000-of-00001.jsonl': jsonl({ prompt: 'a' }),
      'data/test_sft-00000-of-00001.jsonl': jsonl({ prompt: 'b' }),
    });
    await expect(openSource(src(dir))).rejects.toThrow(
      `source folder ${dir} holds the splits test_sft, train_sft (by file name, e.g. ${path.join('data', 'test_sft-00000-of-00001.jsonl')}); set source.path to one of them, e.g. ${path.join(dir, 'data', 'test_sft-*.jsonl')}`,
    );
  });

  it('honours an explicit format: rows of another shape are malformed, with the columns they have', async () => {
    const file = path.join(folder({ 'p.jsonl': jsonl({ question: 'q?' }) }), 'p.jsonl');
    const opened = await openSource(src(file, { format: 'openai' }));
    expect(opened.detectedFrom).toBeUndefined();
    expect(await rowsOf(src(file, { format: 'openai' }))).toMatchObject([
      { ok: false, reason: 'no column "messages" (the turns); the row has: question' },
    ]);
  });

  it('refuses to detect a format from rows that cannot be read, quoting the first', async () => {
    const file = path.join(folder({ 'bad.jsonl': 'oops\n{broken\n' }), 'bad.jsonl');
    await expect(openSource(src(file))).rejects.toThrow(
      new RegExp(`cannot detect the format: no readable row in the first 20 \\(line 1 of ${file}: not valid JSON`),
    );
  });

  it('refuses columns it cannot place, naming them', async () => {
    const file = path.join(folder({ 'x.jsonl': jsonl({ chat: 'USER: hi', n: 1 }) }), 'x.jsonl');
    await expect(openSource(src(file))).rejects.toThrow(
      `source ${file}: cannot detect the format (columns seen in line 1 of ${file}: chat (a string), n (a number))`,
    );
  });
});

describe('openSource path errors', () => {
  it('a missing path says how to download it', async () => {
    const p = path.join(root, 'nope');
    const e = await openSource(src(p)).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(SourceError);
    expect(String(e)).toContain(
      `source path ${p} does not exist: download the dataset there (huggingface-cli download <repo> --repo-type dataset --local-dir <dir>)`,
    );
  });

  it('an unknown extension is named, a compressed file is to be decompressed', async () => {
    const dir = folder({ 'a.csv': 'a,b\n', 'b.jsonl.gz': 'x' });
    await expect(openSource(src(path.join(dir, 'a.csv')))).rejects.toThrow(
      /a\.csv: unknown extension \.csv: a source is a \.jsonl, \.json, \.parquet or \.arrow file/,
    );
    await expect(openSource(src(path.join(dir, 'b.jsonl.gz')))).rejects.toThrow(
      /unknown extension \.gz: .*; decompress it first$/,
    );
  });

  it('an empty folder, or one without data files, says what it has', async () => {
    const empty = folder({});
    await expect(openSource(src(empty))).rejects.toThrow(
      `source folder ${empty} holds no .jsonl, .json, .parquet or .arrow file (it is empty)`,
    );
    const other = folder({ 'README.md': '#', 'train.csv': 'a', '.gitattributes': '' });
    await expect(openSource(src(other))).rejects.toThrow(
      `source folder ${other} holds no .jsonl, .json, .parquet or .arrow file (it has: train.csv)`,
    );
  });

  it('a folder that mixes kinds names them', async () => {
    const dir = folder({ 'a.jsonl': jsonl({ prompt: 'a' }), 'b.json': '[]', 'c.jsonl': jsonl({ prompt: 'c' }) });
    await expect(openSource(src(dir))).rejects.toThrow(
      `source ${dir} mixes file kinds: 2 .jsonl (a.jsonl…), 1 .json (b.json…)`,
    );
  });

  it('a pattern that matches nothing says so', async () => {
    const dir = folder({ 'a.jsonl': jsonl({ prompt: 'a' }) });
    await expect(openSource(src(path.join(dir, 'train-*.jsonl')))).rejects.toThrow(
      `source path ${path.join(dir, 'train-*.jsonl')}: no file in ${dir} matches train-*.jsonl`,
    );
  });

  it('a DatasetDict without train names its splits; a broken save_to_disk folder is named', async () => {
    const dict = folder({ 'dataset_dict.json': '{"splits": ["validation", "test"]}' });
    await expect(openSource(src(dict))).rejects.toThrow(
      `${dict} is a DatasetDict with the splits validation, test and no train: set source.path to one of them, e.g. ${path.join(dict, 'validation')}`,
    );
    const broken = folder({ 'state.json': '{"_data_files": []}' });
    await expect(openSource(src(broken))).rejects.toThrow(
      new RegExp(`^${broken}: cannot read the save_to_disk folder: .*is not a datasets state.json`),
    );
  });
});

describe('naturalCompare', () => {
  it('orders runs of digits as numbers', () => {
    expect(['b10', 'b2', 'a', 'b1', 'b02', 'c'].sort(naturalCompare)).toEqual(['a', 'b1', 'b2', 'b02', 'b10', 'c']);
  });
});
