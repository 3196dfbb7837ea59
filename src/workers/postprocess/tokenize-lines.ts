/** Reading JSONL inputs of the tokenize step line by line, and counting the lines that cannot be used. */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';

import type { Logger } from '../../shared/index.js';

/** A line that could not be used, for the report. */
export interface InvalidLine {
  file: string;
  /** 1-based. */
  line: number;
  reason: string;
}

/** At most this many invalid lines are kept as examples in the counters. */
export const INVALID_EXAMPLES = 20;

/** The non-blank lines of a text file, with their 1-based numbers. */
export async function* jsonLines(file: string): AsyncGenerator<{ line: number; text: string }> {
  const rl = createInterface({ input: createReadStream(file, { encoding: 'utf8' }), crlfDelay: Infinity });
  let line = 0;
  try {
    for await (const text of rl) {
      line += 1;
      if (text.trim() !== '') yield { line, text };
    }
  } finally {
    rl.close();
  }
}

/** Counts an invalid line; the first ones are kept as examples and logged, the rest only counted. */
export function noteInvalid(
  stats: { invalid: number; invalidExamples: InvalidLine[] },
  log: Logger,
  entry: InvalidLine,
): void {
  stats.invalid += 1;
  if (stats.invalidExamples.length >= INVALID_EXAMPLES) return;
  stats.invalidExamples.push(entry);
  log.warn({ file: entry.file, line: entry.line, reason: entry.reason }, 'skipped an invalid line');
}
