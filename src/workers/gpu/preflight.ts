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

/** One group of a split job: its name (`target`, `drafter`), its GPUs and free memory per GPU. */
export interface GpuGroupNeed extends GpuNeed {
  name: string;
}

/** A group's GPUs, as preflight assigned them. */
export interface AssignedGroup {
  name: string;
  gpus: GpuInfo[];
}

/** Preflight's verdict for a split job: each group's GPUs (disjoint), or wait, naming the group short. */
export type GroupsVerdict =
  | { ok: true; assigned: GpuInfo[]; groups: AssignedGroup[]; seen: GpuInfo[] }
  | { ok: false; reason: string; seen: GpuInfo[] };

/**
 * Chooses disjoint GPUs for each group of a split job, in order (the target group first): each
 * takes the first `gpus` by index, among those this worker may use and no earlier group took,
 * with the group's `minFreeGpuMemMiB` free. A group that cannot be served makes the job wait,
 * the reason naming that group and its numbers (`drafter group: 3 GPU(s) with 40,000 MiB free
 * needed, 2 have it — GPU 6: 1,000 MiB free, 40,000 needed`). `assigned` lists the groups' GPUs
 * in group order: what `CUDA_VISIBLE_DEVICES` names.
 */
export function preflightGroups(
  groups: readonly GpuGroupNeed[],
  probe: GpuProbe,
  allowed?: readonly number[],
): GroupsVerdict {
  const usable = probe.gpus
    .filter((g) => allowed === undefined || allowed.includes(g.index))
    .sort((a, b) => a.index - b.index);
  const total = groups.reduce((n, g) => n + g.gpus, 0);
  if (usable.length < total) {
    const why =
      probe.problem ??
      (allowed === undefined
        ? `this worker has ${usable.length} GPU(s)`
        : `this worker may use ${usable.length} GPU(s) (--gpus ${allowed.join(',')})`);
    return {
      ok: false,
      reason: `${total} GPU(s) needed (${groups.map((g) => `${g.name} ${g.gpus}`).join(' + ')}); ${why}`,
      seen: usable,
    };
  }
  const taken = new Set<number>();
  const assigned: AssignedGroup[] = [];
  const short: string[] = [];
  for (const group of groups) {
    const free = usable.filter((g) => !taken.has(g.index));
    const fit = free.filter((g) => g.freeMiB >= group.minFreeGpuMemMiB);
    if (fit.length >= group.gpus) {
      const chosen = fit.slice(0, group.gpus);
      for (const g of chosen) taken.add(g.index);
      assigned.push({ name: group.name, gpus: chosen });
      continue;
    }
    const lacking = free
      .filter((g) => g.freeMiB < group.minFreeGpuMemMiB)
      .map((g) => `GPU ${g.index}: ${formatInt(g.freeMiB)} MiB free, ${formatInt(group.minFreeGpuMemMiB)} needed`);
    const others = taken.size === 0 ? '' : ` (GPU ${[...taken].join(',')} taken by the groups before it)`;
    short.push(
      `${group.name} group: ${group.gpus} GPU(s) with ${formatInt(group.minFreeGpuMemMiB)} MiB free needed, ${fit.length} have it${others} — ${lacking.join('; ')}`,
    );
    // Later groups are still checked, against what is left, so the reason names every group short.
    for (const g of fit) taken.add(g.index);
  }
  if (short.length > 0) return { ok: false, reason: short.join('; '), seen: usable };
  return { ok: true, assigned: assigned.flatMap((a) => a.gpus), groups: assigned, seen: usable };
}
