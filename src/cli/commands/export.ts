import path from 'node:path';
import type { Command } from 'commander';
import {
  PayloadError,
  EnvironmentError,
  exists,
  formatInt,
  loadConfig,
  loadConfiguredTokenizer,
  runDir,
  type Config,
} from '../../shared/index.js';
import { AtomicJsonlWriter } from '../export/index.js';
import { exportRows, type RowsExportStats } from '../export/index.js';
import { exportSpecForgeDataset, type SpecForgeExportStats } from '../export/index.js';
import { createTokenizeContext } from '../../workers/index.js';

/** The formats `export` writes. */
export const EXPORT_FORMATS = ['specforge', 'jsonl'] as const;
export type ExportFormat = (typeof EXPORT_FORMATS)[number];

interface ExportOptions {
  config: string;
  format: string;
  out?: string;
  dataset?: string[];
  json?: boolean;
}

/** What `export` did, as `--json` prints it. */
export type ExportResult =
  | {
      format: 'specforge';
      out: string;
      exported: number;
      datasets: SpecForgeExportStats[];
      skipped: { dataset: string; reason: string }[];
    }
  | ({ format: 'jsonl'; out: string; target: string } & RowsExportStats);

/** Checks `--format`; throws a PayloadError naming the accepted ones. */
export function parseExportFormat(value: string): ExportFormat {
  if ((EXPORT_FORMATS as readonly string[]).includes(value)) return value as ExportFormat;
  throw new PayloadError(`unknown --format ${JSON.stringify(value)}: expected one of ${EXPORT_FORMATS.join(', ')}`);
}

/** The configured datasets `--dataset` names (all when none), or a PayloadError naming the unknown ones. */
export function chooseDatasets(config: Config, names: readonly string[] | undefined): Config['datasets'] {
  if (names === undefined || names.length === 0) return config.datasets;
  const known = new Map(config.datasets.map((d) => [d.name, d]));
  const unknown = names.filter((n) => !known.has(n));
  if (unknown.length > 0) {
    throw new PayloadError(
      `--dataset ${unknown.map((n) => JSON.stringify(n)).join(', ')} ${unknown.length === 1 ? 'is' : 'are'} not in the config's datasets (${[...known.keys()].join(', ')})`,
    );
  }
  return names.map((n) => known.get(n)).filter((d) => d !== undefined);
}

async function exportSpecForge(config: Config, chosen: Config['datasets'], out: string): Promise<ExportResult> {
  const tokenizer = await loadConfiguredTokenizer(config);
  // With server-side tokenization, the few ids the template's format needs are fetched here, once.
  const ctx = await tokenizer.withServerTokens(() =>
    createTokenizeContext(tokenizer, { keepTruncated: config.postprocess.keepTruncated }),
  );
  const skipped: { dataset: string; reason: string }[] = [];
  const datasets: SpecForgeExportStats[] = [];
  const writer = await AtomicJsonlWriter.open(out);
  try {
    for (const d of chosen) {
      if (d.prompts === undefined) {
        skipped.push({
          dataset: d.name,
          reason: `a conversation dataset: ${d.conversations ?? ''} is already conversations`,
        });
        continue;
      }
      const generationsDir = path.join(runDir(config), d.name, 'generations');
      if (!(await exists(generationsDir))) {
        skipped.push({ dataset: d.name, reason: `nothing generated yet (no ${generationsDir})` });
        continue;
      }
      if (!(await exists(d.prompts))) {
        const i = config.datasets.indexOf(d);
        throw new EnvironmentError(
          `datasets[${i}].prompts: ${d.prompts} does not exist; export needs it to find the prompts of ${d.name}'s generations`,
        );
      }
      // The dataset's template variables, as generation and tokenize rendered with them.
      const dsCtx =
        d.chatTemplateKwargs === undefined
          ? ctx
          : await tokenizer.withServerTokens(() =>
              createTokenizeContext(tokenizer, {
                keepTruncated: config.postprocess.keepTruncated,
                templateKwargs: d.chatTemplateKwargs,
              }),
            );
      datasets.push(
        await exportSpecForgeDataset({
          dataset: d.name,
          promptsFile: d.prompts,
          generationsDir,
          ctx: dsCtx,
          writer,
          turns: d.turns,
        }),
      );
    }
    await writer.commit();
  } catch (e: unknown) {
    await writer.abort();
    throw e;
  }
  return { format: 'specforge', out, exported: writer.lines, datasets, skipped };
}

