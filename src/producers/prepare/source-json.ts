/** Rows of a JSON source file: a top-level array, or an object holding one list (`{"data": […]}`). */
import { readFile, stat } from 'node:fs/promises';
import { errorMessage } from '../../shared/errors.js';
import { SourceError, type RawRow } from './source-raw.js';

/** The largest `.json` file read (it is parsed whole); a larger one is better converted to JSONL. */
export const MAX_JSON_BYTES = 256 * 1024 * 1024;

/** The rows of a `.json` file: the elements of its array, or of the one list its top-level object holds. */
export async function* readJsonRows(file: string): AsyncGenerator<RawRow> {
  const { size } = await stat(file);
  if (size > MAX_JSON_BYTES) {
    throw new SourceError(`${file} is ${(size / 2 ** 20).toFixed(0)} MiB: a .json source is read whole, up to ${MAX_JSON_BYTES / 2 ** 20} MiB; convert it to JSONL (one row per line)`);
  }
  let value: unknown;
  try {
    value = JSON.parse(await readFile(file, 'utf8')) as unknown;
  } catch (e: unknown) {
    throw new SourceError(`${file} is not valid JSON: ${errorMessage(e)}`, { cause: e });
  }
  const list = rowsList(value, file);
  for (let row = 0; row < list.length; row++) yield { ok: true, value: list[row], where: { file, row } };
}

function rowsList(value: unknown, file: string): unknown[] {
  if (Array.isArray(value)) return value;
  if (typeof value !== 'object' || value === null) throw new SourceError(`${file} holds a JSON ${value === null ? 'null' : typeof value}: expected a list of rows, or an object holding one`);
  const lists = Object.entries(value).filter(([, v]) => Array.isArray(v));
  if (lists.length === 1) return (lists[0] as [string, unknown[]])[1];
  const keys = Object.keys(value).join(', ') || 'none';
  if (lists.length === 0) throw new SourceError(`${file} holds an object with no list of rows (its keys: ${keys}); expected a list of rows, or an object holding one`);
  throw new SourceError(`${file} holds an object with several lists (${lists.map(([k]) => k).join(', ')}); keep the one of the rows, or save it as JSONL`);
}
