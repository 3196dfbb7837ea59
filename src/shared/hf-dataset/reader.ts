// Reads a Hugging Face `datasets` folder (ours or one written by Python's save_to_disk):
// state.json, dataset_info.json, and the Arrow IPC stream shards, batch by batch.
import { createReadStream } from 'node:fs';
import { open, readFile } from 'node:fs/promises';
import path from 'node:path';

import { RecordBatchReader, type Data, type RecordBatch, type Schema } from 'apache-arrow';

import { errorMessage } from '../errors.js';
import { exists, isErrno, isRecord } from '../util/index.js';
import {
  DatasetFormatError,
  DatasetStateSchema,
  columnsOfSchema,
  columnsString,
  featuresOf,
  sameColumns,
  type ColumnSpec,
  type DatasetState,
} from './schema.js';
import { addAnchorRow, emptyAnchorHistogram, type AnchorHistogram } from './anchor-positions.js';
import type { RowRecord } from './writer.js';

/** The metadata files of a dataset folder, parsed, with their exact text. */
export interface DatasetMeta {
  dir: string;
  state: DatasetState;
  stateText: string;
  /** dataset_info.json parsed (`{}` allowed), or undefined when the file is absent. */
  info: Record<string, unknown> | undefined;
  infoText: string | undefined;
  /** Shard file names in row order, from state.json. */
  shards: string[];
}

/**
 * Reads state.json and dataset_info.json of a dataset folder. Throws a
 * {@link DatasetFormatError} when state.json is missing or lacks one of its seven keys, or a
 * shard name leaves the folder.
 */
export async function readDatasetMeta(dir: string): Promise<DatasetMeta> {
  const statePath = path.join(dir, 'state.json');
  let stateText: string;
  try {
    stateText = await readFile(statePath, 'utf8');
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) throw new DatasetFormatError(`${dir} is not a datasets folder: it has no state.json`);
    throw e;
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(stateText);
  } catch (e: unknown) {
    throw new DatasetFormatError(`${statePath} is not valid JSON: ${errorMessage(e)}`, { cause: e });
  }
  const state = DatasetStateSchema.safeParse(parsed);
  if (!state.success) {
    const issues = state.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
    throw new DatasetFormatError(`${statePath} is not a datasets state.json: ${issues}`);
  }
  const shards = state.data._data_files.map((f) => f.filename);
  for (const s of shards) {
    if (path.isAbsolute(s) || s.split(/[\\/]/).includes('..')) {
      throw new DatasetFormatError(`${statePath} lists a shard outside the folder: ${s}`);
    }
  }
  let info: Record<string, unknown> | undefined;
  let infoText: string | undefined;
  const infoPath = path.join(dir, 'dataset_info.json');
  if (await exists(infoPath)) {
    infoText = await readFile(infoPath, 'utf8');
    try {
      const v: unknown = JSON.parse(infoText);
      info = isRecord(v) ? v : {};
    } catch (e: unknown) {
      throw new DatasetFormatError(`${infoPath} is not valid JSON: ${errorMessage(e)}`, { cause: e });
    }
  }
  return { dir, state: state.data, stateText, info, infoText, shards };
}

/** Arrow IPC stream files start with a continuation marker; IPC files (Feather v2) with ARROW1. */
async function checkStreamFormat(file: string): Promise<void> {
  const fh = await open(file, 'r');
  try {
    const head = Buffer.alloc(8);
    const { bytesRead } = await fh.read(head, 0, 8, 0);
    if (bytesRead >= 6 && head.subarray(0, 6).toString('latin1') === 'ARROW1') {
      throw new DatasetFormatError(`${file} is an Arrow IPC file (Feather); datasets needs the IPC stream format`);
    }
    if (bytesRead < 8 || head.readInt32LE(0) !== -1) {
      throw new DatasetFormatError(`${file} is not an Arrow IPC stream`);
    }
  } finally {
    await fh.close();
  }
}

type AsyncStreamReader = AsyncIterable<RecordBatch> & {
  schema: Schema;
  open(): Promise<unknown>;
  cancel(): Promise<void> | void;
};

