/**
 * What the file readers of a source give before the format turns a row into chat turns: the
 * row's value as read (a JSON value, or a parquet/Arrow row as a plain object), or why the row
 * could not be read at all (a line that is not JSON, bytes that are not UTF-8).
 */
import { AppError } from '../../shared/index.js';
import type { SourceRowWhere } from './source-types.js';

/** One row of a source file, before conversion. */
export type RawRow =
  | { ok: true; value: unknown; where: SourceRowWhere }
  | { ok: false; reason: string; where: SourceRowWhere; excerpt?: string };

/** How a file is to be read: all of it or its first rows, all columns or some. */
export interface RawReadOptions {
  /** The caller stops after this many rows (the detection's sample): a reader that decodes rows in blocks may decode fewer. */
  maxRows?: number;
  /**
   * The columns the caller reads: a columnar reader may leave the others out, when the file has
   * every required one (else it reads them all, so a row's missing column is reported among
   * the columns it has).
   */
  columns?: { required: readonly string[]; optional: readonly string[] };
}

/** Reads the rows of one file, in order. */
export type RawRowReader = (file: string, options?: RawReadOptions) => AsyncGenerator<RawRow>;

/** A source that cannot be opened or read (missing path, unknown layout, unreadable file): says what, where and what to do. */
export class SourceError extends AppError {}

const EXCERPT_CHARS = 200;

/** JSON of a value, bigints as their digits, for excerpts and messages. */
export function jsonText(value: unknown): string {
  try {
    return JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)) ?? String(value);
  } catch {
    return String(value);
  }
}

/** The first characters of a text, marked when cut. */
export function excerptOf(text: string): string {
  return text.length <= EXCERPT_CHARS ? text : `${text.slice(0, EXCERPT_CHARS)}…`;
}

/** The first characters of a value's JSON. */
export function excerptOfValue(value: unknown): string {
  return excerptOf(jsonText(value));
}

/** `row 3 of data/train.parquet` / `line 4 of a.jsonl`: a row's place, for messages. */
export function describeWhere(where: SourceRowWhere): string {
  return where.line === undefined ? `row ${where.row} of ${where.file}` : `line ${where.line} of ${where.file}`;
}
