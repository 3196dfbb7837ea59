// Writes rows as a Hugging Face `datasets` folder (the layout `save_to_disk` produces and
// `load_from_disk` reads): Arrow IPC stream shards of bounded size, dataset_info.json, and
// state.json written last, so the folder never looks complete before it is.
import { randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, rm, rmdir, type FileHandle } from 'node:fs/promises';
import path from 'node:path';

import type { Data, DataType } from 'apache-arrow';
import { AsyncByteQueue, RecordBatch, RecordBatchStreamWriter, Struct, makeData, type Schema } from 'apache-arrow';

import { PayloadError } from '../errors.js';
import { fsyncDir, jsonText, writeFileAtomic } from '../util/index.js';
import {
  DatasetFormatError,
  arrowSchemaOf,
  arrowType,
  defaultColumns,
  featuresOf,
  intBits,
  intRange,
  newDatasetInfo,
  newState,
  shardName,
  type ColumnSpec,
  type ColumnType,
  type HfRow,
  type HfTokenTypes,
  type IntType,
} from './schema.js';

/** Rows per record batch, as `datasets` writes them (its default `writer_batch_size`). */
const BATCH_ROWS = 1000;
/** A record batch is also cut at this size, so that one batch never holds much memory. */
const BATCH_MAX_BYTES = 16 * 1024 * 1024;
/** Upper bound of one record batch's message header and buffer padding, per column. */
const BATCH_OVERHEAD_BYTES_PER_COLUMN = 256;
const BATCH_OVERHEAD_BYTES = 512;
/** End-of-stream marker: continuation token and a zero length. */
const EOS_BYTES = 8;

/** A row as the writer sees it: column name → value. {@link HfRow} is one. */
export type RowRecord = Readonly<Record<string, unknown>>;

export type RowSource<R = RowRecord> = AsyncIterable<R> | Iterable<R>;

/** Options of {@link writeHfDataset}. */
export interface HfWriteOptions extends HfTokenTypes {
  /**
   * Maximum size of one shard file in MiB (fractions allowed). A shard is closed before a row
   * would push it past this; a single row larger than the cap gets a shard of its own.
   */
  shardSizeMiB: number;
}

/** What {@link writeHfDataset} wrote. */
export interface HfWriteResult {
  dir: string;
  rows: number;
  /** Sum of `input_ids` lengths. */
  tokens: number;
  /** Sum of `loss_mask`. */
  supervisedTokens: number;
  /** Shard file names, in row order (as listed in state.json). */
  shards: string[];
  bytes: number;
  columns: ColumnSpec[];
  features: Record<string, Record<string, unknown>>;
}

/**
 * Writes `rows` as a new `datasets` folder at `dir` (which must not exist, or be empty).
 *
 * Shards are Arrow IPC stream files `data-XXXXX-of-NNNNN.arrow` sharing one schema, written
 * under temporary names and renamed once their count is known; then dataset_info.json (with
 * `features`), then state.json. Every file and the folder are fsynced. Rows are checked as they
 * come (loss_mask same length as input_ids and 0/1, num_tokens equal to that length, ids in
 * range) and a bad row fails the write with a {@link PayloadError} naming it; the partial
 * folder is then removed.
 *
 * Column types: input_ids `list<int32>` and loss_mask `list<int32>` unless
 * `inputIdsType`/`lossMaskType` say otherwise; id, dataset, finish_reason `string`;
 * num_tokens `int32`.
 */
export async function writeHfDataset(
  dir: string,
  rows: RowSource<HfRow>,
  opts: HfWriteOptions,
): Promise<HfWriteResult> {
  const columns = defaultColumns(opts);
  await prepareEmptyDir(dir);
  try {
    const written = await writeShards(dir, rows, {
      columns,
      shardSizeBytes: shardSizeBytes(opts.shardSizeMiB),
      nameShard: shardName,
      // save_to_disk writes one shard even for no rows; load_from_disk needs one for the schema.
      emptyShard: true,
    });
    const info = newDatasetInfo(columns);
    await writeFileAtomic(path.join(dir, 'dataset_info.json'), jsonText(info));
    await writeFileAtomic(path.join(dir, 'state.json'), jsonText(newState(written.files, newFingerprint())));
    return {
      dir,
      rows: written.rows,
      tokens: written.tokens,
      supervisedTokens: written.supervisedTokens,
      shards: written.files,
      bytes: written.bytes,
      columns,
      features: featuresOf(columns),
    };
  } catch (e: unknown) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}

