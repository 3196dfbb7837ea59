// The dataset writer against Python `datasets` itself: folders written here must load with
// `load_from_disk` with the same values, row count and features, in several shards.
import { open, readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { PayloadError } from '../../src/shared/errors.js';
import {
  DatasetFormatError,
  describeHfDataset,
  readHfDataset,
  writeHfDataset,
  type HfRow,
  type HfWriteResult,
} from '../../src/shared/hf-dataset/index.js';
import { makeRows, type PyLoad } from '../fixtures/hf/rows.js';
import { useHarness } from '../helpers/fixture.js';
import { runPythonJson } from '../helpers/python.js';

const SHARD_MIB = 0.02; // 20 KiB: 400 rows of ~33 tokens make several shards

describe('writeHfDataset: Python datasets loads what it writes', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-writer-' });
  const rows = makeRows('B1_glaive', 400, 7);
  const rows64 = makeRows('B2_code', 50, 8);
  let defaults: HfWriteResult;
  let wide: HfWriteResult;
  let py: PyLoad[];

  beforeAll(async () => {
    defaults = await writeHfDataset(path.join(tmp.dir, 'default'), rows, { shardSizeMiB: SHARD_MIB });
    // An async source and the other element types.
    async function* gen(): AsyncGenerator<HfRow> {
      for (const r of rows64) yield r;
    }
    wide = await writeHfDataset(path.join(tmp.dir, 'wide'), gen(), {
      shardSizeMiB: 1,
      inputIdsType: 'int64',
      lossMaskType: 'int8',
    });
    await writeHfDataset(path.join(tmp.dir, 'empty'), [], { shardSizeMiB: 1 });
    const out = await runPythonJson<{ results: PyLoad[] }>('hf_datasets.py', [], {
      ops: [
        { op: 'load', dir: path.join(tmp.dir, 'default'), data: true },
        { op: 'load', dir: path.join(tmp.dir, 'wide'), data: true },
        { op: 'load', dir: path.join(tmp.dir, 'empty'), data: true },
      ],
    });
    py = out.results;
  });

  it('writes several size-capped shards in the IPC stream format, named like save_to_disk', async () => {
    expect(defaults.shards.length).toBeGreaterThan(2);
    const n = defaults.shards.length;
    expect(defaults.shards).toEqual(
      Array.from({ length: n }, (_, i) => `data-${String(i).padStart(5, '0')}-of-${String(n).padStart(5, '0')}.arrow`),
    );
    const names = (await readdir(path.join(tmp.dir, 'default'))).sort();
    expect(names).toEqual([...defaults.shards, 'dataset_info.json', 'state.json'].sort());
    for (const s of defaults.shards) {
      const file = path.join(tmp.dir, 'default', s);
      expect((await stat(file)).size).toBeLessThanOrEqual(SHARD_MIB * 1024 * 1024);
      const fh = await open(file, 'r');
      const head = Buffer.alloc(4);
      await fh.read(head, 0, 4, 0);
      await fh.close();
      expect(head.readInt32LE(0)).toBe(-1); // stream continuation marker, not "ARROW1"
    }
  });

  it('writes state.json with all seven keys, shards in row order, and features matching the schema', async () => {
    const state = JSON.parse(await readFile(path.join(tmp.dir, 'default', 'state.json'), 'utf8')) as Record<
      string,
      unknown
    >;
    expect(Object.keys(state).sort()).toEqual([
      '_data_files',
      '_fingerprint',
      '_format_columns',
      '_format_kwargs',
      '_format_type',
      '_output_all_columns',
      '_split',
    ]);
    expect(state['_data_files']).toEqual(defaults.shards.map((filename) => ({ filename })));
    expect(state['_format_kwargs']).toEqual({});
    expect(state['_output_all_columns']).toBe(false);
    const info = JSON.parse(await readFile(path.join(tmp.dir, 'default', 'dataset_info.json'), 'utf8')) as {
      features: unknown;
    };
    expect(info.features).toEqual({
      id: { dtype: 'string', _type: 'Value' },
      dataset: { dtype: 'string', _type: 'Value' },
      input_ids: { feature: { dtype: 'int32', _type: 'Value' }, _type: 'Sequence' },
      loss_mask: { feature: { dtype: 'int32', _type: 'Value' }, _type: 'Sequence' },
      num_tokens: { dtype: 'int32', _type: 'Value' },
      finish_reason: { dtype: 'string', _type: 'Value' },
    });
  });

  it('loads in Python with identical rows, values and types', () => {
    const d = py[0] as PyLoad;
    expect(d.error).toBeUndefined();
    expect(d.num_rows).toBe(400);
    expect(d.files.map((f) => path.basename(f))).toEqual(defaults.shards);
    expect(d.arrow_types).toEqual({
      id: 'string',
      dataset: 'string',
      input_ids: 'list<item: int32>',
      loss_mask: 'list<item: int32>',
      num_tokens: 'int32',
      finish_reason: 'string',
    });
    expect(d.features['input_ids']).toBe("List(Value('int32'))");
    const data = d.data as Record<string, unknown[]>;
    expect(data['id']).toEqual(rows.map((r) => r.id));
    expect(data['dataset']).toEqual(rows.map((r) => r.dataset));
    expect(data['input_ids']).toEqual(rows.map((r) => r.input_ids));
    expect(data['loss_mask']).toEqual(rows.map((r) => r.loss_mask));
    expect(data['num_tokens']).toEqual(rows.map((r) => r.num_tokens));
    expect(data['finish_reason']).toEqual(rows.map((r) => r.finish_reason));
  });

  it('writes int64 ids and an int8 mask on request, and Python reads them as such', () => {
    const d = py[1] as PyLoad;
    expect(d.error).toBeUndefined();
    expect(d.arrow_types['input_ids']).toBe('list<item: int64>');
    expect(d.arrow_types['loss_mask']).toBe('list<item: int8>');
    expect(d.features['loss_mask']).toBe("List(Value('int8'))");
    expect(d.num_rows).toBe(50);
    expect(wide.shards).toHaveLength(1);
    expect(d.data?.['input_ids']).toEqual(rows64.map((r) => r.input_ids));
    expect(d.data?.['loss_mask']).toEqual(rows64.map((r) => r.loss_mask));
  });

  it('writes an empty dataset as one shard holding the schema, which Python loads', () => {
    const d = py[2] as PyLoad;
    expect(d.error).toBeUndefined();
    expect(d.num_rows).toBe(0);
    expect(d.files.map((f) => path.basename(f))).toEqual(['data-00000-of-00001.arrow']);
    expect(d.arrow_types['input_ids']).toBe('list<item: int32>');
  });

  it('reads back what it wrote and describes it', async () => {
    const ds = await readHfDataset(path.join(tmp.dir, 'wide'));
    const back: unknown[] = [];
    for await (const r of ds.rows()) back.push(r);
    expect(back).toEqual(rows64);
    expect(await ds.countRows()).toBe(50);

    const summary = await describeHfDataset(path.join(tmp.dir, 'default'));
    const tokens = rows.reduce((a, r) => a + r.input_ids.length, 0);
    const supervised = rows.reduce((a, r) => a + r.loss_mask.reduce((x, y) => x + y, 0), 0);
    expect(summary).toMatchObject({
      rows: 400,
      shards: defaults.shards.length,
      totalTokens: tokens,
      supervisedTokens: supervised,
      problems: [],
    });
    expect(defaults).toMatchObject({ rows: 400, tokens, supervisedTokens: supervised });
    expect(summary.lossMaskCoverage).toBeCloseTo(supervised / tokens, 12);
  });
});

