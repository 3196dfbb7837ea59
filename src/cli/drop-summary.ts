/**
 * What a post-process round left out, per dataset and reason, and what to do about it: the
 * counters of the tokenize results ({@link TokenizeResult}) turned into sentences for the round's
 * summary, and the warning when a large share of a dataset was left out.
 *
 * A record is left out when it is dropped (a truncated, aborted or empty generation; a
 * conversation with nothing to supervise) or its line is invalid. Rows already in the training
 * dataset and duplicate lines are not left out: their sample is in the dataset.
 */
import type { Config, MergeJobResult, TokenizeResult } from '../shared/index.js';

/** A dataset whose left-out share is above this gets a warning in the round's summary. */
export const LARGE_DROP_FRACTION = 0.2;

/** Why records were left out. */
export type DropReason = 'truncated' | 'aborted' | 'empty' | 'unsupervised' | 'invalid';

/** Records of one dataset left out for one reason. */
export interface DropCount {
  reason: DropReason;
  count: number;
  /** What these records are, e.g. `finish_reason length (cut at maxNewTokens)`. */
  what: string;
  /** What to do about them. */
  fix: string;
}

/** One dataset's left-out records. */
export interface DatasetDrops {
  dataset: string;
  /** Non-blank lines read. */
  lines: number;
  /** Left out, all reasons. */
  total: number;
  /** `total / lines` (0 without lines). */
  fraction: number;
  /** Above {@link LARGE_DROP_FRACTION}. */
  large: boolean;
  byReason: DropCount[];
}

/** Optional context for the advice: the dataset's `maxNewTokens`. */
export interface DropContext {
  maxNewTokens?: (dataset: string) => number | undefined;
}

/** The advice context of a run's config: each dataset's `maxNewTokens`. */
export function dropContextOf(config: Config): DropContext {
  const maxNew = new Map(config.datasets.map((d) => [d.name, d.maxNewTokens]));
  return { maxNewTokens: (dataset) => maxNew.get(dataset) };
}

/** The left-out records of one dataset, by reason (reasons with none omitted), largest first. */
export function datasetDrops(d: TokenizeResult, ctx: DropContext = {}): DatasetDrops {
  const maxNew = ctx.maxNewTokens?.(d.dataset);
  const firstInvalid = d.invalidExamples[0];
  const all: DropCount[] = [
    {
      reason: 'truncated',
      count: d.droppedTruncated,
      what: 'finish_reason length (cut at maxNewTokens)',
      fix: `raise maxNewTokens of dataset ${d.dataset}${maxNew === undefined ? '' : ` (now ${String(maxNew)})`} or set postprocess.keepTruncated: true`,
    },
    {
      reason: 'aborted',
      count: d.droppedAborted,
      what: 'finish_reason abort (partial outputs: stopped at the budget by budget: strict, or aborted by the server)',
      fix: 'set postprocess.keepTruncated: true to keep them like truncated ones; for aborts by the server, see its log',
    },
    {
      reason: 'empty',
      count: d.droppedEmpty,
      what: 'no output tokens',
      fix: 'check the stop strings and stop_token_ids of the sampling parameters (one that matches at once ends every generation)',
    },
    {
      reason: 'unsupervised',
      count: d.droppedUnsupervised,
      what: 'conversations without any assistant token to train on',
      fix: 'check the roles of the conversation file (assistant turns are what is supervised)',
    },
    {
      reason: 'invalid',
      count: d.invalid,
      what: 'invalid lines',
      fix:
        firstInvalid === undefined
          ? 'see the worker log'
          : `first: ${firstInvalid.file}:${String(firstInvalid.line)}: ${firstInvalid.reason}`,
    },
  ];
  const byReason = all.filter((c) => c.count > 0).sort((a, b) => b.count - a.count);
  const total = byReason.reduce((n, c) => n + c.count, 0);
  const fraction = d.lines === 0 ? 0 : total / d.lines;
  return { dataset: d.dataset, lines: d.lines, total, fraction, large: fraction > LARGE_DROP_FRACTION, byReason };
}

/** `200,000 dropped: finish_reason length … — raise …; 3 dropped: …` */
export function dropsSentence(drops: DatasetDrops, fmt: (n: number) => string = String): string {
  return drops.byReason.map((c) => `${fmt(c.count)} dropped: ${c.what} — ${c.fix}`).join('; ');
}

/**
 * The headline of a round that merged nothing: why. A round that read nothing, one whose
 * records are all already in the training dataset, and one whose records were left out differ.
 */
export function nothingNewHeadline(result: MergeJobResult, fmt: (n: number) => string = String): string {
  const lines = result.datasets.reduce((n, d) => n + d.lines, 0);
  if (lines === 0) return 'nothing to merge: no dataset has records on disk yet';
  const drops = result.datasets.map((d) => datasetDrops(d));
  const dropped = drops.reduce((n, d) => n + d.total, 0);
  const already = result.datasets.reduce((n, d) => n + d.alreadyMerged, 0);
  if (dropped === 0) return 'nothing new: the training dataset already holds every row';
  const reasons = new Map<string, number>();
  for (const d of drops) for (const c of d.byReason) reasons.set(c.what, (reasons.get(c.what) ?? 0) + c.count);
  const why = [...reasons].map(([what, n]) => `${fmt(n)} ${what}`).join(', ');
  if (already === 0) {
    return `nothing merged: ${fmt(dropped)} of ${fmt(lines)} records were dropped (${why}); the training dataset got no new row — see "dropped" below`;
  }
  return `nothing new: ${fmt(already)} rows are already in the training dataset and ${fmt(dropped)} records were dropped (${why}) — see "dropped" below`;
}