/** Converts a MiB cap (fractions allowed) to bytes, refusing nonsense. */
export function shardSizeBytes(shardSizeMiB: number): number {
  if (!Number.isFinite(shardSizeMiB) || shardSizeMiB <= 0) {
    throw new DatasetFormatError(`shardSizeMiB must be a positive number, got ${String(shardSizeMiB)}`);
  }
  return Math.max(1024, Math.floor(shardSizeMiB * 1024 * 1024));
}

/** A `_fingerprint` for state.json: random, like one of `datasets`' own for new data. */
export function newFingerprint(): string {
  return randomBytes(8).toString('hex');
}

async function prepareEmptyDir(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
  const entries = await readdir(dir);
  if (entries.length > 0) {
    throw new DatasetFormatError(`refusing to write a dataset into ${dir}: the folder is not empty`);
  }
}

/** One sampled row with its 0-based position among the rows written. */
export interface SampledRow {
  index: number;
  row: RowRecord;
}

export interface WriteShardsOptions {
  columns: readonly ColumnSpec[];
  shardSizeBytes: number;
  /** Final file name of shard `index` of `total` (0-based). */
  nameShard: (index: number, total: number) => string;
  /** Keep a uniform random sample of this many rows (reservoir sampling). Default 0. */
  sampleSize?: number;
  random?: () => number;
  /** With no rows, still write one shard holding only the schema. Default false. */
  emptyShard?: boolean;
}

export interface WriteShardsResult {
  files: string[];
  rows: number;
  tokens: number;
  supervisedTokens: number;
  bytes: number;
  samples: SampledRow[];
}

/**
 * Writes rows into shard files in `dir` (which must exist) and fsyncs them and the folder.
 * Writes no metadata files: the caller lists the shards in a state.json.
 */
