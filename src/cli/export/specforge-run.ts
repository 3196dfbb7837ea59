/**
 * `export --format specforge` over a run's chosen datasets: the lines (specforge.ts), the files
 * and their sidecars (specforge-files.ts), the SpecForge template that fits the configured
 * tokenizer's chat template (specforge-templates.ts), and the report, for people and `--json`.
 */
import path from 'node:path';

import {
  EnvironmentError,
  PayloadError,
  exists,
  formatInt,
  loadConfiguredTokenizer,
  runDir,
  type Config,
} from '../../shared/index.js';
import { createTokenizeContext, type TokenizeContext } from '../../workers/index.js';
import { formatDflashExport, type DflashExportStats, type DflashRows } from './dflash-rows.js';
import { exportSpecForgeDataset } from './specforge.js';
import { SpecForgeOutput, type SpecForgeFileReport } from './specforge-files.js';
import type { SpecForgeExportStats, SpecForgeLine, SpecForgeRowKind } from './specforge-rows.js';
import { matchSpecForgeTemplate, type SpecForgeTemplate, type TemplateMatch } from './specforge-templates.js';

/** The SpecForge template chosen for the export, and why (as the report states it). */
export interface ChosenTemplate {
  /** `data.chat_template`, or null when none fits. */
  name: string | null;
  /** Every SpecForge template that fits. */
  fitting: string[];
  /** What the chat template writes around an answer. */
  format: TemplateMatch['format'];
  /** Why there is none, when there is none. */
  reason?: string;
}

/** What `export --format specforge` did, as `--json` prints it. */
export interface SpecForgeRunResult {
  format: 'specforge';
  out: string;
  /** Lines written, all files together. */
  exported: number;
  datasets: SpecForgeExportStats[];
  skipped: { dataset: string; reason: string }[];
  chatTemplate: ChosenTemplate;
  /** The files written, each with the SpecForge settings that read it. */
  files: SpecForgeFileReport[];
  /** Rows whose text does not encode back to their ids, all files together. */
  reencodeDiffers: number;
  /** With `--drafter dflash`: the rows left out for it, the anchor positions per row, the mask token checked. */
  dflash?: DflashExportStats;
}

/** The report's sentence about rows that re-encode differently. */
export function reencodeSentence(n: number): string {
  return (
    `${formatInt(n)} ${n === 1 ? 'row re-encodes' : 'rows re-encode'} differently (non-canonical token splits the server produced); for those, ` +
    "SpecForge's conversation loader cannot reproduce the ids — use `export --format jsonl` as `data.prompts_path` (exact)"
  );
}

/** The one template for every exported dataset's format, or none with the reason. */
function chooseTemplate(matches: readonly { dataset: string; match: TemplateMatch }[]): {
  template: SpecForgeTemplate | undefined;
  chosen: ChosenTemplate;
} {
  const first = matches[0]?.match;
  if (first === undefined) return { template: undefined, chosen: { name: null, fitting: [], format: emptyFormat() } };
  const names = new Set(matches.map((m) => m.match.template?.name ?? null));
  if (names.size > 1) {
    const each = matches.map((m) => `${m.dataset}: ${m.match.template?.name ?? 'none'}`).join(', ');
    return {
      template: undefined,
      chosen: {
        name: null,
        fitting: [],
        format: first.format,
        reason: `the datasets' chat template settings need different SpecForge templates (${each}): export them apart with --dataset`,
      },
    };
  }
  const template = first.template;
  if (template === undefined) {
    return {
      template: undefined,
      chosen: {
        name: null,
        fitting: [],
        format: first.format,
        reason:
          `no SpecForge 0.2.0 template has this chat template's assistant header ${JSON.stringify(first.format.assistant_header)}, ` +
          `end of turn ${JSON.stringify(first.format.end_of_turn)} and ignore_token ${JSON.stringify(first.format.ignorable)}, ` +
          'so its loader would supervise other tokens than the rows: use `export --format jsonl` as `data.prompts_path` (exact)',
      },
    };
  }
  return { template, chosen: { name: template.name, fitting: first.fitting, format: first.format } };
}

function emptyFormat(): TemplateMatch['format'] {
  return { assistant_header: '', end_of_turn: '', ignorable: [] };
}

