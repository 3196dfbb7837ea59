import type { Redis } from 'ioredis';
import type { RunKeys, TrainHiddenStates } from '../queues/index.js';
import { TrainHiddenStatesSchema, TrainKeys } from '../queues/index.js';
import { formatDuration, formatInt } from '../util/index.js';

/** State of the run's latest train job, as train workers record it. */
export type TrainState = 'queued' | 'waiting' | 'running' | 'completed' | 'failed' | 'cancelled' | 'skipped';

/** One GPU as preflight saw it. */
export interface GpuMemorySeen {
  index: number;
  name: string;
  freeMiB: number;
  totalMiB: number;
}

/** The train part of `status --json` (null before any train job). */
export interface TrainStatus {
  jobId: string;
  state: TrainState;
  mode: string | null;
  /** A chain's step running now (`extract (1/2)`); null for a single command. */
  chainStep: string | null;
  /** Attempt folder name (`0003`) and path. */
  attempt: string | null;
  attemptDir: string | null;
  checkpoint: string | null;
  step: number | null;
  total: number | null;
  loss: number | null;
  stepsPerSec: number | null;
  etaSeconds: number | null;
  /** Why the job waits (GPU memory, GPUs missing), with the numbers. */
  waiting: string | null;
  /** Why it failed or was cancelled. */
  reason: string | null;
  worker: string | null;
  /** GPUs assigned (indices). */
  gpus: number[];
  /** A split step's groups: `target 0,1,2,3,4 + drafter 5,6,7`; null otherwise. */
  gpuGroups: string | null;
  /** GPUs as preflight saw them. */
  preflight: GpuMemorySeen[];
  /** The environment fingerprint recorded before the start. */
  fingerprint: Record<string, unknown> | null;
  /** Differences from the last successful run's fingerprint (`what: before → now`). */
  envChanges: string[];
  /** The hidden-state estimates of the chain's steps that declare `hiddenStates`, in step order, each with its line. */
  hiddenStates: (TrainHiddenStates & { text: string })[];
  updatedAt: string | null;
}

/** Bytes in decimal units, as disks are sold: `950 B`, `80.0 GB`, `1.8 TB`. */
export function formatBytes(n: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB', 'EB'];
  let v = n;
  let u = 0;
  while (v >= 1000 && u < units.length - 1) {
    v /= 1000;
    u++;
  }
  return u === 0 ? `${Math.round(v)} B` : `${v < 100 ? v.toFixed(1) : v.toFixed(0)} ${units[u]}`;
}

/** The estimate's formula with its inputs: `3,473,408 tokens × (2,880 hidden × 4 layers × 2 B bfloat16 + 16 B)`. */
export function hiddenStatesFormula(
  e: Pick<
    TrainHiddenStates,
    'tokens' | 'hiddenSize' | 'layers' | 'bytesPerElement' | 'dtype' | 'overheadBytesPerToken'
  >,
): string {
  return `${formatInt(e.tokens)} tokens × (${formatInt(e.hiddenSize)} hidden × ${e.layers} layers × ${e.bytesPerElement} B ${e.dtype} + ${e.overheadBytesPerToken} B)`;
}

/** A step's estimate in one line: `hidden states ≈ 80.0 GB (formula); /data: 900 GB free of 2.0 TB — waiting for 84.0 GB free`. */
export function describeHiddenStates(e: TrainHiddenStates): string {
  const disk =
    e.disk === null
      ? ''
      : `; ${e.disk.path}: ${formatBytes(e.disk.freeBytes)} free of ${formatBytes(e.disk.totalBytes)}`;
  const verdict =
    e.verdict === 'fits'
      ? 'fits'
      : e.verdict === 'waiting'
        ? `waiting for ${formatBytes(e.neededBytes)} free`
        : `refused: needs ${formatBytes(e.neededBytes)}`;
  return `hidden states ≈ ${formatBytes(e.bytes)} (${hiddenStatesFormula(e)})${disk} — ${verdict}`;
}

function hiddenStatesOf(h: Record<string, string>): (TrainHiddenStates & { text: string })[] {
  const out: (TrainHiddenStates & { text: string })[] = [];
  for (const v of Object.values(h)) {
    const parsed = TrainHiddenStatesSchema.safeParse(json<unknown>(v, null));
    if (parsed.success) out.push({ ...parsed.data, text: describeHiddenStates(parsed.data) });
  }
  return out.sort((a, b) => a.stepIndex - b.stepIndex);
}

