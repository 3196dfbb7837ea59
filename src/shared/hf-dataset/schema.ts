// The column model of tokenmill's training dataset and its three spellings: Arrow types (the
// shards), `datasets` features JSON (dataset_info.json and the `huggingface` schema metadata),
// and pyarrow-style type strings (error messages and reports).
import {
  DataType,
  Field,
  Int16,
  Int32,
  Int64,
  Int8,
  LargeList,
  LargeUtf8,
  List,
  Schema,
  Uint16,
  Uint32,
  Uint64,
  Uint8,
  Utf8,
} from 'apache-arrow';
import { z } from 'zod';

import { AppError } from '../errors.js';

/**
 * One training record as tokenmill writes it.
 *
 * - `id`: the sample id (docs/design.md, invariant 1), unique within `dataset`.
 * - `dataset`: the source dataset's name, e.g. `B1_glaive`.
 * - `input_ids`: token ids of the whole rendered conversation.
 * - `loss_mask`: 0/1 per token, same length as `input_ids`; 1 on what the target model said.
 * - `num_tokens`: `input_ids.length`, stored so that token totals need no list scan.
 * - `finish_reason`: why the record's last assistant turn ended: `"stop"` (stop token),
 *   `"length"` (cut at max_new_tokens) or `"conversation"` (taken from an existing conversation).
 */
export interface HfRow {
  id: string;
  dataset: string;
  input_ids: number[];
  loss_mask: number[];
  num_tokens: number;
  finish_reason: string;
}

/** The documented values of {@link HfRow.finish_reason}. */
export const FINISH_REASONS = ['stop', 'length', 'conversation'] as const;

/** Integer element types a column may hold. */
export type IntType = 'int8' | 'int16' | 'int32' | 'int64' | 'uint8' | 'uint16' | 'uint32' | 'uint64';

/** A column type tokenmill can read and write. Anything else is `other` (read-only, by name). */
export type ColumnType =
  | { kind: 'string'; large: boolean }
  | { kind: 'int'; int: IntType }
  | { kind: 'list'; large: boolean; item: IntType }
  | { kind: 'other'; name: string };

export interface ColumnSpec {
  name: string;
  type: ColumnType;
}

const INT_BITS: Record<IntType, number> = {
  int8: 8,
  int16: 16,
  int32: 32,
  int64: 64,
  uint8: 8,
  uint16: 16,
  uint32: 32,
  uint64: 64,
};

export function intBits(t: IntType): number {
  return INT_BITS[t];
}

export function isSigned(t: IntType): boolean {
  return !t.startsWith('uint');
}

/** Smallest and largest value of an integer type (as numbers; 64-bit ones capped at ±2^53). */
export function intRange(t: IntType): { min: number; max: number } {
  const bits = INT_BITS[t];
  if (bits === 64) {
    return isSigned(t)
      ? { min: Number.MIN_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER }
      : { min: 0, max: Number.MAX_SAFE_INTEGER };
  }
  return isSigned(t) ? { min: -(2 ** (bits - 1)), max: 2 ** (bits - 1) - 1 } : { min: 0, max: 2 ** bits - 1 };
}

/** pyarrow's spelling of a type: `string`, `int32`, `list<int32>`, `large_list<int64>`. */
export function typeString(t: ColumnType): string {
  switch (t.kind) {
    case 'string':
      return t.large ? 'large_string' : 'string';
    case 'int':
      return t.int;
    case 'list':
      return `${t.large ? 'large_list' : 'list'}<${t.item}>`;
    case 'other':
      return t.name;
  }
}

export function sameType(a: ColumnType, b: ColumnType): boolean {
  return typeString(a) === typeString(b);
}

/** Whether two column lists have the same names, order and types. */
export function sameColumns(a: readonly ColumnSpec[], b: readonly ColumnSpec[]): boolean {
  return a.length === b.length && a.every((c, i) => c.name === b[i]?.name && sameType(c.type, b[i].type));
}

export function columnsString(cols: readonly ColumnSpec[]): string {
  return cols.map((c) => `${c.name}: ${typeString(c.type)}`).join(', ');
}

function intArrowType(t: IntType): DataType {
  switch (t) {
    case 'int8':
      return new Int8();
    case 'int16':
      return new Int16();
    case 'int32':
      return new Int32();
    case 'int64':
      return new Int64();
    case 'uint8':
      return new Uint8();
    case 'uint16':
      return new Uint16();
    case 'uint32':
      return new Uint32();
    case 'uint64':
      return new Uint64();
  }
}