/** Writes the SpecForge export of the `chosen` datasets of `config` to `out` (and its siblings). */
export async function exportSpecForgeRun(
  config: Config,
  chosen: Config['datasets'],
  out: string,
  dflash?: DflashRows,
): Promise<SpecForgeRunResult> {
  const tokenizer = await loadConfiguredTokenizer(config);
  if (tokenizer.encoderKind === 'server') {
    throw new EnvironmentError(
      'tokenizer.kind: server: `export --format specforge` decodes and re-encodes every row, which needs the tokenizer here ' +
        "(huggingface or tiktoken); `export --format jsonl` writes the rows as they are, for SpecForge's data.prompts_path",
    );
  }
  const contextFor = (kwargs: Record<string, unknown> | undefined): Promise<TokenizeContext> =>
    // With server-side tokenization, the few ids the template's format needs are fetched here, once.
    tokenizer.withServerTokens(() =>
      createTokenizeContext(tokenizer, {
        keepTruncated: config.postprocess.keepTruncated,
        ...(kwargs === undefined ? {} : { templateKwargs: kwargs }),
      }),
    );
  const ctx = await contextFor(undefined);
  const skipped: { dataset: string; reason: string }[] = [];
  const datasets: SpecForgeExportStats[] = [];
  const matches: { dataset: string; match: TemplateMatch }[] = [];
  const output = await SpecForgeOutput.open(out);
  const sink =
    dflash === undefined
      ? output
      : { write: (kind: SpecForgeRowKind, line: SpecForgeLine) => output.write(kind, line), dflash };
  let files: SpecForgeFileReport[];
  let dflashStats: DflashExportStats | undefined;
  let picked: ReturnType<typeof chooseTemplate>;
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
      const dsCtx = d.chatTemplateKwargs === undefined ? ctx : await contextFor(d.chatTemplateKwargs);
      const stats = await exportSpecForgeDataset({
        dataset: d.name,
        promptsFile: d.prompts,
        generationsDir,
        ctx: dsCtx,
        sink,
        turns: d.turns,
        rows: config.postprocess.rows,
        samplesPerPrompt: d.samplesPerPrompt,
      });
      datasets.push(stats);
      if (stats.exported > 0) matches.push({ dataset: d.name, match: matchSpecForgeTemplate(dsCtx.format) });
    }
    assertSomethingExported(output.lines, datasets);
    dflashStats = dflash?.finish(out);
    if (matches.length === 0) matches.push({ dataset: '', match: matchSpecForgeTemplate(ctx.format) });
    picked = chooseTemplate(matches);
    files = await output.commit(datasets, picked.template);
  } catch (e: unknown) {
    await output.abort();
    throw e;
  }
  return {
    format: 'specforge',
    out,
    exported: output.lines,
    datasets,
    skipped,
    chatTemplate: picked.chosen,
    files,
    reencodeDiffers: files.reduce((n, f) => n + f.reencodeDiffers, 0),
    ...(dflashStats === undefined ? {} : { dflash: dflashStats }),
  };
}

/**
 * Refuses an export that would write no line while there are generation records: never "exit 0,
 * wrote nothing". The message says, per dataset, what became of its records.
 */
function assertSomethingExported(lines: number, datasets: readonly SpecForgeExportStats[]): void {
  if (lines > 0 || !datasets.some((d) => d.lines > 0)) return;
  const each = datasets.flatMap((d) => [datasetLine(d), ...d.examples.map((x) => `    ${x}`)]);
  throw new PayloadError(
    `export --format specforge would write no row, though there are generation records:\n${each.join('\n')}`,
  );
}

function datasetLine(d: SpecForgeExportStats): string {
  const dropped = d.droppedTruncated + d.droppedAborted + d.droppedEmpty;
  const parts = [`${formatInt(d.lines)} generations`, `${formatInt(d.exported)} rows exported`];
  const all = d.byKind['all-turns'].rows;
  if (all > 0)
    parts.push(
      `${formatInt(all)} of them whole conversations (${formatInt(d.inConversationRows)} earlier turns inside them)`,
    );
  if (d.keptTruncated > 0) parts.push(`${formatInt(d.keptTruncated)} of them truncated (postprocess.keepTruncated)`);
  if (d.stopWithoutEndOfTurn > 0)
    parts.push(`${formatInt(d.stopWithoutEndOfTurn)} of them stopped without the end-of-turn token`);
  if (dropped > 0) {
    parts.push(
      `${formatInt(dropped)} left out as tokenize leaves them out (${formatInt(d.droppedTruncated)} truncated, ${formatInt(d.droppedAborted)} aborted, ${formatInt(d.droppedEmpty)} empty)`,
    );
  }
  if (d.dflashLeftOut > 0)
    parts.push(`${formatInt(d.dflashLeftOut)} left out for DFlash (fewer than 2 adjacent supervised tokens)`);
  if (d.duplicates > 0) parts.push(`${formatInt(d.duplicates)} duplicates`);
  if (d.invalid > 0) parts.push(`${formatInt(d.invalid)} invalid lines`);
  if (d.promptMissing > 0) parts.push(`${formatInt(d.promptMissing)} without a prompt line`);
  if (d.promptChanged > 0) parts.push(`${formatInt(d.promptChanged)} whose prompt line changed`);
  const reencode = d.byKind['last-turn'].reencodeDiffers + d.byKind['all-turns'].reencodeDiffers;
  if (reencode > 0) parts.push(`${formatInt(reencode)} re-encode differently (${d.reencodeExamples.join(', ')}…)`);
  return `  ${d.dataset}: ${parts.join(', ')}`;
}

/** The export's summary for people. */
export function formatSpecForgeResult(r: SpecForgeRunResult): string {
  const lines = [`exported ${formatInt(r.exported)} rows (SpecForge JSONL: text and conversations) to ${r.out}`];
  for (const d of r.datasets) {
    lines.push(datasetLine(d));
    for (const x of d.examples) lines.push(`    ${x}`);
  }
  for (const s of r.skipped) lines.push(`  ${s.dataset}: not exported, ${s.reason}`);
  const t = r.chatTemplate;
  if (t.name === null) {
    lines.push(`SpecForge: ${t.reason ?? 'no template fits'}; no sidecar written`);
  } else {
    lines.push(
      `SpecForge 0.2 (data.chat_template: ${t.name}, data.is_preformatted: true; each line's text is the row's tokens):`,
    );
    for (const f of r.files) {
      const where = f.sidecar === undefined ? '' : `, data section in ${f.sidecar}`;
      lines.push(
        `  ${f.file}: ${formatInt(f.rows)} rows, train_only_last_turn: ${String(f.kind === 'last-turn')}, max_length: ${f.longest}${where}`,
      );
    }
  }
  if (r.reencodeDiffers > 0) lines.push(reencodeSentence(r.reencodeDiffers));
  if (r.dflash !== undefined) lines.push(...formatDflashExport(r.dflash));
  return lines.join('\n');
}
