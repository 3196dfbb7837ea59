import { PayloadError, type InvalidLineSchema } from '../../shared/index.js';
import type { z } from 'zod';

type InvalidLine = z.infer<typeof InvalidLineSchema>;

/**
 * Whether a source has more invalid lines than it may: more than `maxInvalidFraction` of its
 * lines (with 0, any invalid line is too many). Returns the error to fail the job with, naming
 * the first invalid lines, or undefined.
 */
export function invalidLinesError(
  dataset: string,
  stats: { lines: number; invalid: number; invalidExamples: readonly InvalidLine[] },
  maxInvalidFraction: number,
  hint = '',
): PayloadError | undefined {
  if (stats.invalid === 0 || stats.invalid <= maxInvalidFraction * stats.lines) return undefined;
  const examples = stats.invalidExamples
    .slice(0, 3)
    .map((x) => `${x.file}:${x.line}: ${x.reason}`)
    .join('; ');
  const allowed =
    maxInvalidFraction === 0 ? 'none allowed' : `at most ${Math.round(maxInvalidFraction * 1000) / 10}% allowed`;
  return new PayloadError(
    `dataset ${dataset}: ${stats.invalid} of ${stats.lines} lines are invalid (${allowed}): ${examples}${hint}`,
  );
}