async function openShard(file: string): Promise<AsyncStreamReader> {
  await checkStreamFormat(file);
  try {
    const reader = (await RecordBatchReader.from(
      createReadStream(file, { highWaterMark: 4 * 1024 * 1024 }),
    )) as unknown as AsyncStreamReader;
    await reader.open();
    return reader;
  } catch (e: unknown) {
    throw new DatasetFormatError(`cannot read ${file}: ${errorMessage(e)}`, { cause: e });
  }
}

/** The Arrow schema of one shard (reads only its first message). */
export async function readShardSchema(file: string): Promise<Schema> {
  const reader = await openShard(file);
  const schema = reader.schema;
  await reader.cancel();
  return schema;
}

/** Record batches of one shard, streamed. */
export async function* readShardBatches(file: string): AsyncGenerator<RecordBatch> {
  yield* batchesOf(file, await openShard(file));
}

/** A shard opened for reading: its schema (known even when it holds no batch) and its batches. */
export async function openShardBatches(
  file: string,
): Promise<{ schema: Schema; batches: AsyncGenerator<RecordBatch> }> {
  const reader = await openShard(file);
  return { schema: reader.schema, batches: batchesOf(file, reader) };
}

async function* batchesOf(file: string, reader: AsyncStreamReader): AsyncGenerator<RecordBatch> {
  try {
    for await (const batch of reader) yield batch;
  } catch (e: unknown) {
    if (e instanceof DatasetFormatError) throw e;
    throw new DatasetFormatError(`cannot read ${file}: ${errorMessage(e)}`, { cause: e });
  } finally {
    await reader.cancel();
  }
}

// ---------------------------------------------------------------------------------------------
// Column access on record batches

type IntArray =
  Int8Array | Int16Array | Int32Array | Uint8Array | Uint16Array | Uint32Array | BigInt64Array | BigUint64Array;

function offsetsOf(d: Data): { at: (i: number) => number } {
  const offs = d.valueOffsets as unknown as Int32Array | BigInt64Array;
  const base = d.offset;
  if (offs instanceof BigInt64Array) return { at: (i) => Number(offs[base + i]) };
  return { at: (i) => offs[base + i] as number };
}

/** Value `i` of an integer array, as a number. */
function intAt(values: IntArray, i: number): number {
  return Number(values[i]);
}

/** A function reading row `i` of one column of a batch as a plain JS value. */
function columnReader(col: ColumnSpec, d: Data, batch: RecordBatch, index: number): (i: number) => unknown {
  const valid = d.nullCount > 0 ? (i: number): boolean => d.getValid(i) : (): boolean => true;
  switch (col.type.kind) {
    case 'string': {
      const offs = offsetsOf(d);
      const bytes = d.values as Uint8Array;
      const decoder = new TextDecoder();
      return (i) => (valid(i) ? decoder.decode(bytes.subarray(offs.at(i), offs.at(i + 1))) : null);
    }
    case 'int': {
      const values = d.values as IntArray;
      const base = d.offset;
      return (i) => (valid(i) ? intAt(values, base + i) : null);
    }
    case 'list': {
      const offs = offsetsOf(d);
      const child = d.children[0] as Data;
      const values = child.values as IntArray;
      const base = child.offset;
      return (i) => {
        if (!valid(i)) return null;
        const a = base + offs.at(i);
        const b = base + offs.at(i + 1);
        const out = new Array<number>(b - a);
        for (let k = a; k < b; k++) out[k - a] = Number(values[k]);
        return out;
      };
    }
    case 'other': {
      const vector = batch.getChildAt(index);
      return (i) => plainValue(vector?.get(i));
    }
  }
}

/** An Arrow value as plain JS, however deep: lists (Vectors) as arrays, structs and maps as objects. */
function plainValue(v: unknown): unknown {
  // A struct row is a Proxy whose `in` sees only its fields: look the method up instead.
  const toJSON =
    typeof v === 'object' && v !== null && !(v instanceof Date) ? (v as { toJSON?: unknown }).toJSON : undefined;
  if (typeof toJSON !== 'function') return v;
  const json: unknown = toJSON.call(v);
  if (Array.isArray(json)) return json.map(plainValue);
  if (typeof json !== 'object' || json === null) return json;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(json)) out[k] = plainValue(x);
  return out;
}

