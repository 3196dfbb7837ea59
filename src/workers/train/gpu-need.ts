import type { TrainStep } from '../../shared/index.js';

/** A split step's two groups: GPUs and free memory per GPU each. */
export interface GpuGroupsNeed {
  target: { gpus: number; minFreeGpuMemMiB: number };
  drafter: { gpus: number; minFreeGpuMemMiB: number };
}

/**
 * A step's GPU needs, with `train.gpus` / `train.minFreeGpuMemMiB` for what it omits: the total
 * count and memory, and its two groups when it is split (`gpus: { target, drafter }`; null
 * otherwise). The config refuses per-group memory without per-group GPUs.
 */
export function stepGpuNeed(
  step: Pick<TrainStep, 'gpus' | 'minFreeGpuMemMiB'>,
  train: { gpus: number; minFreeGpuMemMiB: number },
): { gpus: number; minFreeGpuMemMiB: number; groups: GpuGroupsNeed | null } {
  const gpus = step.gpus ?? train.gpus;
  const mem = step.minFreeGpuMemMiB ?? train.minFreeGpuMemMiB;
  if (typeof gpus === 'number') {
    if (typeof mem !== 'number') throw new Error('minFreeGpuMemMiB per group needs gpus per group');
    return { gpus, minFreeGpuMemMiB: mem, groups: null };
  }
  const memOf = (g: 'target' | 'drafter'): number => (typeof mem === 'number' ? mem : mem[g]);
  const groups: GpuGroupsNeed = {
    target: { gpus: gpus.target, minFreeGpuMemMiB: memOf('target') },
    drafter: { gpus: gpus.drafter, minFreeGpuMemMiB: memOf('drafter') },
  };
  return {
    gpus: gpus.target + gpus.drafter,
    minFreeGpuMemMiB: Math.min(groups.target.minFreeGpuMemMiB, groups.drafter.minFreeGpuMemMiB),
    groups,
  };
}
