import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Config } from './config.js';
import { describeEndpointHealth, readEndpointHealth, type EndpointHealthSummary } from './endpoint-health.js';
import { generateQueueName } from './queues.js';
import type { RunKeys } from './run-keys.js';
import { readStalls } from './stall-watchdog.js';

/** Status of a dataset or a phase, as `status --json` prints it. */
export type ProgressStatus = 'pending' | 'in_progress' | 'completed' | 'failed' | 'paused';

export interface DatasetStatus {
  name: string;
  /** Samples committed (records in the generations files once the sink has written them). */
  records: number;
  outputTokens: number;
  /** Output-token budget; null for a dataset without one (tokenize-only). */
  tokenBudget: number | null;
  inFlight: number;
  failed: number;
  /** Skipped by budget. */
  skipped: number;
  /** Prompt lines rejected (bad JSON, missing fields, duplicate ids, too long). */
  rejected: number;
  /** Committed output tokens per second over the last minute. */
  tokensPerSec: number;
  /** Time left at the fastest and slowest recent rate; null while unknown. */
  etaSeconds: { low: number | null; high: number | null };
  status: ProgressStatus;
  /**
   * Set while the stall watchdog (in the producer) finds the dataset stalled: prompts pending,
   * nothing in flight and an endpoint healthy for longer than `workers.stallAfterMs`.
   */
  stalled: { sinceMs: number; reason: string } | null;
}

export interface PhaseStatus {
  name: 'prepare' | 'generate' | 'tokenize' | 'merge' | 'train';
  status: ProgressStatus;
}

export interface RunStatus {
  run: string;
  phases: PhaseStatus[];
  datasets: DatasetStatus[];
  /** SGLang endpoints' health as the live inference workers report it. */
  endpoints: EndpointHealthSummary;
}

/** Width of the commit-rate buckets written by commit-sample.lua. */
export const RATE_BUCKET_MS = 10_000;
/** Buckets kept by commit-sample.lua (5 minutes). */
export const RATE_BUCKETS_KEPT = 30;
/** Buckets the tokens/s figure averages over (the last minute). */
const RATE_WINDOW_BUCKETS = 6;

/**
 * Reads a run's progress from Redis: per dataset records, tokens, budget, in flight, failed,
 * skipped, tok/s and an ETA range, and the pipeline's phases as a checklist.
 */
export async function readRunStatus(
  redis: Redis,
  keys: RunKeys,
  config: Pick<Config, 'run' | 'datasets'> & { sglang?: Pick<Config['sglang'], 'endpoints'> },
  nowMs = Date.now(),
): Promise<RunStatus> {
  const datasets: DatasetStatus[] = [];
  const [endpoints, stalls] = await Promise.all([readEndpointHealth(redis, keys, config.sglang?.endpoints ?? [], nowMs), readStalls(redis, keys, nowMs)]);
  for (const ds of config.datasets) {
    const [stats, inFlight, failed, skipped, rate, paused] = await Promise.all([
      redis.hgetall(keys.stats(ds.name)),
      redis.zcount(keys.inflight(ds.name), nowMs, '+inf'),
      redis.hlen(keys.failed(ds.name)),
      redis.scard(keys.skipped(ds.name)),
      redis.hgetall(keys.rate(ds.name)),
      isQueuePaused(redis, keys, ds.name),
    ]);
    const records = Number(stats.records ?? 0);
    const outputTokens = Number(stats.outputTokens ?? 0);
    const tokenBudget = ds.tokenBudget ?? null;
    const completed = stats.status === 'completed' && (tokenBudget === null || stats.completedReason !== 'budget' || outputTokens >= tokenBudget);
    const { tokensPerSec, eta } = rateAndEta(rate, nowMs, remainingTokens(ds, stats, records, outputTokens, failed, skipped));
    let status: ProgressStatus;
    if (ds.prompts === undefined) status = 'completed';
    else if (paused && !completed) status = 'paused';
    else if (completed) status = 'completed';
    else if (stats.status === 'in_progress' || records > 0) status = 'in_progress';
    else status = 'pending';
    datasets.push({
      name: ds.name,
      records,
      outputTokens,
      tokenBudget,
      inFlight,
      failed,
      skipped,
      rejected: Number(stats.rejected ?? 0),
      tokensPerSec,
      etaSeconds: status === 'completed' ? { low: 0, high: 0 } : eta,
      status,
      stalled: stallOf(stalls.get(ds.name), status),
    });
  }
  const phaseState = await redis.hgetall(keys.phases());
  const gen = datasets.filter((d) => config.datasets.find((c) => c.name === d.name)?.prompts !== undefined);
  const generate: ProgressStatus =
    gen.length === 0 || gen.every((d) => d.status === 'completed')
      ? 'completed'
      : gen.some((d) => d.status === 'in_progress' || d.status === 'completed')
        ? 'in_progress'
        : gen.some((d) => d.status === 'paused')
          ? 'paused'
          : 'pending';
  const phase = (name: PhaseStatus['name'], fallback: ProgressStatus): PhaseStatus => ({
    name,
    status: (phaseState[name] as ProgressStatus | undefined) ?? fallback,
  });
  return {
    run: config.run,
    phases: [
      phase('prepare', Object.keys(await redis.hgetall(keys.stats(config.datasets[0]?.name ?? ''))).length > 0 ? 'completed' : 'pending'),
      { name: 'generate', status: generate },
      phase('tokenize', 'pending'),
      phase('merge', 'pending'),
      phase('train', 'pending'),
    ],
    datasets,
    endpoints,
  };
}