export async function writeShards(
  dir: string,
  rows: RowSource<object>,
  opts: WriteShardsOptions,
): Promise<WriteShardsResult> {
  const schema = arrowSchemaOf(opts.columns);
  const builders = opts.columns.map((c) => newColumnBuilder(c));
  const checker = new RowChecker(opts.columns);
  const schemaBytes = measureSchemaMessage(schema);
  const batchOverhead = BATCH_OVERHEAD_BYTES + BATCH_OVERHEAD_BYTES_PER_COLUMN * opts.columns.length;
  const batchCap = Math.min(BATCH_MAX_BYTES, opts.shardSizeBytes);
  const sampleSize = opts.sampleSize ?? 0;
  const random = opts.random ?? Math.random;

  const tempFiles: string[] = [];
  let shard: ShardFile | undefined;
  let batchRows = 0;
  let batchBytes = 0;
  let rowCount = 0;
  let tokens = 0;
  let supervised = 0;
  let totalBytes = 0;
  const samples: SampledRow[] = [];

  const flushBatch = async (): Promise<void> => {
    if (batchRows === 0) return;
    const children = builders.map((b) => b.finish());
    const batch = new RecordBatch(
      schema,
      makeData({ type: new Struct(schema.fields), length: batchRows, nullCount: 0, children }),
    );
    if (shard === undefined) {
      const file = path.join(dir, `.partial-${String(tempFiles.length).padStart(5, '0')}.arrow`);
      tempFiles.push(file);
      shard = await ShardFile.create(file, schema);
    }
    await shard.write(batch);
    for (const b of builders) b.reset();
    batchRows = 0;
    batchBytes = 0;
  };
  const closeShard = async (): Promise<void> => {
    if (shard === undefined) return;
    totalBytes += await shard.close();
    shard = undefined;
  };

  try {
    for await (const item of rows) {
      const row = item as RowRecord;
      const stats = checker.check(row, rowCount);
      let rowBytes = 0;
      try {
        for (const b of builders) rowBytes += b.sizeOf(row[b.name]);
      } catch (e: unknown) {
        throw withRow(e, row, rowCount);
      }
      const pending = batchRows > 0 ? batchBytes + batchOverhead : 0;
      const used = (shard?.bytes ?? 0) + pending;
      const base = shard === undefined ? schemaBytes : 0;
      if (used > 0 && base + used + rowBytes + batchOverhead + EOS_BYTES > opts.shardSizeBytes) {
        await flushBatch();
        await closeShard();
      }
      try {
        for (const b of builders) b.append(row[b.name]);
      } catch (e: unknown) {
        throw withRow(e, row, rowCount);
      }
      batchRows++;
      batchBytes += rowBytes;
      tokens += stats.tokens;
      supervised += stats.supervised;
      if (sampleSize > 0) {
        if (samples.length < sampleSize) samples.push({ index: rowCount, row: copyRow(row) });
        else {
          const j = Math.floor(random() * (rowCount + 1));
          if (j < sampleSize) samples[j] = { index: rowCount, row: copyRow(row) };
        }
      }
      rowCount++;
      if (batchRows >= BATCH_ROWS || batchBytes >= batchCap) await flushBatch();
    }
    await flushBatch();
    await closeShard();
    if (tempFiles.length === 0 && opts.emptyShard === true) {
      const file = path.join(dir, '.partial-00000.arrow');
      tempFiles.push(file);
      shard = await ShardFile.create(file, schema);
      await closeShard();
    }
  } catch (e: unknown) {
    await shard?.abort();
    for (const f of tempFiles) await rm(f, { force: true });
    throw e;
  }

  const files: string[] = [];
  for (const [i, tmp] of tempFiles.entries()) {
    const name = opts.nameShard(i, tempFiles.length);
    await rename(tmp, path.join(dir, name));
    files.push(name);
  }
  await fsyncDir(dir);
  samples.sort((a, b) => a.index - b.index);
  return { files, rows: rowCount, tokens, supervisedTokens: supervised, bytes: totalBytes, samples };
}

/** A row's value error, with the row it came from. */
function withRow(e: unknown, row: RowRecord, index: number): unknown {
  if (!(e instanceof PayloadError)) return e;
  const id = typeof row['id'] === 'string' ? ` (id ${JSON.stringify(row['id'])})` : '';
  return new PayloadError(`row ${index}${id}: ${e.message}`, { cause: e });
}

function copyRow(row: RowRecord): RowRecord {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(row))
    out[k] = Array.isArray(v) ? v.slice() : ArrayBuffer.isView(v) ? Array.from(v as unknown as ArrayLike<number>) : v;
  return out;
}

/** Removes a folder that holds nothing (used for empty staging folders). */
export async function removeEmptyDir(dir: string): Promise<void> {
  try {
    await rmdir(dir);
  } catch {
    // not empty or already gone: leave it
  }
}

// ---------------------------------------------------------------------------------------------
// Shard files: one RecordBatchStreamWriter per file, its bytes collected per batch and written
// with one write call.

/** Collects what a RecordBatchStreamWriter emits, instead of queueing it for a reader. */
class ChunkSink extends AsyncByteQueue {
  chunks: Uint8Array[] = [];
  override write(value: unknown): void {
    const v = value as Uint8Array;
    if (v.byteLength > 0) this.chunks.push(v);
  }
  take(): Buffer {
    const out = Buffer.concat(this.chunks);
    this.chunks = [];
    return out;
  }
}

function newStreamWriter(sink: ChunkSink, schema: Schema): RecordBatchStreamWriter {
  const writer = new RecordBatchStreamWriter({ autoDestroy: true });
  // `reset` keeps a sink that is an AsyncByteQueue, and writes the schema message to it.
  writer.reset(sink as unknown as Parameters<RecordBatchStreamWriter['reset']>[0], schema);
  return writer;
}

