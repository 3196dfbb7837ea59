/** The evaluation report as a table for people (`tokenmill eval` without `--json`). */
import type { DrafterEndpointInfo, EvalReport, EvalSection, SimulatorInfo } from './report.js';

const num = (x: number | null | undefined, digits: number): string =>
  x === null || x === undefined ? '-' : x.toFixed(digits);

/** `+0.12`, `-0.05`; a change that rounds to zero is `+0.00`, never `-0.00`. */
const signed = (x: number | null | undefined, digits: number): string => {
  if (x === null || x === undefined) return '-';
  const v = Number(x.toFixed(digits));
  return `${v < 0 ? '-' : '+'}${Math.abs(v).toFixed(digits)}`;
};

/** `0:120 1:48 2:31 3:12`: verify steps by drafts accepted. */
export function formatHistogram(h: readonly number[] | undefined): string {
  if (h === undefined || h.length === 0) return '-';
  return h.map((n, k) => `${k}:${n}`).join(' ');
}

function row(name: string, s: EvalSection, withDelta: boolean, configured?: number | null): string[] {
  const failures = s.drafter.failures + (s.baseline?.failures ?? 0);
  const cells = [
    name,
    String(s.prompts),
    num(s.drafter.acceptLength, 2),
    ...(configured === undefined ? [] : [num(configured, 2)]),
    num(s.drafter.acceptRate, 3),
    num(s.drafter.tokensPerSec, 1),
    num(s.baseline?.tokensPerSec, 1),
    s.speedup === null ? '-' : `${s.speedup.toFixed(2)}x`,
  ];
  if (withDelta) cells.push(signed(s.delta?.acceptLength, 2), signed(s.delta?.speedup, 2));
  cells.push(String(failures));
  return cells;
}

/** Columns padded to their widest cell; the first left-aligned, the others right-aligned. */
function table(rows: readonly string[][]): string[] {
  const widths: number[] = [];
  for (const r of rows) r.forEach((c, i) => (widths[i] = Math.max(widths[i] ?? 0, c.length)));
  return rows.map((r) =>
    r
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join('  ')
      .trimEnd(),
  );
}

/** `SGLang 0.5.4`, or `tokenmill sim, imitating SGLang 0.5.4` for the simulator. */
function serverName(version: string | null, simulator: SimulatorInfo | null | undefined): string {
  if (simulator === null || simulator === undefined) return `SGLang ${version ?? '?'}`;
  return `tokenmill sim, imitating SGLang ${simulator.imitates ?? version ?? '?'}`;
}

/** `text` in lines of at most `width` characters (words kept whole), the first after `first`, the rest after `rest`. */
export function wrapText(text: string, width: number, first: string, rest: string): string[] {
  const lines: string[] = [];
  let line = first;
  let empty = true;
  for (const word of text.split(/\s+/).filter((w) => w !== '')) {
    if (!empty && line.length + 1 + word.length > width) {
      lines.push(line);
      line = rest;
      empty = true;
    }
    line += empty ? word : ` ${word}`;
    empty = false;
  }
  lines.push(line);
  return lines;
}

/**
 * The configured accept length of every dataset (and overall: the top level's, when every
 * dataset has it) for a report whose acceptance the simulator set; undefined otherwise.
 */
function configuredColumn(
  r: EvalReport,
): { of: (dataset: string) => number | null; overall: number | null } | undefined {
  const sim = r.simulated;
  if (r.source !== 'simulator' || sim === null || sim === undefined || !sim.acceptanceConfigured) return undefined;
  const of = (d: string): number | null => sim.datasets[d] ?? null;
  const top = sim.meanAcceptLength;
  const overall = top !== null && r.datasets.every((d) => of(d.dataset) === top) ? top : null;
  return { of, overall };
}

/** The report as lines: what was measured against what, the table, the histogram, warnings and failed checks. */
export function formatReport(r: EvalReport): string {
  const lines: string[] = [];
  lines.push(`eval: ${r.attempt === null ? 'checkpoint' : `attempt ${r.attempt}, drafter`} ${r.drafter}`);
  // Figures the simulator produced say so before anything else (reports from before sources were
  // recorded have neither field).
  if (r.source === 'simulator' && r.simulated !== null && r.simulated !== undefined)
    lines.push(...wrapText(r.simulated.note, 100, '  ', '             '));
  for (const e of r.endpoints)
    lines.push(`  drafter   ${e.url}: ${e.algorithm}${drafterSettings(e)} (${serverName(e.version, e.simulator)})`);
  for (const b of r.baseline ?? [])
    lines.push(`  baseline  ${b.url}: no speculation (${serverName(b.version, b.simulator)})`);
  if (r.baseline === null) lines.push('  baseline  none (eval.baseline): no speed-up measured');
  lines.push(
    `  settings  concurrency ${r.settings.concurrency}, max_new_tokens ${r.settings.maxNewTokens}, sampling ${typeof r.settings.sampling === 'string' ? r.settings.sampling : JSON.stringify(r.settings.sampling)}`,
  );
  if (r.previous !== null)
    lines.push(
      `  compared with ${r.previous.attempt === null ? r.previous.file : `attempt ${r.previous.attempt}`}${r.previous.comparable ? '' : ' (other settings: not comparable)'}`,
    );
  lines.push('');
  const withDelta = r.previous !== null;
  const configured = configuredColumn(r);
  const head = [
    'dataset',
    'prompts',
    'accept len',
    ...(configured === undefined ? [] : ['configured']),
    'accept rate',
    'drafter tok/s',
    'baseline tok/s',
    'speed-up',
  ];
  if (withDelta) head.push('Δ accept len', 'Δ speed-up');
  head.push('failed');
  const rows = [head, ...r.datasets.map((d) => row(d.dataset, d, withDelta, configured?.of(d.dataset)))];
  if (r.datasets.length !== 1) rows.push(row('overall', r.overall, withDelta, configured?.overall));
  lines.push(...table(rows));
  lines.push('');
  lines.push(`verify steps by drafts accepted (overall): ${formatHistogram(r.overall.drafter.histogram)}`);
  for (const s of r.skipped) lines.push(`skipped ${s.dataset}: ${s.reason}`);
  for (const w of r.warnings) lines.push(`WARNING: ${w}`);
  for (const f of r.failed) lines.push(`FAILED: ${f.message}`);
  return `${lines.join('\n')}\n`;
}

/** A drafter server's speculative settings, as a person reads them: a DFLASH block, or EAGLE's steps, topk and draft tokens. */
function drafterSettings(e: DrafterEndpointInfo): string {
  if (e.blockSize !== undefined && e.blockSize !== null) return `, block ${e.blockSize}`;
  return `${e.numSteps === null ? '' : `, ${e.numSteps} steps`}${e.eagleTopk === null ? '' : `, topk ${e.eagleTopk}`}${e.numDraftTokens === null ? '' : `, ${e.numDraftTokens} draft tokens`}`;
}