function num(v: string | undefined): number | null {
  if (v === undefined || v === '') return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

function str(v: string | undefined): string | null {
  return v === undefined || v === '' ? null : v;
}

function json<T>(v: string | undefined, fallback: T): T {
  if (v === undefined || v === '') return fallback;
  try {
    return JSON.parse(v) as T;
  } catch {
    return fallback;
  }
}

/** Reads the run's train status; null when no train job was ever queued. */
export async function readTrainStatus(redis: Redis, keys: RunKeys): Promise<TrainStatus | null> {
  const tk = new TrainKeys(keys);
  const [h, hidden] = await Promise.all([redis.hgetall(tk.status()), redis.hgetall(tk.hiddenStates())]);
  if (h.jobId === undefined) return null;
  return {
    jobId: h.jobId,
    state: (h.state as TrainState | undefined) ?? 'queued',
    mode: str(h.mode),
    chainStep: str(h.chainStep),
    attempt: str(h.attempt),
    attemptDir: str(h.attemptDir),
    checkpoint: str(h.checkpoint),
    step: num(h.step),
    total: num(h.total),
    loss: num(h.loss),
    stepsPerSec: num(h.stepsPerSec),
    etaSeconds: num(h.etaSeconds),
    waiting: str(h.waiting),
    reason: str(h.reason),
    worker: str(h.worker),
    gpus: (h.gpus ?? '')
      .split(',')
      .filter((s) => s !== '')
      .map(Number),
    gpuGroups: str(h.gpuGroups),
    preflight: json<GpuMemorySeen[]>(h.preflight, []),
    fingerprint: json<Record<string, unknown> | null>(h.fingerprint, null),
    envChanges: json<string[]>(h.envChanges, []),
    hiddenStates: hiddenStatesOf(hidden),
    updatedAt: str(h.updatedAt),
  };
}

/** One line of progress: `step 40/100  loss 2.3100  3.20 steps/s  ETA 19s`. */
export function formatTrainProgress(
  t: Pick<TrainStatus, 'step' | 'total' | 'loss' | 'stepsPerSec' | 'etaSeconds'>,
): string {
  const parts: string[] = [];
  if (t.step !== null) parts.push(`step ${t.step}${t.total === null ? '' : `/${t.total}`}`);
  if (t.loss !== null) parts.push(`loss ${t.loss.toPrecision(5)}`);
  if (t.stepsPerSec !== null) parts.push(`${t.stepsPerSec.toFixed(2)} steps/s`);
  if (t.etaSeconds !== null) parts.push(`ETA ${formatDuration(t.etaSeconds)}`);
  return parts.join('  ');
}

/** The train status as lines for `status` (empty when there is none). */
export function formatTrainStatus(t: TrainStatus | null): string[] {
  if (t === null) return [];
  const head = [`train ${t.jobId}: ${t.state}`];
  if (t.mode !== null) head.push(t.mode);
  if (t.attempt !== null) head.push(`attempt ${t.attempt}`);
  if (t.chainStep !== null) head.push(`step ${t.chainStep}`);
  if (t.gpus.length > 0) head.push(t.gpuGroups === null ? `GPUs ${t.gpus.join(',')}` : `GPUs ${t.gpuGroups}`);
  const lines = [head.join(', ')];
  const progress = formatTrainProgress(t);
  if (progress !== '') lines.push(`  ${progress}`);
  if (t.state === 'waiting' && t.waiting !== null) lines.push(`  waiting: ${t.waiting}`);
  if (t.reason !== null && (t.state === 'failed' || t.state === 'cancelled' || t.state === 'skipped'))
    lines.push(`  ${t.state === 'skipped' ? 'skipped' : 'reason'}: ${t.reason}`);
  if (t.envChanges.length > 0) lines.push(`  environment changed: ${t.envChanges.join('; ')}`);
  for (const e of t.hiddenStates) lines.push(`  step ${e.step}: ${e.text}`);
  return lines;
}

/**
 * The train phase's line of numbers for the status checklist: progress while running, why it
 * waits (`GPU 3: 14,200 MiB free, 20,000 needed`), why it failed; '' before any train job.
 */
export function trainPhaseDetail(t: TrainStatus | null): string {
  if (t === null) return '';
  const at = `${t.attempt === null ? '' : `attempt ${t.attempt}, `}${t.chainStep === null ? '' : `step ${t.chainStep}, `}`;
  if (t.state === 'waiting') return `waiting — ${t.waiting ?? ''}`;
  const progress = formatTrainProgress(t);
  if (t.state === 'running') return `${at}${progress === '' ? 'running' : progress}`;
  if (t.state === 'completed')
    return `${at}completed${progress === '' ? '' : `, ${progress.replace(/\s+ETA .*$/, '')}`}`;
  return `${at}${t.state}${t.reason === null ? '' : ` — ${t.reason}`}`;
}