function measureSchemaMessage(schema: Schema): number {
  const sink = new ChunkSink();
  newStreamWriter(sink, schema);
  return sink.take().byteLength;
}

class ShardFile {
  bytes = 0;

  private constructor(
    private readonly file: string,
    private readonly fh: FileHandle,
    private readonly sink: ChunkSink,
    private readonly writer: RecordBatchStreamWriter,
  ) {}

  static async create(file: string, schema: Schema): Promise<ShardFile> {
    const fh = await open(file, 'wx');
    const sink = new ChunkSink();
    const writer = newStreamWriter(sink, schema);
    const shard = new ShardFile(file, fh, sink, writer);
    await shard.drain();
    return shard;
  }

  async write(batch: RecordBatch): Promise<void> {
    this.writer.write(batch);
    await this.drain();
  }

  /** Writes the end-of-stream marker, fsyncs and closes; returns the file size. */
  async close(): Promise<number> {
    this.writer.finish();
    await this.drain();
    await this.fh.sync();
    await this.fh.close();
    return this.bytes;
  }

  async abort(): Promise<void> {
    await this.fh.close().catch(() => undefined);
    await rm(this.file, { force: true });
  }

  private async drain(): Promise<void> {
    const buf = this.sink.take();
    if (buf.byteLength === 0) return;
    let off = 0;
    while (off < buf.byteLength) {
      const { bytesWritten } = await this.fh.write(buf, off, buf.byteLength - off);
      off += bytesWritten;
    }
    this.bytes += buf.byteLength;
  }
}

// ---------------------------------------------------------------------------------------------
// Row checks

interface RowStats {
  tokens: number;
  supervised: number;
}

/** Checks the cross-column rules of a training row and counts its tokens. */
class RowChecker {
  private readonly hasIds: boolean;
  private readonly hasMask: boolean;
  private readonly hasCount: boolean;

  constructor(columns: readonly ColumnSpec[]) {
    const names = new Set(columns.map((c) => c.name));
    this.hasIds = names.has('input_ids');
    this.hasMask = names.has('loss_mask');
    this.hasCount = names.has('num_tokens');
  }

  check(row: RowRecord, index: number): RowStats {
    const ids = row['input_ids'] as ArrayLike<number> | undefined;
    const mask = row['loss_mask'] as ArrayLike<number> | undefined;
    const where = (): string =>
      `row ${index}${typeof row['id'] === 'string' ? ` (id ${JSON.stringify(row['id'])})` : ''}`;
    let tokens = 0;
    let supervised = 0;
    if (this.hasIds && ids !== undefined && ids !== null && typeof ids.length === 'number') tokens = ids.length;
    if (this.hasMask && mask !== undefined && mask !== null && typeof mask.length === 'number') {
      if (this.hasIds && ids !== undefined && ids !== null && mask.length !== ids.length) {
        throw new PayloadError(`${where()}: loss_mask has ${mask.length} values but input_ids has ${ids.length}`);
      }
      for (let i = 0; i < mask.length; i++) {
        const m = mask[i];
        if (m === 1) supervised++;
        else if (m !== 0) throw new PayloadError(`${where()}: loss_mask[${i}] is ${String(m)}, expected 0 or 1`);
      }
    }
    if (this.hasCount && this.hasIds && ids !== undefined && ids !== null && row['num_tokens'] !== ids.length) {
      throw new PayloadError(
        `${where()}: num_tokens is ${String(row['num_tokens'])} but input_ids has ${ids.length} tokens`,
      );
    }
    return { tokens, supervised };
  }
}

// ---------------------------------------------------------------------------------------------
// Column builders: values accumulated in growable typed arrays, turned into Arrow Data per batch.

interface ColumnBuilder {
  readonly name: string;
  /** Bytes `value` adds to the batch body (values and offsets). Also validates it. */
  sizeOf(value: unknown): number;
  append(value: unknown): void;
  finish(): Data;
  reset(): void;
}

