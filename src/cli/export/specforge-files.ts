/**
 * The files of `export --format specforge`: `<out>` for the rows that supervise their last turn
 * only, `<out stem>.all-turns.jsonl` for the whole-conversation rows (every turn supervised),
 * each beside a `<file>.specforge.yaml` holding the SpecForge 0.2 `data:` section that reads it
 * as tokenmill wrote it (`chat_template`, `is_preformatted: true`, `train_only_last_turn`,
 * `max_length` ≥ its longest row, `train_data_path`). A file or sidecar of an earlier export
 * that this one has no rows for is removed, so no stale settings are left beside new data.
 */
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { stringify } from 'yaml';

import { EnvironmentError, errorMessage, writeFileAtomic } from '../../shared/index.js';
import { AtomicJsonlWriter } from './file.js';
import {
  SPECFORGE_ROW_KINDS,
  type SpecForgeExportStats,
  type SpecForgeLine,
  type SpecForgeRowKind,
  type SpecForgeSink,
} from './specforge-rows.js';
import type { SpecForgeTemplate } from './specforge-templates.js';

/** `<out stem>.all-turns.jsonl` beside `<out>` (the stem: its name less `.jsonl`). */
export function allTurnsPath(out: string): string {
  const base = path.basename(out).replace(/\.jsonl$/, '');
  return path.join(path.dirname(out), `${base}.all-turns.jsonl`);
}

/** The sidecar of an exported file: `<file>.specforge.yaml`. */
export function sidecarPath(file: string): string {
  return `${file}.specforge.yaml`;
}

/** SpecForge 0.2's `data:` section for one exported file. */
export interface SpecForgeDataSection {
  train_data_path: string;
  chat_template: string;
  is_preformatted: true;
  train_only_last_turn: boolean;
  max_length: number;
}

/** One file of the export, as the report states it. */
export interface SpecForgeFileReport {
  kind: SpecForgeRowKind;
  file: string;
  rows: number;
  /** Tokens of its longest row (its text re-encoded included). */
  longest: number;
  /** Its rows whose text does not encode back to their ids. */
  reencodeDiffers: number;
  /** The sidecar written, when a SpecForge template fits. */
  sidecar?: string;
  /** The settings to paste (also in the sidecar), when a SpecForge template fits. */
  data?: SpecForgeDataSection;
}

/** The sidecar's text: a comment saying what the file is, then the `data:` section. */
export function sidecarText(report: SpecForgeFileReport, data: SpecForgeDataSection): string {
  const what =
    report.kind === 'last-turn'
      ? 'rows that supervise their last assistant turn (generation records, turns as rows of their own)'
      : 'whole-conversation rows, every assistant turn supervised (postprocess.rows: conversation)';
  const lines = [
    `# SpecForge 0.2 data section for ${path.basename(report.file)}, written by tokenmill export --format specforge.`,
    `# ${report.rows} ${what}; each line's text is exactly the row's tokens.`,
  ];
  if (report.reencodeDiffers > 0) {
    lines.push(
      `# ${report.reencodeDiffers} ${report.reencodeDiffers === 1 ? 'row re-encodes' : 'rows re-encode'} differently (non-canonical token splits the server produced): for those`,
      '# SpecForge cannot reproduce the ids from text; export --format jsonl as data.prompts_path is exact.',
    );
  }
  return `${lines.join('\n')}\n${stringify({ data }, { lineWidth: 0 })}`;
}

/**
 * The export's output files, by row kind: the `last-turn` file is opened at once (an export
 * with nothing in it is an empty file, as before), the `all-turns` one at its first row.
 */
export class SpecForgeOutput implements SpecForgeSink {
  readonly files: Record<SpecForgeRowKind, string>;
  readonly #writers = new Map<SpecForgeRowKind, AtomicJsonlWriter>();

  private constructor(readonly out: string) {
    this.files = { 'last-turn': out, 'all-turns': allTurnsPath(out) };
  }

  static async open(out: string): Promise<SpecForgeOutput> {
    const o = new SpecForgeOutput(out);
    o.#writers.set('last-turn', await AtomicJsonlWriter.open(out));
    return o;
  }

  /** Lines written, all files together. */
  get lines(): number {
    let n = 0;
    for (const w of this.#writers.values()) n += w.lines;
    return n;
  }

  async write(kind: SpecForgeRowKind, line: SpecForgeLine): Promise<void> {
    let w = this.#writers.get(kind);
    if (w === undefined) {
      w = await AtomicJsonlWriter.open(this.files[kind]);
      this.#writers.set(kind, w);
    }
    await w.write(line);
  }

  /**
   * Renames the files into place and writes their sidecars with `template` (none when no
   * SpecForge template fits: then stale sidecars are removed and none is written); removes the
   * `all-turns` file and sidecar of an earlier export when this one has no such rows.
   */
  async commit(
    datasets: readonly SpecForgeExportStats[],
    template: SpecForgeTemplate | undefined,
  ): Promise<SpecForgeFileReport[]> {
    const reports: SpecForgeFileReport[] = [];
    for (const kind of SPECFORGE_ROW_KINDS) {
      const file = this.files[kind];
      const writer = this.#writers.get(kind);
      if (writer === undefined) {
        await removeIfThere(file);
        await removeIfThere(sidecarPath(file));
        continue;
      }
      await writer.commit();
      const report: SpecForgeFileReport = { kind, file, rows: 0, longest: 0, reencodeDiffers: 0 };
      for (const d of datasets) {
        const k = d.byKind[kind];
        report.rows += k.rows;
        report.longest = Math.max(report.longest, k.longest);
        report.reencodeDiffers += k.reencodeDiffers;
      }
      const sidecar = sidecarPath(file);
      if (template === undefined || report.rows === 0) {
        await removeIfThere(sidecar);
      } else {
        const data: SpecForgeDataSection = {
          train_data_path: file,
          chat_template: template.name,
          is_preformatted: true,
          train_only_last_turn: kind === 'last-turn',
          max_length: Math.max(1, report.longest),
        };
        await writeAtomically(sidecar, sidecarText(report, data));
        report.sidecar = sidecar;
        report.data = data;
      }
      reports.push(report);
    }
    return reports;
  }

  /** Removes the temporary files; the files in place are left as they were. */
  async abort(): Promise<void> {
    for (const w of this.#writers.values()) await w.abort();
  }
}

async function removeIfThere(file: string): Promise<void> {
  try {
    await rm(file, { force: true });
  } catch (e: unknown) {
    throw new EnvironmentError(`cannot remove ${file} (left from an earlier export): ${errorMessage(e)}`, { cause: e });
  }
}

async function writeAtomically(file: string, text: string): Promise<void> {
  try {
    await writeFileAtomic(file, text);
  } catch (e: unknown) {
    throw new EnvironmentError(`cannot write ${file}: ${errorMessage(e)}`, { cause: e });
  }
}