/** Reads chosen rows of a record batch as plain objects (batch-local indices). */
export function batchRowReader(batch: RecordBatch, columns: readonly ColumnSpec[]): (i: number) => RowRecord {
  const readers = columns.map((c, i) => columnReader(c, batch.data.children[i] as Data, batch, i));
  return (r) => {
    const row: Record<string, unknown> = {};
    for (let c = 0; c < columns.length; c++)
      row[(columns[c] as ColumnSpec).name] = (readers[c] as (i: number) => unknown)(r);
    return row;
  };
}

/** The rows of one record batch as plain objects. */
export function* batchRows(batch: RecordBatch, columns: readonly ColumnSpec[]): Generator<RowRecord> {
  const read = batchRowReader(batch, columns);
  for (let r = 0; r < batch.numRows; r++) yield read(r);
}

// ---------------------------------------------------------------------------------------------
// Reading a whole dataset

/** An open dataset folder. */
export interface HfDataset {
  dir: string;
  meta: DatasetMeta;
  /** Columns of the first shard (every shard must have the same; {@link describeHfDataset} checks). */
  columns: ColumnSpec[];
  schema: Schema | undefined;
  /** `features` of dataset_info.json, or the ones the Arrow schema implies. */
  features: Record<string, unknown>;
  /** Counts rows by reading every shard. */
  countRows(): Promise<number>;
  /** Every row in order (state.json's shard order, then batch order). */
  rows(): AsyncGenerator<RowRecord>;
}

/** Opens a dataset folder for reading: metadata and the first shard's schema. */
export async function readHfDataset(dir: string): Promise<HfDataset> {
  const meta = await readDatasetMeta(dir);
  const first = meta.shards[0];
  const schema = first === undefined ? undefined : await readShardSchema(path.join(dir, first));
  const columns = schema === undefined ? [] : columnsOfSchema(schema);
  const infoFeatures = meta.info?.['features'];
  const features =
    typeof infoFeatures === 'object' && infoFeatures !== null
      ? (infoFeatures as Record<string, unknown>)
      : columns.every((c) => c.type.kind !== 'other')
        ? featuresOf(columns)
        : {};
  return {
    dir,
    meta,
    columns,
    schema,
    features,
    async countRows(): Promise<number> {
      let n = 0;
      for (const s of meta.shards) for await (const b of readShardBatches(path.join(dir, s))) n += b.numRows;
      return n;
    },
    async *rows(): AsyncGenerator<RowRecord> {
      for (const s of meta.shards) {
        const file = path.join(dir, s);
        let cols: ColumnSpec[] | undefined;
        for await (const b of readShardBatches(file)) {
          cols ??= columnsOfSchema(b.schema);
          if (!sameColumns(cols, columns)) {
            throw new DatasetFormatError(
              `${file} has columns (${columnsString(cols)}) but ${first ?? ''} has (${columnsString(columns)})`,
            );
          }
          yield* batchRows(b, cols);
        }
      }
    },
  };
}

/** Statistics and problems of one shard, from one full read. */
export interface ShardScan {
  file: string;
  columns: ColumnSpec[];
  rows: number;
  tokens: number;
  supervisedTokens: number;
  /** Rows by their DFlash anchor positions (anchor-positions.ts). */
  anchorPositions: AnchorHistogram;
  /** With {@link ScanOptions.findTokenId}: the rows whose input_ids hold that id, and the first of them (row numbers in the shard). */
  withToken?: { rows: number; first: number[] };
  batches: number;
  problems: string[];
}

/** Options of {@link scanShard}. */
export interface ScanOptions {
  /** Count the rows whose input_ids hold this token id (e.g. DFlash's mask token, which the data must not hold). */
  findTokenId?: number;
}

/** Row numbers of {@link ShardScan.withToken} kept. */
const TOKEN_ROWS_KEPT = 5;