async function exportJsonl(
  config: Config,
  chosen: Config['datasets'],
  names: readonly string[] | undefined,
  out: string,
): Promise<ExportResult> {
  const target = config.postprocess.target;
  if (!(await exists(path.join(target, 'state.json')))) {
    throw new EnvironmentError(
      `no training dataset at ${target} (postprocess.target): run \`tokenmill postprocess -c <config>\` first`,
    );
  }
  const writer = await AtomicJsonlWriter.open(out);
  let stats: RowsExportStats;
  try {
    stats = await exportRows(
      target,
      writer,
      names === undefined || names.length === 0 ? undefined : chosen.map((d) => d.name),
    );
    await writer.commit();
  } catch (e: unknown) {
    await writer.abort();
    throw e;
  }
  return { format: 'jsonl', out, target, ...stats };
}

/** `export`'s summary for people. */
export function formatExportResult(r: ExportResult): string {
  if (r.format === 'jsonl') {
    const per = Object.entries(r.byDataset)
      .map(([name, n]) => `${name || '(no dataset column)'} ${formatInt(n)}`)
      .join(', ');
    return [
      `exported ${formatInt(r.exported)} of ${formatInt(r.rows)} rows (${formatInt(r.tokens)} tokens) of ${r.target} to ${r.out}`,
      `columns: ${r.columns.join(', ')}`,
      ...(per === '' ? [] : [`by dataset: ${per}`]),
    ].join('\n');
  }
  const lines = [`exported ${formatInt(r.exported)} conversations (SpecForge JSONL) to ${r.out}`];
  for (const d of r.datasets) {
    const dropped = d.droppedTruncated + d.droppedAborted + d.droppedEmpty;
    const parts = [`${formatInt(d.lines)} generations`, `${formatInt(d.exported)} exported`];
    if (d.keptTruncated > 0) parts.push(`${formatInt(d.keptTruncated)} of them truncated (postprocess.keepTruncated)`);
    if (d.stopWithoutEndOfTurn > 0)
      parts.push(`${formatInt(d.stopWithoutEndOfTurn)} of them stopped without the end-of-turn token`);
    if (dropped > 0) {
      parts.push(
        `${formatInt(dropped)} left out as tokenize leaves them out (${formatInt(d.droppedTruncated)} truncated, ${formatInt(d.droppedAborted)} aborted, ${formatInt(d.droppedEmpty)} empty)`,
      );
    }
    if (d.duplicates > 0) parts.push(`${formatInt(d.duplicates)} duplicates`);
    if (d.invalid > 0) parts.push(`${formatInt(d.invalid)} invalid lines`);
    if (d.promptMissing > 0) parts.push(`${formatInt(d.promptMissing)} without a prompt line`);
    if (d.promptChanged > 0) parts.push(`${formatInt(d.promptChanged)} whose prompt line changed`);
    lines.push(`  ${d.dataset}: ${parts.join(', ')}`);
    for (const x of d.examples) lines.push(`    ${x}`);
  }
  for (const s of r.skipped) lines.push(`  ${s.dataset}: not exported, ${s.reason}`);
  return lines.join('\n');
}

/** `export -c F --format specforge|jsonl [--out PATH] [--dataset NAME...]`. */
export function registerExportCommand(program: Command): void {
  program
    .command('export')
    .description(
      "write the generations as SpecForge conversation JSONL (--format specforge), or the training dataset's token rows as JSONL (--format jsonl)",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .requiredOption('--format <format>', `what to write: ${EXPORT_FORMATS.join(' | ')}`)
    .option('--out <path>', 'file to write (default: <output.dir>/<run>/export/<format>.jsonl)')
    .option('--dataset <name...>', 'only these datasets (default: all)')
    .option('--json', 'print the result as JSON')
    .action(async (opts: ExportOptions) => {
      const format = parseExportFormat(opts.format);
      const config = loadConfig({ path: opts.config });
      const chosen = chooseDatasets(config, opts.dataset);
      const out = path.resolve(
        opts.out ?? path.join(runDir(config), 'export', format === 'specforge' ? 'specforge.jsonl' : 'rows.jsonl'),
      );
      const result =
        format === 'specforge'
          ? await exportSpecForge(config, chosen, out)
          : await exportJsonl(config, chosen, opts.dataset, out);
      process.stdout.write(opts.json === true ? `${JSON.stringify(result)}\n` : `${formatExportResult(result)}\n`);
    });
}
