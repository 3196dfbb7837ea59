/** `status` and the progress line as people read them: the table, endpoint health, ETA ranges, warnings. */
import { formatDuration, formatInt } from '../util/index.js';
import { describeEndpointHealth, type EndpointHealthSummary } from './endpoint-health.js';
import { formatEvalStatus } from './eval-status.js';
import type { ProgressStatus, RunStatus } from './status.js';

/**
 * Warning lines for a run that is not moving: each stalled dataset, and no healthy endpoint
 * while datasets still have prompts to generate. Empty when all is well.
 */
export function runStatusWarnings(status: RunStatus, nowMs = Date.now()): string[] {
  const lines: string[] = [];
  for (const d of status.datasets) {
    if (d.stalled === null) continue;
    lines.push(
      `! ${d.name} stalled for ${formatDuration((nowMs - d.stalled.sinceMs) / 1000)}: ${d.stalled.reason} — a bug; see the producer's log`,
    );
  }
  const generating = status.datasets.some((d) => d.status === 'in_progress' || d.status === 'pending');
  if (generating && status.endpoints.total > 0 && status.endpoints.healthy === 0)
    lines.push(`waiting: ${describeEndpointHealth(status.endpoints)}`);
  return lines;
}

function fmtMs(ms: number): string {
  return ms < 1000 ? `${ms}ms` : `${(ms / 1000).toFixed(1)}s`;
}