/**
 * Reads one shard completely and checks the training columns: loss_mask values are 0/1 and
 * every row's loss_mask has its input_ids' length; num_tokens (when present) equals it; no
 * nulls in either list. Counts rows, tokens (input_ids values), supervised tokens (mask sum) and
 * the rows by their DFlash anchor positions.
 */
export async function scanShard(
  file: string,
  onRows?: (batch: RecordBatch, columns: ColumnSpec[], firstRow: number) => void,
  opts: ScanOptions = {},
): Promise<ShardScan> {
  const scan: ShardScan = {
    file,
    columns: [],
    rows: 0,
    tokens: 0,
    supervisedTokens: 0,
    anchorPositions: emptyAnchorHistogram(),
    ...(opts.findTokenId === undefined ? {} : { withToken: { rows: 0, first: [] } }),
    batches: 0,
    problems: [],
  };
  const problem = (p: string): void => {
    if (scan.problems.length < 20) scan.problems.push(`${path.basename(file)}: ${p}`);
  };
  const shard = await openShardBatches(file);
  scan.columns = columnsOfSchema(shard.schema);
  for await (const batch of shard.batches) {
    const names = scan.columns.map((c) => c.name);
    const idsIdx = names.indexOf('input_ids');
    const maskIdx = names.indexOf('loss_mask');
    const countIdx = names.indexOf('num_tokens');
    const ids = idsIdx < 0 ? undefined : (batch.data.children[idsIdx] as Data);
    const mask = maskIdx < 0 ? undefined : (batch.data.children[maskIdx] as Data);
    const n = batch.numRows;
    if (ids !== undefined && scan.columns[idsIdx]?.type.kind === 'list') {
      if (ids.nullCount > 0) problem(`input_ids has ${ids.nullCount} null rows`);
      const o = offsetsOf(ids);
      scan.tokens += o.at(n) - o.at(0);
      if (countIdx >= 0 && scan.columns[countIdx]?.type.kind === 'int') {
        const counts = (batch.data.children[countIdx] as Data).values as IntArray;
        const base = (batch.data.children[countIdx] as Data).offset;
        for (let i = 0; i < n; i++) {
          if (intAt(counts, base + i) !== o.at(i + 1) - o.at(i)) {
            problem(
              `row ${scan.rows + i}: num_tokens ${intAt(counts, base + i)} but input_ids has ${o.at(i + 1) - o.at(i)}`,
            );
            break;
          }
        }
      }
      if (mask !== undefined && scan.columns[maskIdx]?.type.kind === 'list') {
        if (mask.nullCount > 0) problem(`loss_mask has ${mask.nullCount} null rows`);
        const m = offsetsOf(mask);
        for (let i = 0; i <= n; i++) {
          if (m.at(i) - m.at(0) !== o.at(i) - o.at(0)) {
            problem(`row ${scan.rows + i - 1}: loss_mask and input_ids have different lengths`);
            break;
          }
        }
        const child = mask.children[0] as Data;
        const values = child.values as IntArray;
        const r = sumMask(values, child.offset + m.at(0), child.offset + m.at(n));
        scan.supervisedTokens += r.ones;
        if (r.bad > 0)
          problem(`loss_mask has ${r.bad} values other than 0 and 1 (rows ${scan.rows}..${scan.rows + n - 1})`);
        for (let i = 0; i < n; i++)
          addAnchorRow(scan.anchorPositions, maskAnchors(values, child.offset + m.at(i), child.offset + m.at(i + 1)));
      }
      const found = scan.withToken;
      if (found !== undefined && opts.findTokenId !== undefined) {
        const child = ids.children[0] as Data;
        const values = child.values as IntArray;
        for (let i = 0; i < n; i++) {
          if (!holdsId(values, child.offset + o.at(i), child.offset + o.at(i + 1), opts.findTokenId)) continue;
          found.rows += 1;
          if (found.first.length < TOKEN_ROWS_KEPT) found.first.push(scan.rows + i);
        }
      }
    }
    onRows?.(batch, scan.columns, scan.rows);
    scan.rows += n;
    scan.batches++;
  }
  return scan;
}

