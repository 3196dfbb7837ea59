/** Rows of a JSONL source file: one JSON value per non-blank line, streamed. */
import { errorMessage } from '../../shared/index.js';
import { readRawLineChunks } from '../../shared/index.js';
import { excerptOf, type RawRow } from './source-raw.js';

/**
 * The rows of a JSONL file with their 1-based lines (blank lines are skipped but counted; row
 * numbers count the non-blank lines from 0). A line that is not JSON, or not UTF-8, is a
 * malformed row with its reason; the file is read a chunk of lines at a time.
 */
export async function* readJsonlRows(file: string): AsyncGenerator<RawRow> {
  let row = 0;
  for await (const chunk of readRawLineChunks(file)) {
    for (const l of chunk) {
      const where = { file, row, line: l.line };
      row += 1;
      if (l.text === undefined) {
        yield { ok: false, reason: l.unreadable, where };
        continue;
      }
      let value: unknown;
      try {
        value = JSON.parse(l.text) as unknown;
      } catch (e: unknown) {
        yield { ok: false, reason: `not valid JSON: ${errorMessage(e)}`, where, excerpt: excerptOf(l.text) };
        continue;
      }
      yield { ok: true, value, where };
    }
  }
}