describe('writeHfDataset: refusals', () => {
  const { tmp } = useHarness({ tmp: 'tm-hf-writer-bad-' });

  it('rejects a row whose loss_mask is not 0/1 or not as long as input_ids, and leaves no folder', async () => {
    const good = makeRows('X', 3);
    const badLength = [...good, { ...good[0]!, id: 'short', loss_mask: [1] }];
    await expect(writeHfDataset(path.join(tmp.dir, 'a'), badLength, { shardSizeMiB: 1 })).rejects.toThrow(
      /row 3 \(id "short"\): loss_mask has 1 values but input_ids has \d+/,
    );
    const badValue = [{ ...good[0]!, loss_mask: good[0]!.loss_mask.map(() => 2) }];
    await expect(writeHfDataset(path.join(tmp.dir, 'b'), badValue, { shardSizeMiB: 1 })).rejects.toBeInstanceOf(
      PayloadError,
    );
    const badCount = [{ ...good[0]!, num_tokens: 1 }];
    await expect(writeHfDataset(path.join(tmp.dir, 'c'), badCount, { shardSizeMiB: 1 })).rejects.toThrow(
      /num_tokens is 1/,
    );
    const badId = [...good, { ...good[1]!, id: 'big', input_ids: good[1]!.input_ids.map(() => 2 ** 31) }];
    await expect(writeHfDataset(path.join(tmp.dir, 'd'), badId, { shardSizeMiB: 1 })).rejects.toThrow(
      /row 3 \(id "big"\): column input_ids: 2147483648 is not an int32 value/,
    );
    expect(await readdir(tmp.dir)).toEqual([]);
  });

  it('refuses to write into a folder that is not empty', async () => {
    const dir = path.join(tmp.dir, 'full');
    await writeHfDataset(dir, makeRows('Y', 2), { shardSizeMiB: 1 });
    await expect(writeHfDataset(dir, makeRows('Z', 2), { shardSizeMiB: 1 })).rejects.toBeInstanceOf(DatasetFormatError);
    expect((await describeHfDataset(dir)).rows).toBe(2);
  });
});