/** Positions `i` in [from, to - 1) where the mask is 1 at `i` and `i + 1` (DFlash anchor positions). */
function maskAnchors(values: IntArray, from: number, to: number): number {
  let n = 0;
  if (values instanceof BigInt64Array || values instanceof BigUint64Array) {
    const w = new Int32Array(values.buffer, values.byteOffset, values.length * 2);
    let prev = false;
    for (let i = from; i < to; i++) {
      const one = w[2 * i] === 1 && w[2 * i + 1] === 0;
      if (one && prev) n++;
      prev = one;
    }
    return n;
  }
  for (let i = from + 1; i < to; i++) if (values[i] === 1 && values[i - 1] === 1) n++;
  return n;
}

/** Whether the values in [from, to) hold `id`. */
function holdsId(values: IntArray, from: number, to: number, id: number): boolean {
  if (values instanceof BigInt64Array || values instanceof BigUint64Array) {
    const w = new Int32Array(values.buffer, values.byteOffset, values.length * 2);
    const lo = id | 0;
    for (let i = from; i < to; i++) if (w[2 * i] === lo && w[2 * i + 1] === 0) return true;
    return false;
  }
  for (let i = from; i < to; i++) if (values[i] === id) return true;
  return false;
}

/** Sum of 0/1 values in [from, to), and how many values are neither. */
function sumMask(values: IntArray, from: number, to: number): { ones: number; bad: number } {
  let ones = 0;
  let bad = 0;
  if (values instanceof BigInt64Array || values instanceof BigUint64Array) {
    // Little-endian 64-bit words read as pairs of 32-bit halves: no BigInt arithmetic.
    const w = new Int32Array(values.buffer, values.byteOffset, values.length * 2);
    for (let i = from; i < to; i++) {
      const lo = w[2 * i] as number;
      const hi = w[2 * i + 1] as number;
      if (hi === 0 && lo === 1) ones++;
      else if (hi !== 0 || lo !== 0) bad++;
    }
    return { ones, bad };
  }
  for (let i = from; i < to; i++) {
    const v = values[i] as number;
    if (v === 1) ones++;
    else if (v !== 0) bad++;
  }
  return { ones, bad };
}

/** Summary of a dataset folder. */
export interface HfDatasetSummary {
  rows: number;
  shards: number;
  features: Record<string, unknown>;
  columns: ColumnSpec[];
  /** Sum of input_ids lengths. */
  totalTokens: number;
  /** Sum of loss_mask. */
  supervisedTokens: number;
  /** supervisedTokens / totalTokens (0 for an empty dataset). */
  lossMaskCoverage: number;
  /** Problems found (different schemas across shards, bad masks…); empty when sound. */
  problems: string[];
  perShard: ShardScan[];
}

/** Reads every shard of a dataset folder and summarizes it. */
export async function describeHfDataset(dir: string): Promise<HfDatasetSummary> {
  const ds = await readHfDataset(dir);
  const perShard: ShardScan[] = [];
  const problems: string[] = [];
  for (const s of ds.meta.shards) {
    const scan = await scanShard(path.join(dir, s));
    if (!sameColumns(scan.columns, ds.columns)) {
      problems.push(
        `${s}: schema (${columnsString(scan.columns)}) differs from the first shard's (${columnsString(ds.columns)})`,
      );
    }
    problems.push(...scan.problems);
    perShard.push(scan);
  }
  const rows = perShard.reduce((a, s) => a + s.rows, 0);
  const totalTokens = perShard.reduce((a, s) => a + s.tokens, 0);
  const supervisedTokens = perShard.reduce((a, s) => a + s.supervisedTokens, 0);
  return {
    rows,
    shards: ds.meta.shards.length,
    features: ds.features,
    columns: ds.columns,
    totalTokens,
    supervisedTokens,
    lossMaskCoverage: totalTokens === 0 ? 0 : supervisedTokens / totalTokens,
    problems,
    perShard,
  };
}