/** A live stall record counts only while the dataset is still being generated. */
function stallOf(record: { sinceMs: number; reason: string } | undefined, status: ProgressStatus): DatasetStatus['stalled'] {
  if (record === undefined || status === 'completed' || status === 'paused') return null;
  return { sinceMs: record.sinceMs, reason: record.reason };
}

/**
 * Warning lines for a run that is not moving: each stalled dataset, and no healthy endpoint
 * while datasets still have prompts to generate. Empty when all is well.
 */
export function runStatusWarnings(status: RunStatus, nowMs = Date.now()): string[] {
  const lines: string[] = [];
  for (const d of status.datasets) {
    if (d.stalled === null) continue;
    lines.push(`! ${d.name} stalled for ${fmtDuration((nowMs - d.stalled.sinceMs) / 1000)}: ${d.stalled.reason} — a bug; see the producer's log`);
  }
  const generating = status.datasets.some((d) => d.status === 'in_progress' || d.status === 'pending');
  if (generating && status.endpoints.total > 0 && status.endpoints.healthy === 0) lines.push(`waiting: ${describeEndpointHealth(status.endpoints)}`);
  return lines;
}

async function isQueuePaused(redis: Redis, keys: RunKeys, dataset: string): Promise<boolean> {
  const queue = new Queue(generateQueueName(dataset), { connection: redis, prefix: keys.bullPrefix });
  try {
    return await queue.isPaused();
  } finally {
    await queue.close();
  }
}

/** Output tokens still to generate: to the budget, or what the remaining prompts should yield. */
function remainingTokens(
  ds: Pick<Config['datasets'][number], 'tokenBudget'>,
  stats: Record<string, string>,
  records: number,
  outputTokens: number,
  failed: number,
  skipped: number,
): number | null {
  const byBudget = ds.tokenBudget === undefined ? Infinity : Math.max(0, ds.tokenBudget - outputTokens);
  const prompts = stats.prompts === undefined ? undefined : Number(stats.prompts);
  const byPrompts =
    prompts === undefined || records === 0 ? Infinity : Math.max(0, prompts - records - failed - skipped) * (outputTokens / records);
  const r = Math.min(byBudget, byPrompts);
  return Number.isFinite(r) ? r : null;
}

