// The `prepare` step as `run`, `produce` and `demo` take it: the config's sourced datasets prepared
// with the run's tokenizer, a line per dataset on stderr.
import { relative } from 'node:path';
import { formatInt, type ChatTokenizer } from '../shared/index.js';
import {
  formatPrepareCounts,
  prepareSources,
  type DatasetPrepareOutcome,
  type PrepareCounts,
} from '../producers/index.js';
import type { RunContext } from './run-context.js';

export function shown(file: string): string {
  const rel = relative(process.cwd(), file);
  return rel.startsWith('..') || rel === '' ? file : rel;
}

/** One line per dataset: what was done, the numbers, where the prompts and the report are. */
export function formatPrepareOutcome(o: DatasetPrepareOutcome): string {
  const what =
    o.outcome === 'prepared'
      ? `prepared ${formatInt(o.counts.kept)} prompts into`
      : 'unchanged since the last prepare (sources and settings the same), kept';
  const format = `${o.format}${o.detectedFrom === undefined ? '' : `, detected from ${o.detectedFrom}`}`;
  const notes = o.notes === undefined ? '' : `; ${o.notes.join('; ')}`;
  const held =
    o.evalHeldOut === undefined || o.evalPrompts === undefined
      ? ''
      : `; ${formatInt(o.evalHeldOut)} held out for eval in ${shown(o.evalPrompts)}`;
  return `${o.dataset}: ${what} ${shown(o.prompts)} (${formatPrepareCounts(o.counts)}${held}; ${format}${notes}); report ${shown(o.report)}`;
}

export function printProgress(dataset: string, counts: Readonly<PrepareCounts>): void {
  process.stderr.write(`tokenmill prepare: ${dataset}: so far ${formatPrepareCounts(counts)}\n`);
}

/**
 * The `prepare` step of `run`, `produce` and `demo`: prepares the config's sourced datasets with
 * the run's tokenizer, records the numbers for `status`, and refuses to change the prompts of
 * a run in progress. Prints a line per dataset to stderr.
 */
export async function prepareForRun(ctx: RunContext, tokenizer?: ChatTokenizer): Promise<DatasetPrepareOutcome[]> {
  return whileNotSignalled((signal) =>
    prepareSources({
      config: ctx.config,
      ...(tokenizer === undefined ? {} : { tokenizer }),
      run: { redis: ctx.redis, keys: ctx.keys },
      signal,
      onDataset: (o) => process.stderr.write(`tokenmill prepare: ${formatPrepareOutcome(o)}\n`),
      onProgress: printProgress,
    }),
  );
}

/** Runs `fn` with a signal aborted by SIGINT or SIGTERM, so that a prepare stops cleanly (its temp files removed, Redis closed). */
export async function whileNotSignalled<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const abort = new AbortController();
  const onSignal = (sig: NodeJS.Signals): void => abort.abort(sig);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    return await fn(abort.signal);
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}