/** The status as a readable table, with the phases as a checklist. */
export function formatRunStatus(status: RunStatus, nowMs = Date.now()): string {
  const mark: Record<ProgressStatus, string> = {
    completed: '[x]',
    in_progress: '[~]',
    pending: '[ ]',
    failed: '[!]',
    paused: '[=]',
  };
  const lines = [
    `run ${status.run}`,
    `phases: ${status.phases.map((p) => `${p.configured ? mark[p.status] : '[-]'} ${p.name}`).join('  ')}`,
  ];
  for (const p of status.phases) if (p.detail !== '' && p.configured) lines.push(`  ${p.name}: ${p.detail}`);
  for (const h of status.train?.hiddenStates ?? []) lines.push(`  train step ${h.step}: ${h.text}`);
  if (status.endpoints.reported > 0) lines.push(`endpoints: ${describeEndpointHealth(status.endpoints)}`);
  for (const e of status.endpointRequests) {
    if (e.requests === 0 && e.inFlight === 0) continue;
    const errors = Object.entries(e.errors)
      .map(([k, v]) => `${k}×${v}`)
      .join(' ');
    const latency =
      e.recentLatencyMs === null
        ? ''
        : `, latency p50 ${fmtMs(e.recentLatencyMs.p50)} p95 ${fmtMs(e.recentLatencyMs.p95)}`;
    lines.push(`  ${e.url}: ${formatInt(e.inFlight)} in flight${latency}${errors === '' ? '' : `, errors ${errors}`}`);
  }
  for (const e of status.endpoints.endpoints) {
    if (e.concurrency !== undefined)
      lines.push(`  ${e.url}: concurrency auto ${formatInt(e.concurrency.cap)} (${e.concurrency.reason})`);
  }
  const workers = status.workers;
  if (workers.length > 0) {
    const roles = new Map<string, number>();
    for (const w of workers) roles.set(w.role, (roles.get(w.role) ?? 0) + 1);
    lines.push(`workers: ${[...roles].map(([r, c]) => `${c} ${r}`).join(', ')}`);
    for (const w of workers) {
      lines.push(
        `  ${w.role.padEnd(11)} ${w.host}:${w.pid}  up ${formatDuration((nowMs - w.startedMs) / 1000)}${w.role === 'inference' ? `, ${formatInt(w.inFlight)} in flight` : ''}`,
      );
    }
  }
  lines.push('');
  const header = [
    'dataset',
    'status',
    'tokens / budget',
    '%',
    'records',
    'in flight',
    'failed',
    'skipped',
    'rejected',
    'tok/s',
    'ETA',
  ];
  const rows = status.datasets.map((d) => [
    d.name,
    d.status,
    d.tokenBudget === null ? formatInt(d.outputTokens) : `${formatInt(d.outputTokens)} / ${formatInt(d.tokenBudget)}`,
    d.tokenBudget === null || d.tokenBudget === 0
      ? ''
      : `${Math.min(999, Math.floor((100 * d.outputTokens) / d.tokenBudget))}%`,
    formatInt(d.records),
    formatInt(d.inFlight),
    formatInt(d.failed),
    formatInt(d.skipped),
    formatInt(d.rejected),
    formatInt(Math.round(d.tokensPerSec)),
    d.status === 'completed' ? '-' : d.status === 'paused' ? 'paused' : formatEta(d.etaSeconds),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const fmt = (r: string[]): string =>
    r.map((c, i) => (i === 0 || i === 1 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join('  ');
  lines.push(fmt(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(fmt));
  for (const d of status.datasets) {
    const c = d.conversations;
    if (c === undefined) continue;
    lines.push(
      `${d.name}: conversations ${formatInt(c.complete)} complete, ${formatInt(c.partial)} partial, ${formatInt(c.ended)} ended early; ${formatInt(c.turns)} turns` +
        (c.laterTurns === 0
          ? ''
          : `; later turns: ${formatInt(c.spliced)} of ${formatInt(c.laterTurns)} spliced token for token, ${formatInt(c.laterTurns - c.spliced)} rendered from the decoded history`),
    );
    if (c.ended > 0) {
      const by = Object.entries(c.endedBy)
        .sort((a, b) => b[1] - a[1])
        .map(([cause, n]) => `${formatInt(n)} ${cause}`)
        .join(', ');
      lines.push(`${d.name}: ended early${by === '' ? '' : ` (${by})`}; the latest:`);
      for (const e of c.lastEnded.slice(0, 3))
        lines.push(`  ${e.id}${e.turn === null ? '' : ` at turn ${e.turn}`}: ${e.reason}`);
      // One conversation per cause to look at: `tokenmill show -c <config> <dataset> <id>`.
      const examples = Object.entries(c.endedExample)
        .sort((a, b) => (c.endedBy[b[0]] ?? 0) - (c.endedBy[a[0]] ?? 0))
        .map(([cause, id]) => `${cause}: ${id}`)
        .join(', ');
      if (examples !== '') lines.push(`  an example of each cause (tokenmill show ${d.name} <id>): ${examples}`);
    }
  }
  for (const d of status.datasets) if (d.failedReason !== undefined) lines.push(`! ${d.name} ${d.failedReason}`);
  for (const d of status.datasets) {
    const same = d.evalHeldOutSameContent ?? 0;
    if (same > 0)
      lines.push(
        `${d.name}: held out for eval: ${formatInt(d.evalHeldOut ?? 0)} by id (eval-prompts.jsonl), ${formatInt(same)} same content as a held-out prompt; never generated`,
      );
    else if (d.evalHeldOut !== undefined)
      lines.push(`${d.name}: ${formatInt(d.evalHeldOut)} held out for eval (eval-prompts.jsonl; never generated)`);
  }
  const evaluation = formatEvalStatus(status.eval);
  if (evaluation.length > 0) lines.push('', ...evaluation);
  const warnings = runStatusWarnings(status, nowMs);
  if (warnings.length > 0) lines.push('', ...warnings);
  return lines.join('\n');
}

/** An ETA range, "4m–7m" ("4m" when both ends agree), or "unknown" until the rate is measured. */
export function formatEta(eta: { low: number | null; high: number | null }): string {
  if (eta.low === null) return 'unknown';
  const low = formatDuration(eta.low);
  const high = formatDuration(eta.high ?? eta.low);
  return low === high ? low : `${low}–${high}`;
}

/**
 * Endpoint health in a few words for the progress line: "2/2 healthy", or, with none healthy,
 * "waiting: 0/1 endpoints healthy (http://… connect ECONNREFUSED …)"; null before any worker reports.
 */
export function formatEndpointHealth(h: EndpointHealthSummary): string | null {
  if (h.reported === 0) return null;
  if (h.healthy === 0) return `waiting: ${describeEndpointHealth(h)}`;
  return `${h.healthy}/${h.total} healthy`;
}
