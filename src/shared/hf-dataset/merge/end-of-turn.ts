// Rows whose generation stopped without the template's end-of-turn token: the server's
// stop-token handling differs from what the chat template expects (e.g. the stop token is
// trimmed from output_ids), so the drafter would never be trained to end a turn. A few such
// rows are normal (a stop string, a custom stop token); more than a few percent are not.

/**
 * The share of a dataset's stopped rows that may lack end-of-turn supervision before the merge
 * warns (5 %).
 */
export const MAX_WITHOUT_END_OF_TURN_FRACTION = 0.05;

/** End-of-turn counts of one dataset of a merge, from its tokenize step. */
export interface EndOfTurnCount {
  dataset: string;
  /** Rows whose generation stopped (not truncated): those that should end with end-of-turn. */
  stoppedRows: number;
  /** Of those, rows that lack the end-of-turn token. */
  withoutEndOfTurn: number;
}

/**
 * One message per dataset where more than {@link MAX_WITHOUT_END_OF_TURN_FRACTION} of the
 * stopped rows lack end-of-turn supervision, saying what it means and what to check.
 */
export function endOfTurnFindings(
  counts: readonly EndOfTurnCount[],
  maxFraction = MAX_WITHOUT_END_OF_TURN_FRACTION,
): string[] {
  const out: string[] = [];
  for (const c of counts) {
    if (c.stoppedRows <= 0 || c.withoutEndOfTurn <= maxFraction * c.stoppedRows) continue;
    const pct = (x: number): string => `${Math.round(x * 1000) / 10}%`;
    out.push(
      `dataset ${c.dataset}: ${c.withoutEndOfTurn} of ${c.stoppedRows} rows (${pct(c.withoutEndOfTurn / c.stoppedRows)}, more than ` +
        `${pct(maxFraction)}) stopped without the end-of-turn token, so the drafter is not trained to end a turn there; ` +
        `the server's stop-token handling differs from what the chat template expects — check that the server returns ` +
        `the stop token in output_ids (SGLang: no stop-token trimming, no custom stop strings) and that tokenizer.path ` +
        `is the served model's`,
    );
  }
  return out;
}
