/**
 * The numbers of one dataset's `prepare` and the first few rows of each kind it dropped, as
 * written to `<output.dir>/<run>/<dataset>/prepare-report.json` and shown by `status`.
 */
import { formatInt } from '../../shared/index.js';
import type { SourceRowWhere } from './source-types.js';

/** Rows of each outcome. `rowsRead` = kept + every drop + `overLimit` (when the whole source was read). */
export interface PrepareCounts {
  /** Rows read from the source (a `limit` without `shuffle` stops reading once it is reached). */
  rowsRead: number;
  /** Prompts written to the prompt file. */
  kept: number;
  /** Same messages as an earlier row of the dataset. */
  duplicates: number;
  /** Same messages as a prompt an earlier dataset kept (`prepare.dedupeAcross`). */
  duplicatesAcross: number;
  /** Longer than `maxPromptTokens` with the target's tokenizer and chat template. */
  tooLong: number;
  /** No user turn to answer, or a blank one. */
  empty: number;
  /** Rows that could not be read as turns (or whose chat template fails to render). */
  malformed: number;
  /** Left out by `limit`. */
  overLimit: number;
  /** Kept prompts whose id another kept prompt had already: written as `<id>~2`, `~3`, … */
  idsRenamed: number;
  /** Kept prompts that had turns after their last user turn (dropped). */
  trailingTurnsDropped: number;
  /** `turns: all`: kept conversations of more than one turn. */
  multiTurn?: number;
  /**
   * `turns: all` with a known context length: kept conversations that would not fit whole — the
   * last turn's prompt (with the record's tools) plus the dataset's `maxNewTokens` is over the
   * context length, so a later turn is likely to end the conversation early.
   */
  overContext?: number;
}

/** The kinds of row the report gives examples of. */
export type ExampleKind =
  'malformed' | 'empty' | 'tooLong' | 'duplicates' | 'duplicatesAcross' | 'idsRenamed' | 'overContext';

/** A row the report points at: where it is, its id when known, what happened. */
export interface PrepareExample extends SourceRowWhere {
  id?: string;
  reason: string;
  excerpt?: string;
}

/** Examples kept per kind. */
export const EXAMPLES_PER_KIND = 5;

/** The `prepare-report.json` of a dataset. */
export interface PrepareReport {
  dataset: string;
  /** `prepared`: the prompt file was written now; `unchanged`: sources and settings as last time, file kept. */
  outcome: 'prepared' | 'unchanged';
  source: { path: string; format: string; detectedFrom?: string; files: string[] };
  prompts: string;
  /** SHA-256 of the prompt file. */
  promptsSha256: string;
  /** Hash of the sources (files, sizes, mtimes) and settings the prompt file was made from. */
  fingerprint: string;
  maxPromptTokens: number | null;
  /** `turns: all`: the context length and `maxNewTokens` that `counts.overContext` was measured with. */
  contextCheck?: { contextLength: number; maxNewTokens: number };
  limit: number | null;
  shuffleSeed: number | null;
  dedupeAcross: boolean;
  counts: PrepareCounts;
  examples: Partial<Record<ExampleKind, PrepareExample[]>>;
  /** With `evalHoldout`: prompts of the file held out of generation (in `eval-prompts.jsonl` beside this report). */
  evalHeldOut?: number;
  /** How long the preparing took (ms); of the run that wrote the file when `unchanged`. */
  ms: number;
}

/** Counts at zero. */
export function emptyCounts(): PrepareCounts {
  return {
    rowsRead: 0,
    kept: 0,
    duplicates: 0,
    duplicatesAcross: 0,
    tooLong: 0,
    empty: 0,
    malformed: 0,
    overLimit: 0,
    idsRenamed: 0,
    trailingTurnsDropped: 0,
  };
}

/** Collects the first {@link EXAMPLES_PER_KIND} examples of each kind. */
export class ExampleLog {
  readonly examples: Partial<Record<ExampleKind, PrepareExample[]>> = {};

  add(kind: ExampleKind, example: PrepareExample): void {
    const list = (this.examples[kind] ??= []);
    if (list.length < EXAMPLES_PER_KIND) list.push(example);
  }
}

/** One line of numbers: "1,000 rows read, 950 kept, 30 duplicates, 5 too long, 10 empty, 5 malformed". */
export function formatPrepareCounts(c: PrepareCounts): string {
  const parts = [
    `${formatInt(c.rowsRead)} rows read`,
    `${formatInt(c.kept)} kept`,
    `${formatInt(c.duplicates + c.duplicatesAcross)} duplicates`,
  ];
  parts.push(`${formatInt(c.tooLong)} too long`, `${formatInt(c.empty)} empty`, `${formatInt(c.malformed)} malformed`);
  if (c.overLimit > 0) parts.push(`${formatInt(c.overLimit)} over the limit`);
  if (c.idsRenamed > 0) parts.push(`${formatInt(c.idsRenamed)} ids made unique`);
  if (c.multiTurn !== undefined) parts.push(`${formatInt(c.multiTurn)} with several turns`);
  if (c.overContext !== undefined) parts.push(`${formatInt(c.overContext)} that would not fit the context whole`);
  return parts.join(', ');
}
