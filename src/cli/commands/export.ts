import path from 'node:path';
import type { Command } from 'commander';
import {
  PayloadError,
  EnvironmentError,
  checkDflashMaskToken,
  exists,
  formatInt,
  loadConfig,
  loadConfiguredTokenizer,
  runDir,
  type Config,
} from '../../shared/index.js';
import { DRAFTERS, DflashRows, formatDflashExport, parseDrafter, type Drafter } from '../export/index.js';
import { AtomicJsonlWriter } from '../export/index.js';
import { exportRows, type RowsExportStats } from '../export/index.js';
import { exportSpecForgeRun, formatSpecForgeResult, type SpecForgeRunResult } from '../export/index.js';
import {
  exportSpeculators,
  formatSpeculatorsExport,
  speculatorsTrainCommand,
  verifierOf,
  type SpeculatorsExportStats,
} from '../export/index.js';

/** The formats `export` writes. */
export const EXPORT_FORMATS = ['specforge', 'jsonl', 'speculators'] as const;
export type ExportFormat = (typeof EXPORT_FORMATS)[number];

interface ExportOptions {
  config: string;
  format: string;
  out?: string;
  dataset?: string[];
  drafter?: string;
  json?: boolean;
}

/** What `export` did, as `--json` prints it. */
export type ExportResult =
  | SpecForgeRunResult
  | ({ format: 'jsonl'; out: string; target: string } & RowsExportStats)
  | ({ format: 'speculators'; train: string } & SpeculatorsExportStats);

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

/** The training dataset folder (`postprocess.target`), or an EnvironmentError saying how to make it. */
async function trainingDataset(config: Config): Promise<string> {
  const target = config.postprocess.target;
  if (!(await exists(path.join(target, 'state.json')))) {
    throw new EnvironmentError(
      `no training dataset at ${target} (postprocess.target): run \`tokenmill postprocess -c <config>\` first`,
    );
  }
  return target;
}

async function exportJsonl(
  config: Config,
  chosen: Config['datasets'],
  names: readonly string[] | undefined,
  out: string,
  dflash: DflashRows | undefined,
): Promise<ExportResult> {
  const target = await trainingDataset(config);
  const writer = await AtomicJsonlWriter.open(out);
  let stats: RowsExportStats;
  try {
    stats = await exportRows(
      target,
      writer,
      names === undefined || names.length === 0 ? undefined : chosen.map((d) => d.name),
      dflash,
    );
    await writer.commit();
  } catch (e: unknown) {
    await writer.abort();
    throw e;
  }
  return { format: 'jsonl', out, target, ...stats };
}

/** `--format speculators`: the training dataset as the folder `speculators train --data-path` reads. */
async function exportSpeculatorsFolder(
  config: Config,
  chosen: Config['datasets'],
  names: readonly string[] | undefined,
  out: string,
  dflash: DflashRows | undefined,
): Promise<ExportResult> {
  const target = await trainingDataset(config);
  const stats = await exportSpeculators({
    target,
    out,
    datasets: names === undefined || names.length === 0 ? undefined : chosen.map((d) => d.name),
    shardSizeMiB: config.postprocess.shardSizeMiB,
    dflash,
  });
  return { format: 'speculators', ...stats, train: speculatorsTrainCommand(stats, verifierOf(config.tokenizer.path)) };
}

/**
 * The DFlash filter of `--drafter dflash` (none for eagle3), with `postprocess.dflash.maskToken`
 * checked against the tokenizer first (a ConfigError saying what is wrong with it).
 */
export async function dflashRowsFor(config: Config, drafter: Drafter): Promise<DflashRows | undefined> {
  if (drafter !== 'dflash') return undefined;
  const maskToken = config.postprocess.dflash?.maskToken;
  if (maskToken === undefined) return new DflashRows();
  const tokenizer = await loadConfiguredTokenizer(config);
  return new DflashRows(checkDflashMaskToken(tokenizer, maskToken, config.source.file));
}

/** `export`'s summary for people. */
export function formatExportResult(r: ExportResult): string {
  if (r.format === 'speculators') return formatSpeculatorsExport(r, r.train);
  if (r.format === 'jsonl') {
    const per = Object.entries(r.byDataset)
      .map(([name, n]) => `${name || '(no dataset column)'} ${formatInt(n)}`)
      .join(', ');
    return [
      `exported ${formatInt(r.exported)} of ${formatInt(r.rows)} rows (${formatInt(r.tokens)} tokens) of ${r.target} to ${r.out}`,
      `columns: ${r.columns.join(', ')}`,
      ...(per === '' ? [] : [`by dataset: ${per}`]),
      ...(r.dflash === undefined ? [] : formatDflashExport(r.dflash)),
    ].join('\n');
  }
  return formatSpecForgeResult(r);
}

/** `export -c F --format specforge|jsonl|speculators [--out PATH] [--dataset NAME...] [--drafter eagle3|dflash]`. */
export function registerExportCommand(program: Command): void {
  program
    .command('export')
    .description(
      "write the generations as SpecForge conversation JSONL (--format specforge), the training dataset's token rows as JSONL (--format jsonl), or the training dataset as the folder `speculators train --data-path` reads (--format speculators)",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .requiredOption('--format <format>', `what to write: ${EXPORT_FORMATS.join(' | ')}`)
    .option(
      '--out <path>',
      'file to write (default: <output.dir>/<run>/export/<format>.jsonl); for speculators a folder (default: <output.dir>/<run>/export/speculators)',
    )
    .option('--dataset <name...>', 'only these datasets (default: all)')
    .option(
      '--drafter <drafter>',
      `the drafter trained on the export: ${DRAFTERS.join(' | ')} (default eagle3); dflash leaves out rows with fewer than 2 adjacent supervised tokens, says how many, and checks postprocess.dflash.maskToken`,
    )
    .option('--json', 'print the result as JSON')
    .action(async (opts: ExportOptions) => {
      const format = parseExportFormat(opts.format);
      const drafter = parseDrafter(opts.drafter);
      const config = loadConfig({ path: opts.config });
      const chosen = chooseDatasets(config, opts.dataset);
      const dflash = await dflashRowsFor(config, drafter);
      const defaultName = { specforge: 'specforge.jsonl', jsonl: 'rows.jsonl', speculators: 'speculators' }[format];
      const out = path.resolve(opts.out ?? path.join(runDir(config), 'export', defaultName));
      const result =
        format === 'specforge'
          ? await exportSpecForgeRun(config, chosen, out, dflash)
          : format === 'jsonl'
            ? await exportJsonl(config, chosen, opts.dataset, out, dflash)
            : await exportSpeculatorsFolder(config, chosen, opts.dataset, out, dflash);
      process.stdout.write(opts.json === true ? `${JSON.stringify(result)}\n` : `${formatExportResult(result)}\n`);
    });
}
