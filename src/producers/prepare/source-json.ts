/**
 * Rows of a JSON source file: a top-level list, or an object holding one list
 * (`{"data": […]}`), streamed an element at a time; a `.json` file that holds JSON Lines (as
 * many hub datasets do) is read as JSONL.
 */
import { isUtf8 } from 'node:buffer';
import { notUtf8Reason } from '../../shared/index.js';
import { errorMessage } from '../../shared/index.js';
import { describeJsonTop, scanJsonList } from './source-json-scan.js';
import { readJsonlRows } from './source-jsonl.js';
import { SourceError, excerptOf, type RawRow } from './source-raw.js';

const EXPECTED = 'expected a list of rows, or an object holding one list of rows';

/**
 * The rows of a `.json` file with the 1-based line each starts on. An element that is not
 * JSON, not UTF-8 or cut off by the end of the file is a malformed row; a file whose top level
 * holds no list, or several, throws a {@link SourceError}.
 */
export async function* readJsonRows(file: string): AsyncGenerator<RawRow> {
  const { key, jsonl } = await listKeyOf(file);
  if (jsonl) {
    yield* readJsonlRows(file);
    return;
  }
  let row = 0;
  const state = { unclosed: false };
  let truncated = false;
  for await (const e of scanJsonList(file, key, state)) {
    const where = { file, row, line: e.line };
    row += 1;
    const text = e.bytes.toString('utf8');
    if (e.truncated) {
      truncated = true;
      yield {
        ok: false,
        reason: 'the file ends inside this row (is it cut short?)',
        where,
        excerpt: excerptOf(text.slice(0, 400)),
      };
      continue;
    }
    if (text.includes('\uFFFD') && !isUtf8(e.bytes)) {
      yield { ok: false, reason: notUtf8Reason(e.bytes, e.line), where, excerpt: excerptOf(text.slice(0, 400)) };
      continue;
    }
    let value: unknown;
    try {
      value = JSON.parse(text) as unknown;
    } catch (err: unknown) {
      yield {
        ok: false,
        reason: `not valid JSON: ${errorMessage(err)}`,
        where,
        excerpt: excerptOf(text.slice(0, 400)),
      };
      continue;
    }
    yield { ok: true, value, where };
  }
  if (state.unclosed && !truncated)
    yield {
      ok: false,
      reason: 'the file ends before its list of rows closes (is it cut short?)',
      where: { file, row },
    };
}

/** The key of the list of rows in the file's top-level object (undefined for a top-level list), or that the file is JSON Lines. */
async function listKeyOf(file: string): Promise<{ key?: string; jsonl?: true }> {
  const top = await describeJsonTop(file);
  switch (top.kind) {
    case 'array':
      return {};
    case 'empty':
      throw new SourceError(`${file} is empty: ${EXPECTED}`);
    case 'other':
      throw new SourceError(
        `${file} does not start with a list or an object (it starts with ${JSON.stringify(top.first)}): ${EXPECTED}`,
      );
    case 'object': {
      if (top.more) return { jsonl: true };
      const lists = top.keys.filter((k) => k.list).map((k) => k.key);
      if (lists.length === 1) return { key: lists[0] as string };
      const keys = top.keys.map((k) => k.key).join(', ') || 'none';
      if (lists.length === 0)
        throw new SourceError(`${file} holds an object with no list (its keys: ${keys}): ${EXPECTED}`);
      throw new SourceError(
        `${file} holds an object with several lists (${lists.join(', ')}): keep the one of the rows, or save the rows as JSONL`,
      );
    }
  }
}