function newColumnBuilder(col: ColumnSpec): ColumnBuilder {
  switch (col.type.kind) {
    case 'string':
      return new StringBuilder(col.name, col.type);
    case 'int':
      return new IntBuilder(col.name, col.type.int);
    case 'list':
      return new IntListBuilder(col.name, col.type);
    case 'other':
      throw new DatasetFormatError(`cannot write column ${col.name} of type ${col.type.name}`);
  }
}

/** Integer values of any width, stored little-endian in 32-bit words (64-bit types use two). */
class IntVector {
  private words: Uint32Array;
  length = 0;
  private readonly wordsPerValue: number;
  private readonly bits: number;
  private readonly min: number;
  private readonly max: number;

  constructor(
    readonly type: IntType,
    private readonly column: string,
  ) {
    this.bits = intBits(type);
    this.wordsPerValue = this.bits === 64 ? 2 : 1;
    this.words = new Uint32Array(1024 * this.wordsPerValue);
    ({ min: this.min, max: this.max } = intRange(type));
  }

  get byteLength(): number {
    return (this.length * this.bits) / 8;
  }

  itemBytes(): number {
    return this.bits / 8;
  }

  private grow(extra: number): void {
    const need = (this.length + extra) * this.wordsPerValue;
    if (need <= this.words.length) return;
    let cap = this.words.length;
    while (cap < need) cap *= 2;
    const next = new Uint32Array(cap);
    next.set(this.words.subarray(0, this.length * this.wordsPerValue));
    this.words = next;
  }

  push(v: unknown): void {
    this.grow(1);
    this.put(this.length, v);
    this.length++;
  }

  pushAll(values: ArrayLike<unknown>): void {
    this.grow(values.length);
    for (let i = 0; i < values.length; i++) this.put(this.length + i, values[i]);
    this.length += values.length;
  }

  private put(i: number, v: unknown): void {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < this.min || v > this.max) {
      throw new PayloadError(`column ${this.column}: ${String(v)} is not an ${this.type} value`);
    }
    if (this.wordsPerValue === 2) {
      this.words[2 * i] = v >>> 0;
      this.words[2 * i + 1] = Math.floor(v / 4294967296) >>> 0;
    } else {
      this.words[i] = v >>> 0;
    }
  }

  /** The values as the typed array Arrow expects for this type (a copy, trimmed). */
  toTypedArray(): ArrayBufferView {
    const words = this.words.slice(0, this.length * this.wordsPerValue);
    const buf = words.buffer;
    switch (this.type) {
      case 'int8':
        return Int8Array.from(new Int32Array(buf, 0, this.length));
      case 'uint8':
        return Uint8Array.from(words.subarray(0, this.length));
      case 'int16':
        return Int16Array.from(new Int32Array(buf, 0, this.length));
      case 'uint16':
        return Uint16Array.from(words.subarray(0, this.length));
      case 'int32':
        return new Int32Array(buf, 0, this.length);
      case 'uint32':
        return words;
      case 'int64':
        return new BigInt64Array(buf, 0, this.length);
      case 'uint64':
        return new BigUint64Array(buf, 0, this.length);
    }
  }

  clear(): void {
    this.length = 0;
  }
}

class IntBuilder implements ColumnBuilder {
  private readonly values: IntVector;
  private readonly type: DataType;

  constructor(
    readonly name: string,
    int: IntType,
  ) {
    this.values = new IntVector(int, name);
    this.type = arrowType({ kind: 'int', int });
  }

  sizeOf(): number {
    return this.values.itemBytes();
  }

  append(value: unknown): void {
    this.values.push(value);
  }

  finish(): Data {
    return makeData({
      type: this.type as never,
      length: this.values.length,
      nullCount: 0,
      data: this.values.toTypedArray() as never,
    });
  }

  reset(): void {
    this.values.clear();
  }
}

/** Offsets of a (large) list or string column. */
class Offsets {
  private values: number[] = [0];

  constructor(private readonly large: boolean) {}

