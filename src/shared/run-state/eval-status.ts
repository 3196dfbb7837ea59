/**
 * The drafter's evaluations as `status`, the pipeline page and /metrics show them: the latest eval
 * job's state, each attempt's figures (a series for the page's chart) and the latest attempt's
 * whole report. Reports come from Redis (the eval step records each one there) and, where the run
 * folder is readable, from the attempts' `eval.json` files (`tokenmill eval` by hand writes only
 * those); for an attempt in both, the newer measurement wins.
 */
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import type { Redis } from 'ioredis';
import { EvalKeys, type RunKeys } from '../queues/index.js';

/** State of the run's latest eval job. */
export type EvalJobState = 'queued' | 'waiting' | 'running' | 'completed' | 'failed' | 'cancelled' | 'skipped';

/** One section (a dataset, or overall) of an eval report, as far as the status reads it. */
export interface EvalSectionView {
  prompts: number;
  drafter: {
    acceptLength?: number | null;
    acceptRate?: number | null;
    tokensPerSec: number | null;
    failures: number;
    requests: number;
  };
  baseline: { tokensPerSec: number | null; failures: number; requests: number } | null;
  speedup: number | null;
  delta: { acceptLength: number | null; acceptLengthChange: number | null; speedup: number | null } | null;
}

/**
 * Where a report's figures come from: `sglang` measured on SGLang servers; `simulator` produced by
 * tokenmill's simulator (its acceptance configured, its speeds from its load model); null for a
 * report from before the source was recorded.
 */
export type EvalSourceView = 'sglang' | 'simulator' | null;

/** With the source `simulator`, what the report says its figures are. */
export interface SimulatedView {
  /** The acceptance is the simulator's setting (a drafter endpoint is the simulator). */
  acceptanceConfigured: boolean;
  meanAcceptLength: number | null;
  /** The configured mean accept length of each dataset evaluated. */
  datasets: Record<string, number>;
  /** `SIMULATED: …`, one sentence. */
  note: string;
}

/** An eval report (`eval.json`) as far as the status reads it; the JSON output has all of it. */
export interface EvalReportView {
  version: number;
  run: string;
  attempt: string | null;
  drafter: string;
  measuredAt: string;
  /** Absent in reports from before it was recorded. */
  source?: 'sglang' | 'simulator';
  simulated?: SimulatedView | null;
  datasets: (EvalSectionView & { dataset: string })[];
  overall: EvalSectionView;
  previous: { attempt: string | null; comparable: boolean } | null;
  warnings: string[];
  failed: { check: string; message: string }[];
  ok: boolean;
}

/** One attempt's figures: a point of the page's chart. */
export interface EvalAttemptPoint {
  attempt: string;
  measuredAt: string;
  /** Measured on SGLang, or the simulator's configured figures. */
  source: EvalSourceView;
  ok: boolean;
  acceptLength: number | null;
  speedup: number | null;
  drafterTokensPerSec: number | null;
  baselineTokensPerSec: number | null;
  warnings: number;
  datasets: {
    dataset: string;
    acceptLength: number | null;
    speedup: number | null;
    drafterTokensPerSec: number | null;
    baselineTokensPerSec: number | null;
  }[];
}

/** The latest eval job, as train workers record it. */
export interface EvalJobStatus {
  jobId: string;
  state: EvalJobState;
  attempt: string | null;
  drafter: string | null;
  /** What it does now (`B1_glaive: drafter, 4 prompts`), or its result in a few words. */
  detail: string | null;
  /** Why it waits (GPU memory). */
  waiting: string | null;
  /** Why it failed, was cancelled or skipped. */
  reason: string | null;
  /** The servers it started (`eval.server`), `role url pid`. */
  servers: string[];
  updatedAt: string | null;
}

/** The eval part of `status --json` (null before any eval job or report). */
export interface EvalStatus {
  job: EvalJobStatus | null;
  /** Every attempt with a report, oldest first. */
  attempts: EvalAttemptPoint[];
  /** The latest attempt's report, whole (its eval.json). */
  report: (EvalReportView & Record<string, unknown>) | null;
}

/** A report's text as a view; undefined when it is not an eval report. */
export function parseEvalReportView(text: string): (EvalReportView & Record<string, unknown>) | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  const r = v as Partial<EvalReportView> | null;
  if (r === null || typeof r !== 'object' || !Array.isArray(r.datasets) || typeof r.overall !== 'object') return;
  if (typeof r.attempt !== 'string' || typeof r.measuredAt !== 'string') return;
  return r as EvalReportView & Record<string, unknown>;
}

