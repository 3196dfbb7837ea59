// Sources as Python writes them: parquet from pyarrow (snappy and zstd, nested list<struct>
// columns, several row groups), a folder laid out like a hub download (shards of two splits,
// README, .gitattributes, .cache), shards named for natural order, and `save_to_disk` folders
// from `datasets` (a Dataset in two shards, a DatasetDict), with the current `datasets` and, when
// its environment is there, 3.6. Every row read must equal what Python reads back, and every
// converted row the chat turns Python computes from it.
import { existsSync } from 'node:fs';
import { copyFile, open, readdir, stat, truncate, writeFile } from 'node:fs/promises';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import type { PromptSource } from '../../src/shared/config/source.js';
import { readArrowRows } from '../../src/producers/prepare/source-arrow.js';
import { largeRowGroupNotes, readParquetRows } from '../../src/producers/prepare/source-parquet.js';
import type { RawRow } from '../../src/producers/prepare/source-raw.js';
import { openSource, SourceError } from '../../src/producers/prepare/source.js';
import type { OpenedSource, SourceRow } from '../../src/producers/prepare/source-types.js';
import { useHarness } from '../helpers/fixture.js';
import { REPO_ROOT, runPythonJson } from '../helpers/python.js';

interface Written {
  path: string;
  rows: Record<string, unknown>[];
  messages: Record<string, unknown>[][];
}
type Report = Record<string, Written>;

const MAIN_PYTHON = path.join(REPO_ROOT, '.venv', 'bin', 'python');
const DATASETS3_PYTHON = path.join(REPO_ROOT, '.venv-datasets3', 'bin', 'python');

const source = (p: string, extra: Partial<PromptSource> = {}): PromptSource => ({ path: p, format: 'auto', ...extra });

/** A value as JSON would carry it: bigints as numbers (the ids here are small). */
function plain(v: unknown): unknown {
  return JSON.parse(JSON.stringify(v, (_k, x: unknown) => (typeof x === 'bigint' ? Number(x) : x))) as unknown;
}

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

async function rawRowsOf(files: readonly string[], read: (f: string) => AsyncGenerator<RawRow>): Promise<unknown[]> {
  const out: unknown[] = [];
  for (const f of files) {
    for await (const r of read(f)) {
      if (!r.ok) throw new Error(`${f} row ${r.where.row}: ${r.reason}`);
      out.push(r.value);
    }
  }
  return out;
}

/** Every row of the opened source is sound, with the id and turns Python expects. */
async function expectConverted(opened: OpenedSource, written: Written): Promise<void> {
  const rows: SourceRow[] = await collect(opened.rows());
  expect(rows.length).toBe(written.rows.length);
  rows.forEach((r, i) => {
    if (!r.ok) throw new Error(`row ${i} is malformed: ${r.reason}`);
    expect(r.id).toBe(String(written.rows[i]?.id));
    expect(plain(r.messages)).toEqual(written.messages[i]);
  });
}