/** tok/s over the last minute, and an ETA range from the fastest and slowest recent 10 s buckets. */
function rateAndEta(rate: Record<string, string>, nowMs: number, remaining: number | null): { tokensPerSec: number; eta: { low: number | null; high: number | null } } {
  const current = Math.floor(nowMs / RATE_BUCKET_MS);
  const buckets = Object.keys(rate)
    .map(Number)
    .filter((b) => b < current && b >= current - RATE_WINDOW_BUCKETS);
  const earliest = Math.min(...Object.keys(rate).map(Number));
  // Average over full buckets since the first commit, up to the last minute.
  const span = Math.min(RATE_WINDOW_BUCKETS, Math.max(1, current - (Number.isFinite(earliest) ? earliest : current)));
  let sum = 0;
  for (const b of buckets) sum += Number(rate[String(b)] ?? 0);
  const currentTokens = Number(rate[String(current)] ?? 0);
  const elapsedInCurrentSec = (nowMs % RATE_BUCKET_MS) / 1000;
  const tokensPerSec = buckets.length === 0 ? (elapsedInCurrentSec > 0 ? currentTokens / elapsedInCurrentSec : 0) : sum / ((span * RATE_BUCKET_MS) / 1000);
  if (remaining === null) return { tokensPerSec, eta: { low: null, high: null } };
  if (remaining === 0) return { tokensPerSec, eta: { low: 0, high: 0 } };
  const rates = buckets.map((b) => Number(rate[String(b)] ?? 0) / (RATE_BUCKET_MS / 1000)).filter((r) => r > 0);
  if (rates.length === 0) {
    return tokensPerSec > 0 ? { tokensPerSec, eta: { low: Math.round((remaining / tokensPerSec) * 0.8), high: Math.round((remaining / tokensPerSec) * 1.25) } } : { tokensPerSec, eta: { low: null, high: null } };
  }
  const fastest = Math.max(...rates, tokensPerSec);
  const slowest = Math.min(...rates, tokensPerSec > 0 ? tokensPerSec : Infinity);
  return { tokensPerSec, eta: { low: Math.round(remaining / fastest), high: Math.round(remaining / slowest) } };
}

function fmtInt(n: number): string {
  return n.toLocaleString('en-US');
}

function fmtDuration(s: number | null): string {
  if (s === null) return '?';
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

/** The status as a readable table, with the phases as a checklist. */
export function formatRunStatus(status: RunStatus, nowMs = Date.now()): string {
  const mark: Record<ProgressStatus, string> = { completed: '[x]', in_progress: '[~]', pending: '[ ]', failed: '[!]', paused: '[=]' };
  const lines = [`run ${status.run}`, `phases: ${status.phases.map((p) => `${mark[p.status]} ${p.name}`).join('  ')}`];
  if (status.endpoints.reported > 0) lines.push(`endpoints: ${describeEndpointHealth(status.endpoints)}`);
  lines.push('');
  const header = ['dataset', 'status', 'tokens / budget', '%', 'records', 'in flight', 'failed', 'skipped', 'rejected', 'tok/s', 'ETA'];
  const rows = status.datasets.map((d) => [
    d.name,
    d.status,
    d.tokenBudget === null ? fmtInt(d.outputTokens) : `${fmtInt(d.outputTokens)} / ${fmtInt(d.tokenBudget)}`,
    d.tokenBudget === null || d.tokenBudget === 0 ? '' : `${Math.min(999, Math.floor((100 * d.outputTokens) / d.tokenBudget))}%`,
    fmtInt(d.records),
    fmtInt(d.inFlight),
    fmtInt(d.failed),
    fmtInt(d.skipped),
    fmtInt(d.rejected),
    fmtInt(Math.round(d.tokensPerSec)),
    d.status === 'completed' ? '-' : d.etaSeconds.low === null ? '?' : `${fmtDuration(d.etaSeconds.low)}–${fmtDuration(d.etaSeconds.high)}`,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const fmt = (r: string[]): string => r.map((c, i) => (i === 0 || i === 1 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join('  ');
  lines.push(fmt(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(fmt));
  const warnings = runStatusWarnings(status, nowMs);
  if (warnings.length > 0) lines.push('', ...warnings);
  return lines.join('\n');
}
