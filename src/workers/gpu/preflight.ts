import { formatInt } from '../../shared/index.js';
import type { GpuInfo, GpuProbe } from './gpus.js';

/** What a train job needs from the GPUs. */
export interface GpuNeed {
  gpus: number;
  minFreeGpuMemMiB: number;
}

/** Preflight's verdict: start on these GPUs, or wait (with why, in numbers). */
export type PreflightVerdict =
  { ok: true; assigned: GpuInfo[]; seen: GpuInfo[] } | { ok: false; reason: string; seen: GpuInfo[] };

/**
 * Chooses the GPUs for a job: among those this worker may use (`allowed`, from `--gpus`; all
 * when omitted), the first `need.gpus` by index with at least `minFreeGpuMemMiB` free. Not
 * enough → wait, naming each GPU short of memory (`GPU 3: 14,200 MiB free, 20,000 needed`).
 * A job that needs no GPU always starts.
 */
export function preflight(need: GpuNeed, probe: GpuProbe, allowed?: readonly number[]): PreflightVerdict {
  const usable = probe.gpus
    .filter((g) => allowed === undefined || allowed.includes(g.index))
    .sort((a, b) => a.index - b.index);
  if (need.gpus === 0) return { ok: true, assigned: [], seen: usable };
  if (usable.length < need.gpus) {
    const why =
      probe.problem ??
      (allowed === undefined
        ? `this worker has ${usable.length} GPU(s)`
        : `this worker may use ${usable.length} GPU(s) (--gpus ${allowed.join(',')})`);
    return { ok: false, reason: `${need.gpus} GPU(s) needed; ${why}`, seen: usable };
  }
  const fit = usable.filter((g) => g.freeMiB >= need.minFreeGpuMemMiB);
  if (fit.length >= need.gpus) return { ok: true, assigned: fit.slice(0, need.gpus), seen: usable };
  const short = usable
    .filter((g) => g.freeMiB < need.minFreeGpuMemMiB)
    .map((g) => `GPU ${g.index}: ${formatInt(g.freeMiB)} MiB free, ${formatInt(need.minFreeGpuMemMiB)} needed`);
  return {
    ok: false,
    reason: `${need.gpus} GPU(s) with ${formatInt(need.minFreeGpuMemMiB)} MiB free needed, ${fit.length} have it — ${short.join('; ')}`,
    seen: usable,
  };
}