/**
 * The Arrow type of a column, spelled as pyarrow spells `datasets` features: nullable fields,
 * list children named `item`, so that shards written here and by Python concatenate.
 */
export function arrowType(t: ColumnType): DataType {
  switch (t.kind) {
    case 'string':
      return t.large ? new LargeUtf8() : new Utf8();
    case 'int':
      return intArrowType(t.int);
    case 'list': {
      const child = new Field('item', intArrowType(t.item), true);
      return t.large ? new LargeList(child) : new List(child);
    }
    case 'other':
      throw new DatasetFormatError(`cannot write a column of type ${t.name}`);
  }
}

function intTypeOf(dt: DataType): IntType | undefined {
  if (!DataType.isInt(dt)) return undefined;
  const { bitWidth, isSigned: signed } = dt as unknown as { bitWidth: number; isSigned: boolean };
  return `${signed ? '' : 'u'}int${bitWidth}` as IntType;
}

/** The column type of an Arrow type read from a shard. */
export function columnTypeOf(dt: DataType): ColumnType {
  if (DataType.isUtf8(dt)) return { kind: 'string', large: false };
  if (DataType.isLargeUtf8(dt)) return { kind: 'string', large: true };
  const int = intTypeOf(dt);
  if (int !== undefined) return { kind: 'int', int };
  if (DataType.isList(dt) || DataType.isLargeList(dt)) {
    const child = (dt as List | LargeList).children[0];
    const item = child === undefined ? undefined : intTypeOf(child.type);
    const large = DataType.isLargeList(dt);
    if (item !== undefined) return { kind: 'list', large, item };
    return {
      kind: 'other',
      name: `${large ? 'large_list' : 'list'}<${child === undefined ? '?' : otherName(child.type)}>`,
    };
  }
  return { kind: 'other', name: otherName(dt) };
}

/** pyarrow-like names for types tokenmill does not write (for messages only). */
function otherName(dt: DataType): string {
  if (DataType.isUtf8(dt)) return 'string';
  if (DataType.isLargeUtf8(dt)) return 'large_string';
  if (DataType.isBool(dt)) return 'bool';
  if (DataType.isFloat(dt)) {
    const precision = (dt as unknown as { precision: number }).precision;
    return ['halffloat', 'float', 'double'][precision] ?? 'float';
  }
  const int = intTypeOf(dt);
  if (int !== undefined) return int;
  if (DataType.isList(dt) || DataType.isLargeList(dt)) {
    const child = (dt as List).children[0];
    return `${DataType.isLargeList(dt) ? 'large_list' : 'list'}<${child === undefined ? '?' : otherName(child.type)}>`;
  }
  return String(dt).toLowerCase();
}

/** The columns of an Arrow schema. */
export function columnsOfSchema(schema: Schema): ColumnSpec[] {
  return schema.fields.map((f) => ({ name: f.name, type: columnTypeOf(f.type) }));
}

/**
 * `datasets` features JSON of one column, in the spelling every `datasets` version reads:
 * `Value`, and lists of integers as `Sequence` (what 2.x/3.x write; 4.x and 5.x read it back as
 * `List`). Not `List`: that spelling exists only from `datasets` 4.0, and 3.x fails on it with
 * `Feature type 'List' not found`. Large lists stay `LargeList` (there is no `Sequence` form).
 */
export function featureOf(t: ColumnType): Record<string, unknown> {
  switch (t.kind) {
    case 'string':
      return { dtype: t.large ? 'large_string' : 'string', _type: 'Value' };
    case 'int':
      return { dtype: t.int, _type: 'Value' };
    case 'list':
      return { feature: { dtype: t.item, _type: 'Value' }, _type: t.large ? 'LargeList' : 'Sequence' };
    case 'other':
      throw new DatasetFormatError(`no features spelling for type ${t.name}`);
  }
}

/** The `features` object of dataset_info.json for these columns. */
export function featuresOf(cols: readonly ColumnSpec[]): Record<string, Record<string, unknown>> {
  const out: Record<string, Record<string, unknown>> = {};
  for (const c of cols) out[c.name] = featureOf(c.type);
  return out;
}

/**
 * The Arrow schema of shards holding these columns, with the `huggingface` metadata that
 * `datasets` itself attaches (`{"info": {"features": …}}`).
 */
export function arrowSchemaOf(cols: readonly ColumnSpec[]): Schema {
  const fields = cols.map((c) => new Field(c.name, arrowType(c.type), true));
  const metadata = new Map([['huggingface', JSON.stringify({ info: { features: featuresOf(cols) } })]]);
  return new Schema(fields, metadata);
}

