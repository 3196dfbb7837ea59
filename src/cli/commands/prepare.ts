import { relative } from 'node:path';
import type { Command } from 'commander';
import type { ChatTokenizer } from '../../shared/index.js';
import { prepareSources, sourcedDatasets, type DatasetPrepareOutcome } from '../../producers/prepare/prepare.js';
import { formatPrepareCounts, type PrepareCounts } from '../../producers/prepare/prepare-report.js';
import { startRunOver } from '../../producers/prepare/prepare-run-guard.js';
import { openRunContext, type RunContext } from '../run-context.js';

function shown(file: string): string {
  const rel = relative(process.cwd(), file);
  return rel.startsWith('..') || rel === '' ? file : rel;
}

/** One line per dataset: what was done, the numbers, where the prompts and the report are. */
export function formatPrepareOutcome(o: DatasetPrepareOutcome): string {
  const what = o.outcome === 'prepared' ? `prepared ${o.counts.kept.toLocaleString('en-US')} prompts into` : 'unchanged since the last prepare (sources and settings the same), kept';
  const format = `${o.format}${o.detectedFrom === undefined ? '' : `, detected from ${o.detectedFrom}`}`;
  const notes = o.notes === undefined ? '' : `; ${o.notes.join('; ')}`;
  return `${o.dataset}: ${what} ${shown(o.prompts)} (${formatPrepareCounts(o.counts)}; ${format}${notes}); report ${shown(o.report)}`;
}

function printProgress(dataset: string, counts: Readonly<PrepareCounts>): void {
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
async function whileNotSignalled<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
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

/**
 * `run --fresh`: the run's Redis keys and its folder's files (the embedded Redis server's folder
 * kept) are deleted, so the run starts over; refused while its producer runs.
 */
export async function startFresh(ctx: RunContext): Promise<void> {
  const { keys } = await startRunOver(ctx.redis, ctx.keys, ctx.runDir);
  process.stderr.write(`tokenmill: --fresh: run "${ctx.config.run}" starts over (${keys} Redis keys and the files in ${shown(ctx.runDir)} deleted)\n`);
}

/** `prepare`: from the datasets' `source` files to their prompt files. */
export function registerPrepareCommand(program: Command): void {
  program
    .command('prepare')
    .description(
      'turn each dataset\'s source (JSONL, JSON or parquet files as downloaded) into its prompt file: prompts end with a user turn, duplicates, empty and malformed rows and prompts over maxPromptTokens dropped, limit/shuffle applied; a prepare-report.json per dataset',
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print one JSON object per dataset')
    .action(async (opts: { config: string; json?: boolean }) => {
      const ctx = await openRunContext(opts.config);
      try {
        if (sourcedDatasets(ctx.config).length === 0) {
          process.stderr.write('tokenmill prepare: no dataset has a `source`; nothing to prepare\n');
          return;
        }
        const outcomes = await whileNotSignalled((signal) =>
          prepareSources({
            config: ctx.config,
            run: { redis: ctx.redis, keys: ctx.keys },
            signal,
            onDataset: (o) => {
              if (opts.json !== true) process.stdout.write(`${formatPrepareOutcome(o)}\n`);
            },
            onProgress: printProgress,
          }),
        );
        if (opts.json === true) for (const o of outcomes) process.stdout.write(`${JSON.stringify(o)}\n`);
      } finally {
        await ctx.close();
      }
    });
}
