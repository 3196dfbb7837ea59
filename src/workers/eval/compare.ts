/**
 * Drafters side by side (`tokenmill eval --compare`, the end of `tokenmill demo`): every evaluated
 * attempt of a run — an EAGLE-3 attempt, a DFlash attempt, … — and no speculation, per dataset and
 * overall, on the same held-out prompts. Nothing is measured here: the figures are the attempts'
 * `eval.json`; a report measured with other settings (prompts, concurrency, max_new_tokens,
 * sampling) than the newest one, or simulated where the newest was measured on SGLang (or the
 * reverse), is left out of the table and said in `notes`. Figures the simulator produced say so.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { listAttempts, trainDir } from '../train/index.js';
import { evalReportPath } from './drafter.js';
import { type EvalReport, type EvalSection, type EvalSource, incomparable, parseReport } from './report.js';

/** One drafter of the comparison: an evaluated attempt. */
export interface ComparedDrafter {
  attempt: string;
  /** `EAGLE3 (3 steps)`, `DFLASH (block 8)`: the drafter endpoint's algorithm and its shape. */
  label: string;
  algorithm: string;
  file: string;
  measuredAt: string;
  /** Measured on SGLang, or the simulator's configured figures; null for a report that did not record it. */
  source: EvalSource | null;
}

/** One row: a drafter's figures on a dataset, or no speculation's (`attempt` null). */
export interface ComparisonRow {
  dataset: string;
  /** Null for no speculation. */
  attempt: string | null;
  drafter: string;
  prompts: number;
  acceptLength: number | null;
  tokensPerSec: number | null;
  /** Against the baseline measured with the drafter's own report (1 for no speculation). */
  speedup: number | null;
  /** The figures are the simulator's (its configured acceptance, its load model's speeds). */
  simulated: boolean;
}

export interface EvalComparison {
  run: string | null;
  /** The prompts compared on (`held-out` or the file of `eval.prompts`). */
  prompts: string | null;
  drafters: ComparedDrafter[];
  /** Dataset by dataset (then `overall`): no speculation first, then each drafter, oldest attempt first. */
  rows: ComparisonRow[];
  notes: string[];
}

/** The `eval.json` of every attempt of the run that has one, oldest first; unreadable ones said in `notes`. */
export async function evaluatedAttempts(
  runDir: string,
): Promise<{ reports: { attempt: string; file: string; report: EvalReport }[]; notes: string[] }> {
  const reports: { attempt: string; file: string; report: EvalReport }[] = [];
  const notes: string[] = [];
  for (const attempt of await listAttempts(runDir)) {
    const file = evalReportPath(path.join(trainDir(runDir), attempt));
    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch {
      continue;
    }
    const parsed = parseReport(text, file);
    if (typeof parsed === 'string') notes.push(`${parsed}; left out`);
    else reports.push({ attempt, file, report: parsed });
  }
  return { reports, notes };
}

/** `EAGLE3 (3 steps)`, `DFLASH (block 8)`, from a report's first drafter endpoint. */
export function drafterLabel(report: EvalReport): { algorithm: string; label: string } {
  const e = report.endpoints[0];
  if (e === undefined) return { algorithm: '?', label: '?' };
  if (e.algorithm === 'DFLASH') {
    // The block size SGLang reports; reports made before it was read give the draft tokens, the same number.
    const block = e.blockSize ?? e.numDraftTokens;
    return { algorithm: e.algorithm, label: `DFLASH${block === null ? '' : ` (block ${block})`}` };
  }
  return { algorithm: e.algorithm, label: `${e.algorithm}${e.numSteps === null ? '' : ` (${e.numSteps} steps)`}` };
}

