import type { TrainProgress } from '../../shared/index.js';

/** One line's progress fields (null where the line says nothing). */
export interface LineProgress {
  step: number | null;
  total: number | null;
  loss: number | null;
}

const NUMBER = String.raw`[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?`;
const STEP = /\bstep\b[\s:=#]*(\d+)\s*(?:\/|of)\s*(\d+)/i;
const STEP_ONLY = /\bstep\b[\s:=#]*(\d+)\b/i;
const LOSS = new RegExp(String.raw`\bloss\b\s*[:=]?\s*(${NUMBER})`, 'i');

function numOrNull(v: string | undefined): number | null {
  if (v === undefined) return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

/**
 * Reads progress from one output line: with `custom` (`train.progressRegex`), its named groups
 * `step`, `total`, `loss`; otherwise `step N/M` (or `step N`) and `loss X` anywhere in the line.
 */
export function parseProgressLine(line: string, custom?: RegExp): LineProgress | null {
  if (custom !== undefined) {
    const m = custom.exec(line);
    if (m === null) return null;
    const g = m.groups ?? {};
    const p = { step: numOrNull(g.step), total: numOrNull(g.total), loss: numOrNull(g.loss) };
    return p.step === null && p.total === null && p.loss === null ? null : p;
  }
  const s = STEP.exec(line);
  const s1 = s === null ? STEP_ONLY.exec(line) : null;
  const l = LOSS.exec(line);
  const p = { step: numOrNull(s?.[1] ?? s1?.[1]), total: numOrNull(s?.[2]), loss: numOrNull(l?.[1]) };
  return p.step === null && p.loss === null ? null : p;
}

/**
 * Progress over a run: the latest step, total and loss, steps/s since the first step seen
 * (so a resumed run's rate is not inflated by the steps it skipped), and the ETA.
 */
export class ProgressTracker {
  private first: { step: number; atMs: number } | null = null;
  private current: TrainProgress = { step: null, total: null, loss: null, stepsPerSec: null, etaSeconds: null };
  firstLoss: number | null = null;
  /** Lines that carried progress. */
  updates = 0;

  constructor(private readonly custom?: RegExp) {}

  /** Feeds one output line; true when it carried progress. */
  feed(line: string, nowMs = Date.now()): boolean {
    const p = parseProgressLine(line, this.custom);
    if (p === null) return false;
    this.updates += 1;
    const c = this.current;
    if (p.total !== null) c.total = p.total;
    if (p.loss !== null) {
      c.loss = p.loss;
      this.firstLoss ??= p.loss;
    }
    if (p.step !== null) {
      c.step = p.step;
      if (this.first === null) this.first = { step: p.step, atMs: nowMs };
      else if (nowMs > this.first.atMs && p.step > this.first.step) {
        c.stepsPerSec = (p.step - this.first.step) / ((nowMs - this.first.atMs) / 1000);
      }
      c.etaSeconds =
        c.stepsPerSec !== null && c.stepsPerSec > 0 && c.total !== null
          ? Math.max(0, (c.total - p.step) / c.stepsPerSec)
          : c.etaSeconds;
    }
    return true;
  }

  get progress(): TrainProgress {
    return { ...this.current };
  }
}

/** CUDA out-of-memory as PyTorch and the CUDA runtime print it. */
const OOM =
  /CUDA out of memory|torch\.cuda\.OutOfMemoryError|OutOfMemoryError: CUDA|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED/;

/** Whether an output line reports a CUDA out-of-memory error. */
export function isCudaOom(line: string): boolean {
  return OOM.test(line);
}