describe.skipIf(!existsSync(MAIN_PYTHON))('sources written by pyarrow and datasets', () => {
  const { tmp } = useHarness({ tmp: 'tm-prepare-py-' });
  let report: Report;

  beforeAll(async () => {
    report = await runPythonJson<Report>('make_prepare_sources.py', [tmp.dir]);
  }, 120_000);

  const at = (name: string): { file: string; written: Written } => {
    const written = report[name];
    if (written === undefined) throw new Error(`make_prepare_sources.py wrote no ${name}`);
    return { file: path.join(tmp.dir, written.path), written };
  };

  it('reads a snappy ShareGPT parquet (list<struct> turns, int64 ids, 5 row groups) row for row', async () => {
    const { file, written } = at('sharegpt_snappy');
    expect(plain(await rawRowsOf([file], readParquetRows))).toEqual(written.rows);
    const opened = await openSource(source(file));
    expect(opened.format).toBe('sharegpt');
    expect(opened.detectedFrom).toBe('column conversations[].from/value in the first row');
    await expectConverted(opened, written);
  });

  it('reads only the first row groups for a sample, and notes row groups too large to read in little memory', async () => {
    const { file, written } = at('sharegpt_snappy');
    const first = plain(await rawRowsOf([file], (f) => readParquetRows(f, { maxRows: 9 })));
    expect(first).toEqual(written.rows.slice(0, 9));
    expect(await largeRowGroupNotes([file])).toEqual([]);
    const [note] = await largeRowGroupNotes([file], 100);
    expect(
      note?.startsWith(
        `${file}: row groups of up to 7 rows and 0 MiB uncompressed; each is read whole, taking about ten times that in memory`,
      ),
    ).toBe(true);
  });

  it('reads only the wanted columns when the file has the required ones, else all', async () => {
    const { file, written } = at('sharegpt_snappy');
    const some = plain(
      await rawRowsOf([file], (f) =>
        readParquetRows(f, { columns: { required: ['conversations'], optional: ['id', 'absent'] } }),
      ),
    );
    expect(some).toEqual(written.rows.map((r) => ({ id: r.id, conversations: r.conversations })));
    const all = plain(
      await rawRowsOf([file], (f) => readParquetRows(f, { columns: { required: ['messages'], optional: ['id'] } })),
    );
    expect(all).toEqual(written.rows);
    const rows = await collect((await openSource(source(file, { format: 'prompt', field: 'question' }))).rows());
    expect(rows[0]).toMatchObject({
      ok: false,
      reason: 'no column "question" (the prompt column); the row has: id, system, conversations',
    });
  });

  it('reads gzip, brotli, lz4, data page v2 without dictionaries, and large_string/large_list columns', async () => {
    for (const name of ['variant_gzip', 'variant_brotli', 'variant_lz4', 'variant_none_v2', 'variant_large_types']) {
      const { file, written } = at(name);
      expect(plain(await rawRowsOf([file], readParquetRows)), name).toEqual(written.rows);
      await expectConverted(await openSource(source(file)), written);
    }
  });

  it('reads a zstd OpenAI parquet with tool calls (nested structs in lists) row for row', async () => {
    const { file, written } = at('openai_zstd');
    expect(plain(await rawRowsOf([file], readParquetRows))).toEqual(written.rows);
    const opened = await openSource(source(file));
    expect(opened.format).toBe('openai');
    await expectConverted(opened, written);
    const withCall = (await collect(opened.rows())).find(
      (r) => r.ok && r.messages.some((m) => m.tool_calls !== undefined),
    );
    expect(withCall?.ok && withCall.messages.find((m) => m.tool_calls !== undefined)).toMatchObject({
      role: 'assistant',
      content: '',
      tool_calls: [{ type: 'function', function: { name: 'lookup' } }],
    });
  });

  it('reads the train shards of a hub download in order, skipping README, .gitattributes and .cache, and says it chose train', async () => {
    const { file, written } = at('hub');
    const opened = await openSource(source(file));
    expect(opened.files.map((f) => path.relative(file, f))).toEqual(
      [0, 1, 2].map((k) => path.join('data', `train-0000${k}-of-00003.parquet`)),
    );
    expect(opened.notes?.join(' ')).toMatch(/splits test, train: reading train \(3 files\)/);
    await expectConverted(opened, written);
  });

  it('reads the test split of the hub download through a file-name pattern', async () => {
    const { file } = at('hub');
    const opened = await openSource(source(path.join(file, 'data', 'test-*.parquet')));
    const rows = await collect(opened.rows());
    expect(rows.map((r) => (r.ok ? r.id : r.reason))).toEqual(['500', '501', '502', '503', '504']);
  });

  it('orders shards naturally (part-1, part-2, part-10)', async () => {
    const { file, written } = at('shards');
    const opened = await openSource(source(file));
    expect(opened.files.map((f) => path.basename(f))).toEqual(['part-1.parquet', 'part-2.parquet', 'part-10.parquet']);
    await expectConverted(opened, written);
  });

  it('reads a save_to_disk Dataset of two Arrow shards in state.json order', async () => {
    const { file, written } = at('saved');
    const opened = await openSource(source(file));
    expect(opened.files.map((f) => path.basename(f))).toEqual([
      'data-00000-of-00002.arrow',
      'data-00001-of-00002.arrow',
    ]);
    expect(plain(await rawRowsOf(opened.files, readArrowRows))).toEqual(written.rows);
    expect(opened.format).toBe('openai');
    await expectConverted(opened, written);
  });

  it('reads one Arrow shard given as the path', async () => {
    const { file, written } = at('saved');
    const shard = path.join(file, 'data-00001-of-00002.arrow');
    const rows = await collect((await openSource(source(shard))).rows());
    const first = written.rows.length - rows.length;
    expect(rows.length).toBeGreaterThan(0);
    expect(rows.map((r) => (r.ok ? r.id : r.reason))).toEqual(written.rows.slice(first).map((r) => r.id));
  });

  it('reads the train split of a save_to_disk DatasetDict and says so', async () => {
    const { file, written } = at('saved_dict');
    const opened = await openSource(source(file));
    expect(opened.notes).toEqual([
      `${file} is a DatasetDict with the splits train, test: reading train; set source.path to ${path.join(file, '<split>')} for another`,
    ]);
    expect(opened.format).toBe('sharegpt');
    await expectConverted(opened, written);
  });

  it('closes its files when the reader stops early, whatever the kind', async () => {
    const openFds = async (): Promise<number> => (await readdir('/proc/self/fd')).length;
    const jsonl = path.join(tmp.dir, 'early.jsonl');
    await writeFile(jsonl, `${Array.from({ length: 50 }, (_, i) => JSON.stringify({ prompt: `p${i}` })).join('\n')}\n`);
    const json = path.join(tmp.dir, 'early.json');
    await writeFile(json, JSON.stringify({ data: Array.from({ length: 50 }, (_, i) => ({ prompt: `p${i}` })) }));
    const paths = [at('hub').file, at('openai_zstd').file, at('saved').file, at('saved_dict').file, jsonl, json];
    const before = await openFds();
    for (let round = 0; round < 10; round++) {
      for (const p of paths) {
        const opened = await openSource(source(p));
        for await (const r of opened.rows()) {
          expect(r.ok).toBe(true);
          break;
        }
      }
    }
    // Streams close asynchronously: wait until the count settles back.
    let after = await openFds();
    for (let i = 0; i < 100 && after > before; i++) {
      await new Promise((resolve) => setImmediate(resolve));
      after = await openFds();
    }
    expect(after).toBeLessThanOrEqual(before);
  });

  it('reads what Dataset.to_json (JSON Lines in a .json, and a JSON array) and Dataset.to_parquet write', async () => {
    for (const name of ['exported_lines_json', 'exported_array_json', 'exported_parquet']) {
      const { file, written } = at(name);
      const opened = await openSource(source(file));
      expect(opened.format).toBe('sharegpt');
      await expectConverted(opened, written);
    }
  });

  it('names a parquet file it cannot read: a truncated copy, and a text file named .parquet', async () => {
    const { file } = at('openai_zstd');
    const cut = path.join(tmp.dir, 'truncated.parquet');
    await copyFile(file, cut);
    await truncate(cut, Math.floor((await stat(cut)).size / 2));
    await expect(openSource(source(cut))).rejects.toThrow(SourceError);
    await expect(openSource(source(cut))).rejects.toThrow(/truncated\.parquet is not a readable parquet file/);
    const fake = path.join(tmp.dir, 'fake.parquet');
    const fh = await open(fake, 'w');
    await fh.writeFile('{"prompt": "not parquet"}\n');
    await fh.close();
    await expect(openSource(source(fake))).rejects.toThrow(/fake\.parquet is not a readable parquet file/);
  });

  it('names the row group of a parquet file damaged inside its data', async () => {
    const { file } = at('sharegpt_snappy');
    const bad = path.join(tmp.dir, 'damaged.parquet');
    await copyFile(file, bad);
    // Overwrite bytes of the first row group's pages (past the 4-byte magic), keeping the footer intact.
    const fh = await open(bad, 'r+');
    await fh.write(Buffer.alloc(64, 0xff), 0, 64, 40);
    await fh.close();
    const opened = await openSource(source(bad, { format: 'sharegpt' })).catch((e: unknown) => e);
    const error =
      opened instanceof Error ? opened : await collect((opened as OpenedSource).rows()).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(SourceError);
    expect(String(error)).toMatch(/damaged\.parquet/);
  });
});

describe.skipIf(!existsSync(DATASETS3_PYTHON))('save_to_disk folders written by datasets 3.6', () => {
  const { tmp } = useHarness({ tmp: 'tm-prepare-py3-' });
  let report: Report;

  beforeAll(async () => {
    report = await runPythonJson<Report>('make_prepare_sources.py', [tmp.dir, '--only-saved'], undefined, {
      env: 'datasets3',
    });
  }, 120_000);

  it('reads a Dataset, a DatasetDict and its JSON and parquet exports row for row', async () => {
    for (const name of ['saved', 'saved_dict', 'exported_lines_json', 'exported_array_json', 'exported_parquet']) {
      const written = report[name] as Written;
      const opened = await openSource(source(path.join(tmp.dir, written.path)));
      if (name.startsWith('saved')) expect(plain(await rawRowsOf(opened.files, readArrowRows))).toEqual(written.rows);
      await expectConverted(opened, written);
    }
  });
});