/** The comparison of `reports` (oldest first): the newest report's settings decide which compare. */
export function compareReports(
  reports: readonly { attempt: string; file: string; report: EvalReport }[],
  notes: readonly string[] = [],
): EvalComparison {
  const newest = reports.at(-1)?.report;
  const out: EvalComparison = {
    run: newest?.run ?? null,
    prompts: newest?.settings.prompts ?? null,
    drafters: [],
    rows: [],
    notes: [...notes],
  };
  if (newest === undefined) return out;
  const sourceOf = (r: EvalReport): EvalSource | null =>
    r.source === 'simulator' || r.source === 'sglang' ? r.source : null;
  const kept = reports.filter((r) => {
    const a = sourceOf(newest);
    const b = sourceOf(r.report);
    if (a !== null && b !== null && a !== b) {
      out.notes.push(
        `attempt ${r.attempt} was ${b === 'simulator' ? 'evaluated on the simulator (its configured acceptance)' : 'measured on SGLang'}, the newest ${a === 'simulator' ? 'on the simulator' : 'on SGLang'}: left out`,
      );
      return false;
    }
    const why = incomparable(newest.settings, r.report.settings);
    if (why !== undefined) out.notes.push(`attempt ${r.attempt} was measured with other settings (${why}): left out`);
    return why === undefined;
  });
  for (const r of kept)
    out.drafters.push({
      attempt: r.attempt,
      ...drafterLabel(r.report),
      file: r.file,
      measuredAt: r.report.measuredAt,
      source: sourceOf(r.report),
    });
  const datasets: string[] = [];
  for (const r of kept) for (const d of r.report.datasets) if (!datasets.includes(d.dataset)) datasets.push(d.dataset);
  const sectionOf = (report: EvalReport, dataset: string): EvalSection | undefined =>
    dataset === 'overall' ? report.overall : report.datasets.find((d) => d.dataset === dataset);
  for (const dataset of [...datasets, ...(datasets.length > 1 ? ['overall'] : [])]) {
    // No speculation: the newest report with a baseline for this dataset.
    const base = [...kept].reverse().find((r) => sectionOf(r.report, dataset)?.baseline != null);
    const bs = base === undefined ? undefined : sectionOf(base.report, dataset);
    if (bs?.baseline != null)
      out.rows.push({
        dataset,
        attempt: null,
        drafter: 'no speculation',
        prompts: bs.prompts,
        acceptLength: null,
        tokensPerSec: bs.baseline.tokensPerSec,
        speedup: 1,
        simulated: (base?.report.baseline ?? []).some((b) => b.simulator != null),
      });
    for (const r of kept) {
      const s = sectionOf(r.report, dataset);
      if (s === undefined) continue;
      out.rows.push({
        dataset,
        attempt: r.attempt,
        drafter: `${r.attempt} ${drafterLabel(r.report).label}`,
        prompts: s.prompts,
        acceptLength: s.drafter.acceptLength ?? null,
        tokensPerSec: s.drafter.tokensPerSec,
        speedup: s.speedup,
        simulated: sourceOf(r.report) === 'simulator',
      });
    }
  }
  return out;
}

const num = (x: number | null, digits: number): string => (x === null ? '-' : x.toFixed(digits));

/** The comparison as a table for people. */
export function formatComparison(c: EvalComparison): string {
  const lines: string[] = [];
  if (c.drafters.length === 0) {
    lines.push('eval --compare: no evaluated attempt in this run (no train/<attempt>/eval.json)');
  } else {
    lines.push(
      `drafters compared on the same ${c.prompts === 'held-out' ? 'held-out prompts' : `prompts (${c.prompts ?? '?'})`}, run ${c.run ?? '?'}:`,
    );
    const simulated = c.drafters.filter((d) => d.source === 'simulator').map((d) => d.attempt);
    if (simulated.length > 0)
      lines.push(
        `  SIMULATED (*): attempt${simulated.length === 1 ? '' : 's'} ${simulated.join(', ')} ran against tokenmill's SGLang simulator: ` +
          "the acceptance is its configured one and the tok/s its load model's, not measurements of the drafters",
      );
    const head = ['dataset', 'drafter', 'prompts', 'accept len', 'tok/s', 'speed-up'];
    const rows = [
      head,
      ...c.rows.map((r) => [
        r.dataset,
        `${r.drafter}${r.simulated ? ' *' : ''}`,
        String(r.prompts),
        num(r.acceptLength, 2),
        num(r.tokensPerSec, 1),
        r.speedup === null ? '-' : `${r.speedup.toFixed(2)}x`,
      ]),
    ];
    const widths: number[] = [];
    for (const r of rows) r.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
    for (const r of rows)
      lines.push(
        r
          .map((cell, i) => (i < 2 ? cell.padEnd(widths[i] ?? 0) : cell.padStart(widths[i] ?? 0)))
          .join('  ')
          .trimEnd(),
      );
  }
  for (const n of c.notes) lines.push(`note: ${n}`);
  return `${lines.join('\n')}\n`;
}