const n = (x: number | null | undefined): number | null => (typeof x === 'number' ? x : null);

/** Where a report's figures come from (null: not recorded). */
export function sourceOf(r: Pick<EvalReportView, 'source'>): EvalSourceView {
  return r.source === 'simulator' || r.source === 'sglang' ? r.source : null;
}

/** The simulator's note of a simulated report (`SIMULATED: …`), or undefined for one measured on SGLang. */
export function simulatedNote(r: Pick<EvalReportView, 'source' | 'simulated'>): string | undefined {
  if (sourceOf(r) !== 'simulator') return undefined;
  return (
    r.simulated?.note ??
    "SIMULATED: the figures come from tokenmill's SGLang simulator, not from a measurement of the drafter"
  );
}

/** A report's figures as a chart point. */
export function evalPointOf(r: EvalReportView): EvalAttemptPoint {
  return {
    attempt: r.attempt ?? '',
    measuredAt: r.measuredAt,
    source: sourceOf(r),
    ok: r.ok,
    acceptLength: n(r.overall.drafter.acceptLength),
    speedup: n(r.overall.speedup),
    drafterTokensPerSec: n(r.overall.drafter.tokensPerSec),
    baselineTokensPerSec: n(r.overall.baseline?.tokensPerSec),
    warnings: r.warnings.length,
    datasets: r.datasets.map((d) => ({
      dataset: d.dataset,
      acceptLength: n(d.drafter.acceptLength),
      speedup: n(d.speedup),
      drafterTokensPerSec: n(d.drafter.tokensPerSec),
      baselineTokensPerSec: n(d.baseline?.tokensPerSec),
    })),
  };
}

/** The attempts' eval.json files under `<runDir>/train/`; none when the folder is not readable here. */
async function reportsOnDisk(runDir: string): Promise<(EvalReportView & Record<string, unknown>)[]> {
  const dir = path.join(runDir, 'train');
  let names: string[];
  try {
    names = (await readdir(dir)).filter((x) => /^\d{4,}$/.test(x));
  } catch {
    return [];
  }
  const out: (EvalReportView & Record<string, unknown>)[] = [];
  for (const a of names) {
    let text: string;
    try {
      text = await readFile(path.join(dir, a, 'eval.json'), 'utf8');
    } catch {
      continue;
    }
    const r = parseEvalReportView(text);
    if (r !== undefined && r.attempt === a) out.push(r);
  }
  return out;
}

const str = (v: string | undefined): string | null => (v === undefined || v === '' ? null : v);

/**
 * Reads the run's eval status: the latest eval job (Redis) and every attempt's report (Redis, and
 * `runDir`'s eval.json files when given and readable). Null when there is neither.
 */
export async function readEvalStatus(redis: Redis, keys: RunKeys, runDir: string | null): Promise<EvalStatus | null> {
  const ek = new EvalKeys(keys);
  const [h, stored, disk] = await Promise.all([
    redis.hgetall(ek.status()),
    redis.hgetall(ek.reports()),
    runDir === null ? Promise.resolve([]) : reportsOnDisk(runDir),
  ]);
  const byAttempt = new Map<string, EvalReportView & Record<string, unknown>>();
  const add = (r: (EvalReportView & Record<string, unknown>) | undefined): void => {
    if (r === undefined || r.attempt === null) return;
    const had = byAttempt.get(r.attempt);
    if (had === undefined || Date.parse(r.measuredAt) > Date.parse(had.measuredAt)) byAttempt.set(r.attempt, r);
  };
  for (const text of Object.values(stored)) add(parseEvalReportView(text));
  for (const r of disk) add(r);
  const reports = [...byAttempt.values()].sort((a, b) => Number(a.attempt) - Number(b.attempt));
  const job: EvalJobStatus | null =
    h.jobId === undefined
      ? null
      : {
          jobId: h.jobId,
          state: (h.state as EvalJobState | undefined) ?? 'queued',
          attempt: str(h.attempt),
          drafter: str(h.drafter),
          detail: str(h.detail),
          waiting: str(h.waiting),
          reason: str(h.reason),
          servers: (h.servers ?? '').split('\n').filter((s) => s !== ''),
          updatedAt: str(h.updatedAt),
        };
  if (job === null && reports.length === 0) return null;
  return { job, attempts: reports.map(evalPointOf), report: reports.at(-1) ?? null };
}

const fixed = (x: number | null | undefined, digits: number): string =>
  x === null || x === undefined ? '-' : x.toFixed(digits);