  push(end: number): void {
    this.values.push(end);
  }

  get count(): number {
    return this.values.length - 1;
  }

  get last(): number {
    return this.values[this.values.length - 1] ?? 0;
  }

  toTypedArray(): Int32Array | BigInt64Array {
    if (this.large) return BigInt64Array.from(this.values, (v) => BigInt(v));
    if (this.last > 0x7fffffff) {
      throw new DatasetFormatError('a record batch exceeds 2^31 list or string values; use a smaller shard size');
    }
    return Int32Array.from(this.values);
  }

  clear(): void {
    this.values = [0];
  }
}

class IntListBuilder implements ColumnBuilder {
  private readonly items: IntVector;
  private readonly offsets: Offsets;
  private readonly type: DataType;
  private readonly itemType: DataType;
  private readonly offsetBytes: number;

  constructor(
    readonly name: string,
    type: Extract<ColumnType, { kind: 'list' }>,
  ) {
    this.items = new IntVector(type.item, name);
    this.offsets = new Offsets(type.large);
    this.type = arrowType(type);
    this.itemType = arrowType({ kind: 'int', int: type.item });
    this.offsetBytes = type.large ? 8 : 4;
  }

  sizeOf(value: unknown): number {
    if (!isArrayLike(value))
      throw new PayloadError(`column ${this.name}: expected a list of integers, got ${describe(value)}`);
    return value.length * this.items.itemBytes() + this.offsetBytes;
  }

  append(value: unknown): void {
    this.items.pushAll(value as ArrayLike<unknown>);
    this.offsets.push(this.items.length);
  }

  finish(): Data {
    const child = makeData({
      type: this.itemType as never,
      length: this.items.length,
      nullCount: 0,
      data: this.items.toTypedArray() as never,
    });
    return makeData({
      type: this.type as never,
      length: this.offsets.count,
      nullCount: 0,
      valueOffsets: this.offsets.toTypedArray() as never,
      child,
    });
  }

  reset(): void {
    this.items.clear();
    this.offsets.clear();
  }
}

const encoder = new TextEncoder();

class StringBuilder implements ColumnBuilder {
  private chunks: Uint8Array[] = [];
  private byteCount = 0;
  private readonly offsets: Offsets;
  private readonly type: DataType;
  private readonly offsetBytes: number;
  private pending: Uint8Array | undefined;

  constructor(
    readonly name: string,
    type: Extract<ColumnType, { kind: 'string' }>,
  ) {
    this.offsets = new Offsets(type.large);
    this.type = arrowType(type);
    this.offsetBytes = type.large ? 8 : 4;
  }

  sizeOf(value: unknown): number {
    if (typeof value !== 'string')
      throw new PayloadError(`column ${this.name}: expected a string, got ${describe(value)}`);
    this.pending = encoder.encode(value);
    return this.pending.byteLength + this.offsetBytes;
  }

  append(value: unknown): void {
    const bytes = this.pending ?? encoder.encode(value as string);
    this.pending = undefined;
    this.chunks.push(bytes);
    this.byteCount += bytes.byteLength;
    this.offsets.push(this.byteCount);
  }

  finish(): Data {
    const data = new Uint8Array(this.byteCount);
    let off = 0;
    for (const c of this.chunks) {
      data.set(c, off);
      off += c.byteLength;
    }
    return makeData({
      type: this.type as never,
      length: this.offsets.count,
      nullCount: 0,
      valueOffsets: this.offsets.toTypedArray() as never,
      data: data as never,
    });
  }

  reset(): void {
    this.chunks = [];
    this.byteCount = 0;
    this.offsets.clear();
  }
}

function isArrayLike(v: unknown): v is ArrayLike<unknown> {
  return Array.isArray(v) || (ArrayBuffer.isView(v) && !(v instanceof DataView));
}

function describe(v: unknown): string {
  if (v === undefined) return 'nothing (the column is missing)';
  if (v === null) return 'null';
  return Array.isArray(v) ? 'an array' : typeof v;
}
