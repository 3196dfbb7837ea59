import type { Command } from 'commander';
import {
  formatAnchorHistogram,
  formatInt,
  loadConfig,
  readRunStatus,
  rollbackTarget,
  runDir,
  type AnchorHistogram,
  type MergeJobResult,
  type MergeReportSummary,
  type RollbackResult,
  type TokenizeResult,
} from '../../shared/index.js';
import {
  datasetDrops,
  dropContextOf,
  dropsSentence,
  LARGE_DROP_FRACTION,
  nothingNewHeadline,
  type DropContext,
} from '../drop-summary.js';
import { PostprocessFailedError, type RoundOutcome } from '../../workers/index.js';
import { startPostprocess } from '../pipeline.js';
import { armStopDeadline, exitInterrupted, onceSignalled, openRunContext, type RunContext } from '../run-context.js';

function fmtPct(x: number): string {
  return `${(100 * x).toFixed(1)}%`;
}

function table(header: string[], rows: string[][]): string[] {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const fmt = (r: string[]): string =>
    r
      .map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [fmt(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(fmt)];
}

function datasetRow(d: TokenizeResult): string[] {
  const dropped = d.droppedTruncated + d.droppedAborted + d.droppedEmpty + d.droppedUnsupervised;
  return [
    d.dataset,
    d.kind,
    formatInt(d.lines),
    formatInt(d.rows),
    formatInt(d.tokens),
    d.tokens === 0 ? '' : fmtPct(d.supervisedTokens / d.tokens),
    formatInt(d.alreadyMerged),
    formatInt(dropped),
    formatInt(d.duplicates),
    formatInt(d.invalid),
  ];
}

/**
 * Per dataset that left records out: how many of its lines, for which reasons, and what to do;
 * a warning line for a dataset that lost more than {@link LARGE_DROP_FRACTION} of its records.
 */
export function formatDrops(result: MergeJobResult, ctx: DropContext = {}): string[] {
  const lines: string[] = [];
  for (const d of result.datasets.map((t) => datasetDrops(t, ctx))) {
    if (d.total === 0) continue;
    lines.push(
      `  ${d.dataset}: ${formatInt(d.total)} of ${formatInt(d.lines)} records (${fmtPct(d.fraction)}) — ${dropsSentence(d, formatInt)}`,
    );
  }
  return lines;
}

/** Warnings for datasets that lost a large share of their records. */
export function largeDropWarnings(result: MergeJobResult): string[] {
  return result.datasets
    .map((t) => datasetDrops(t))
    .filter((d) => d.large)
    .map(
      (d) =>
        `${d.dataset}: ${fmtPct(d.fraction)} of its records were dropped (more than ${fmtPct(LARGE_DROP_FRACTION)}): ` +
        d.byReason.map((c) => `${formatInt(c.count)} ${c.what}`).join(', '),
    );
}

/**
 * A post-process round's outcome for people: per dataset what was read, staged, left out and
 * why (with what to do about it, and a warning when a large share was left out); then the
 * merge's validation report (rows and tokens before → after, loss-mask coverage, shards,
 * samples checked, problems and warnings).
 */
export function formatPostprocessResult(result: MergeJobResult, ctx: DropContext = {}): string {
  const headline: Record<MergeJobResult['status'], string> = {
    merged: 'merged into the training dataset',
    'already-merged': 'already merged (by an earlier attempt of this round)',
    'nothing-new': nothingNewHeadline(result, formatInt),
  };
  const lines = [`post-processing ${result.flowId}: ${headline[result.status]}`, ''];
  if (result.datasets.length > 0) {
    lines.push(
      ...table(
        [
          'dataset',
          'source',
          'lines',
          'new rows',
          'tokens',
          'supervised',
          'already merged',
          'dropped',
          'duplicates',
          'invalid',
        ],
        result.datasets.map(datasetRow),
      ),
      '',
    );
  }
  const drops = formatDrops(result, ctx);
  if (drops.length > 0) lines.push('dropped', ...drops, '');
  const warnings = largeDropWarnings(result);
  for (const w of warnings) lines.push(`warning: ${w}`);
  if (warnings.length > 0) lines.push('');
  const r = result.report;
  if (r !== null) {
    lines.push(
      `validation report (${r.reportPath})`,
      `  target              ${r.target}${r.firstMerge ? ' (created)' : ''}`,
      `  rows                ${formatInt(r.oldRows)} -> ${formatInt(r.rows)} (+${formatInt(r.newRows)})`,
      `  tokens              ${formatInt(r.oldTokens)} -> ${formatInt(r.tokens)} (+${formatInt(r.newTokens)})`,
      `  loss-mask coverage  ${fmtPct(r.lossMaskCoverage)} (new rows: ${fmtPct(r.newLossMaskCoverage)})`,
      `  shards              ${formatInt(r.shards)} (+${formatInt(r.newShards)})`,
      ...dflashLines(r),
      `  samples checked     ${formatInt(r.checkedSamples)} read back equal to what was written`,
      `  problems            ${r.problems.length === 0 ? 'none' : r.problems.join('; ')}`,
    );
    for (const w of r.warnings) lines.push(`  warning             ${w}`);
  }
  return lines.join('\n').trimEnd();
}

/**
 * The report's DFlash lines: rows with fewer than 2 adjacent supervised tokens (which a DFlash
 * export leaves out), the rows by their anchor positions, the mask token checked.
 */
function dflashLines(r: MergeReportSummary): string[] {
  const d = r.dflash;
  if (d === undefined) return [];
  return [
    `  DFlash              ${formatInt(d.rowsWithoutAnchor)} rows with fewer than 2 adjacent supervised tokens (new: ${formatInt(d.newRowsWithoutAnchor)}); an export with --drafter dflash leaves them out`,
    `  anchor positions    per row: ${formatAnchorHistogram(d.anchorPositions as AnchorHistogram, formatInt)}`,
    ...(d.maskToken === null
      ? []
      : [`  DFlash mask token   ${d.maskToken.token} (id ${d.maskToken.id}): special, in no new row`]),
  ];
}

/** What `rollback` did, for people. */
export function formatRollbackResult(r: RollbackResult): string {
  return [
    `rolled back merge ${r.undoneMergeId}: ${formatInt(r.undoneNewRows)} rows removed from ${r.target}`,
    `restored: ${formatInt(r.restored.rows)} rows, ${formatInt(r.restored.tokens)} tokens, ${formatInt(r.restored.shards)} shards`,
    `merges that can still be rolled back: ${r.remainingMerges}`,
    `record: ${r.reportPath}`,
  ].join('\n');
}

/**
 * Runs a post-process round in this process (a worker serves it) until it ends or a signal
 * arrives. Returns the outcome; 'signalled' when interrupted (the round stays in Redis and the
 * next `postprocess`, `run` or post-processing worker takes it up). Exported for `run` and `demo`.
 */
export async function runPostprocess(ctx: RunContext): Promise<RoundOutcome | 'signalled'> {
  const handle = await startPostprocess(ctx, { worker: true, wait: true });
  process.stderr.write(
    `tokenmill: post-processing ${handle.round.flowId}${handle.round.reused ? ' (joined the round in progress)' : ''}: ${handle.round.datasets.join(', ') || 'no dataset has data yet'}\n`,
  );
  try {
    const outcome = await Promise.race([handle.finished, onceSignalled().then(() => 'signalled' as const)]);
    // A stop is bounded even when Redis is gone: the grace period + 30 s, then the process exits.
    if (outcome === 'signalled') armStopDeadline(ctx.config.workers.shutdownGraceMs + 30_000);
    return outcome;
  } finally {
    await handle.stop();
  }
}

/** Throws a failed round as an error whose message is its reason. */
export function throwIfFailed(outcome: RoundOutcome | 'signalled'): void {
  if (outcome !== 'signalled' && outcome.status === 'failed')
    throw new PostprocessFailedError(outcome.flowId, outcome.reason);
}

/** `postprocess` (tokenize + merge now) and `rollback` (restore the dataset before the last merge). */
export function registerPostprocessCommands(program: Command): void {
  program
    .command('postprocess')
    .description(
      'tokenize what has been generated so far and merge the rows the training dataset lacks (one validation report); ' +
        'datasets still generating are post-processed as far as they are on disk — run it again later for the rest',
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print the result as JSON')
    .action(async (opts: { config: string; json?: boolean }) => {
      const ctx = await openRunContext(opts.config);
      try {
        const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
        const unfinished = status.datasets.filter((d) => d.status !== 'completed');
        if (unfinished.length > 0) {
          process.stderr.write(
            `tokenmill: note: generation is not completed for ${unfinished.map((d) => `${d.name} (${d.status})`).join(', ')}; ` +
              'post-processing what is on disk now\n',
          );
        }
        const outcome = await runPostprocess(ctx);
        if (outcome === 'signalled') {
          process.stderr.write('tokenmill: interrupted; the round stays queued and the next `postprocess` joins it\n');
          exitInterrupted();
          return;
        }
        if (outcome.status === 'failed') throw new PostprocessFailedError(outcome.flowId, outcome.reason);
        if (opts.json === true) {
          process.stdout.write(`${JSON.stringify(outcome.result)}\n`);
          for (const w of largeDropWarnings(outcome.result)) process.stderr.write(`tokenmill: warning: ${w}\n`);
        } else {
          process.stdout.write(`${formatPostprocessResult(outcome.result, dropContextOf(ctx.config))}\n`);
        }
      } finally {
        await ctx.close();
      }
    });

  program
    .command('rollback')
    .description('restore the training dataset as it was before the last merge (run again to undo earlier merges)')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print the result as JSON')
    .action(async (opts: { config: string; json?: boolean }) => {
      const config = loadConfig({ path: opts.config });
      const result = await rollbackTarget({ target: config.postprocess.target, runDir: runDir(config) });
      process.stdout.write(opts.json === true ? `${JSON.stringify(result)}\n` : `${formatRollbackResult(result)}\n`);
    });
}