/** Element types chosen for the token columns when a dataset is created. */
export interface HfTokenTypes {
  /** Default `int32`: every vocabulary in use is far below 2^31. */
  inputIdsType?: 'int32' | 'int64';
  /**
   * Default `int32`. SpecForge-style loaders turn the column into torch tensors and only do
   * arithmetic and comparisons on it, which promote from any integer type (SpecForge's own
   * preprocessing produces int64); `int8` saves three bytes per token.
   */
  lossMaskType?: 'int8' | 'int32' | 'int64';
}

/** The columns of a dataset tokenmill creates, in this order. */
export function defaultColumns(types: HfTokenTypes = {}): ColumnSpec[] {
  return [
    { name: 'id', type: { kind: 'string', large: false } },
    { name: 'dataset', type: { kind: 'string', large: false } },
    { name: 'input_ids', type: { kind: 'list', large: false, item: types.inputIdsType ?? 'int32' } },
    { name: 'loss_mask', type: { kind: 'list', large: false, item: types.lossMaskType ?? 'int32' } },
    { name: 'num_tokens', type: { kind: 'int', int: 'int32' } },
    { name: 'finish_reason', type: { kind: 'string', large: false } },
  ];
}

/** What each {@link HfRow} column holds, for checking a target's column types. */
type RowColumnKind = 'string' | 'tokens' | 'mask' | 'count';
const ROW_COLUMN_KINDS: Record<keyof HfRow, RowColumnKind> = {
  id: 'string',
  dataset: 'string',
  input_ids: 'tokens',
  loss_mask: 'mask',
  num_tokens: 'count',
  finish_reason: 'string',
};

/** Columns a training dataset must have: what the drafter trainers read. */
export const REQUIRED_COLUMNS = ['input_ids', 'loss_mask'] as const;

export function isRowColumn(name: string): name is keyof HfRow {
  return Object.hasOwn(ROW_COLUMN_KINDS, name);
}

/**
 * Whether values of row column `name` can be stored in a column of type `target` without
 * loss: strings in `string`/`large_string`; token ids in lists of integers of at least 32 bits
 * (int32, uint32, int64, uint64); mask values (0/1) in lists of any integer type; counts in
 * integers of at least 32 bits. Returns why not, or undefined.
 */
export function cannotHold(name: keyof HfRow, target: ColumnType): string | undefined {
  const kind = ROW_COLUMN_KINDS[name];
  switch (kind) {
    case 'string':
      return target.kind === 'string' ? undefined : 'expected a string column';
    case 'tokens':
      if (target.kind !== 'list') return 'expected a list of integers';
      return intBits(target.item) >= 32 ? undefined : `token ids need at least 32-bit integers`;
    case 'mask':
      return target.kind === 'list' ? undefined : 'expected a list of integers';
    case 'count':
      if (target.kind !== 'int') return 'expected an integer column';
      return intBits(target.int) >= 32 ? undefined : 'token counts need at least 32-bit integers';
  }
}

/** A dataset folder is malformed, or its data cannot be represented. Never retried. */
export class DatasetFormatError extends AppError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super(message, { ...options, retryable: false });
  }
}

/** `state.json` of a `datasets` folder: all seven keys are required by `load_from_disk`. */
export const DatasetStateSchema = z.object({
  _data_files: z.array(z.object({ filename: z.string().min(1) })),
  _fingerprint: z.string().nullable(),
  _format_columns: z.array(z.string()).nullable(),
  _format_kwargs: z.record(z.string(), z.unknown()),
  _format_type: z.string().nullable(),
  _output_all_columns: z.boolean(),
  _split: z.string().nullable(),
});
export type DatasetState = z.infer<typeof DatasetStateSchema>;

/** A fresh `state.json` listing `files` in row order. */
export function newState(files: readonly string[], fingerprint: string): DatasetState {
  return {
    _data_files: files.map((filename) => ({ filename })),
    _fingerprint: fingerprint,
    _format_columns: null,
    _format_kwargs: {},
    _format_type: null,
    _output_all_columns: false,
    _split: null,
  };
}

/** `dataset_info.json` as `save_to_disk` writes it for a dataset built in memory. */
export function newDatasetInfo(cols: readonly ColumnSpec[]): Record<string, unknown> {
  return { citation: '', description: '', features: featuresOf(cols), homepage: '', license: '' };
}

/** `data-00003-of-00010.arrow`, the shard naming of `save_to_disk`. */
export function shardName(index: number, total: number): string {
  return `data-${String(index).padStart(5, '0')}-of-${String(total).padStart(5, '0')}.arrow`;
}