/** `+0.12`, `-0.05`; a change that rounds to zero is `+0.00`, never `-0.00`. */
const signed = (x: number | null | undefined, digits: number): string => {
  if (x === null || x === undefined) return '';
  const v = Number(x.toFixed(digits));
  return `${v < 0 ? '-' : '+'}${Math.abs(v).toFixed(digits)}`;
};

/** `accept len 2.61 (+0.12), speed-up 1.85x (+0.05)` of a section. */
export function describeEvalSection(s: EvalSectionView): string {
  const dl = signed(s.delta?.acceptLength, 2);
  const ds = signed(s.delta?.speedup, 2);
  return (
    `accept len ${fixed(s.drafter.acceptLength, 2)}${dl === '' ? '' : ` (${dl})`}` +
    `, speed-up ${s.speedup === null ? '-' : `${s.speedup.toFixed(2)}x`}${ds === '' ? '' : ` (${ds})`}`
  );
}

/** The latest eval job in a few words: `running, attempt 0003 — B1_glaive: drafter, 4 prompts`. */
function describeJob(j: EvalJobStatus): string {
  const at = j.attempt === null ? '' : `, attempt ${j.attempt}`;
  if (j.state === 'waiting') return `waiting${at} — ${j.waiting ?? ''}`;
  const why = j.state === 'running' || j.state === 'completed' ? j.detail : (j.reason ?? j.detail);
  return `${j.state}${at}${why === null ? '' : ` — ${why}`}`;
}

/**
 * The eval status as lines for `status`: the latest eval job, then the latest attempt's report:
 * a line per dataset and overall (acceptance length, speed-up, their change since the attempt
 * compared with), its warnings and failed checks in words. Empty when there is none.
 */
export function formatEvalStatus(e: EvalStatus | null | undefined): string[] {
  if (e === null || e === undefined) return [];
  const lines: string[] = [];
  if (e.job !== null) lines.push(`eval ${e.job.jobId}: ${describeJob(e.job)}`);
  const r = e.report;
  if (r === null) return lines;
  const since =
    r.previous === null
      ? ''
      : `, changes since attempt ${r.previous.attempt ?? '?'}${r.previous.comparable ? '' : ' (other settings: not comparable)'}`;
  const note = simulatedNote(r);
  lines.push(
    `eval of attempt ${r.attempt ?? '?'}: ${r.ok ? 'passed' : 'FAILED'} (${note === undefined ? 'measured' : 'simulated'} ${r.measuredAt}${since})`,
  );
  if (note !== undefined) lines.push(`  ${note}`);
  // The configured accept length beside each dataset's, when the simulator set it.
  const configured =
    r.simulated?.acceptanceConfigured === true && note !== undefined ? r.simulated.datasets : undefined;
  const rows: [string, EvalSectionView, number | undefined][] = r.datasets.map((d) => [
    d.dataset,
    d,
    configured?.[d.dataset],
  ]);
  if (r.datasets.length !== 1) rows.push(['overall', r.overall, undefined]);
  const width = Math.max(...rows.map(([name]) => name.length));
  for (const [name, s, set] of rows)
    lines.push(
      `  ${name.padEnd(width)}  ${describeEvalSection(s)}${set === undefined ? '' : `, configured ${set.toFixed(2)}`}`,
    );
  for (const w of r.warnings) lines.push(`  WARNING: ${w}`);
  for (const f of r.failed) lines.push(`  FAILED: ${f.message}`);
  return lines;
}

/** The eval phase's line of numbers for the status checklist; '' before any eval. */
export function evalPhaseDetail(e: EvalStatus | null | undefined): string {
  if (e === null || e === undefined) return '';
  const j = e.job;
  const r = e.report;
  // A job under way, or one that ended without a report of its attempt, is what there is to say.
  const ongoing = j !== null && (j.state === 'queued' || j.state === 'waiting' || j.state === 'running');
  if (
    j !== null &&
    (ongoing || r === null || (j.state !== 'completed' && j.state !== 'skipped' && j.attempt !== r.attempt))
  )
    return describeJob(j);
  if (r === null) return '';
  const warned = r.warnings.length === 0 ? '' : `, ${r.warnings.length} warning${r.warnings.length === 1 ? '' : 's'}`;
  const simulated = sourceOf(r) === 'simulator' ? ' (SIMULATED)' : '';
  return `attempt ${r.attempt ?? '?'}${simulated}: ${describeEvalSection(r.overall)}${warned}${r.ok ? '' : `, FAILED: ${r.failed.map((f) => f.message).join('; ')}`}`;
}
