import { AppError, type TrainPayload } from '../../shared/index.js';
import { trainDir } from './attempts.js';
import { freeDiskGiB, type ChainStepPlace } from './chain.js';
import { preflight, preflightGroups, type AssignedGroup, type GpuInfo, type GpuProbe } from '../gpu/index.js';
import { checkHiddenStates } from './hidden-states.js';
import type { TrainDeps } from './train-deps.js';

/** Whether a job can start now: on which GPUs, or wait (the status says why). */
export type StartCheck =
  | { kind: 'wait'; reason: string }
  | {
      kind: 'start';
      probe: GpuProbe;
      /** The GPUs assigned (a split step's: the target group's, then the drafter group's), and its groups. */
      verdict: { ok: true; assigned: GpuInfo[]; seen: GpuInfo[]; groups: AssignedGroup[] | null };
      /** The GPUs preflight saw, as the status records them. */
      seenJson: string;
    };

/**
 * What must hold before a job starts, in order: the hidden states a chain step writes fit its
 * disk (refused at once when they never can, wait for free space when they can), enough GPUs
 * with enough free memory, and `train.minFreeDiskGiB` free. A wait is written to the status.
 */
export async function checkStart(
  p: TrainPayload,
  deps: TrainDeps,
  o: { mode: TrainPayload['mode']; stepName: string | undefined; place: ChainStepPlace | null },
): Promise<StartCheck> {
  const { mode, stepName, place } = o;
  const log = deps.logger;
  // Hidden states the step writes: sized first, so a step that can never fit fails at once.
  if (p.hiddenStates !== undefined) {
    const hs = await checkHiddenStates(p, place?.output ?? trainDir(p.runDir), deps.jobId);
    await deps.recordHiddenStates(hs.entry);
    if (hs.verdict === 'refused') throw new AppError(hs.reason);
    if (hs.verdict === 'waiting') {
      await deps.setStatus({ state: 'waiting', waiting: hs.reason, worker: deps.workerId, mode }, 'pending');
      return { kind: 'wait', reason: hs.reason };
    }
    deps.jobLog(hs.reason);
    log.info({ hiddenStates: hs.entry }, 'hidden states sized: they fit');
  }

  // Preflight: enough GPUs with enough free memory, or wait.
  const probe = await deps.probeGpus();
  // A split step: each group on its own GPUs with its own free memory.
  const groups = p.gpuGroups;
  const verdict =
    groups === undefined
      ? { ...preflight({ gpus: p.gpus, minFreeGpuMemMiB: p.minFreeGpuMemMiB }, probe, deps.allowedGpus), groups: null }
      : preflightGroups(
          [
            { name: 'target', ...groups.target },
            { name: 'drafter', ...groups.drafter },
          ],
          probe,
          deps.allowedGpus,
        );
  const seenJson = JSON.stringify(
    verdict.seen.map((g) => ({ index: g.index, name: g.name, freeMiB: g.freeMiB, totalMiB: g.totalMiB })),
  );
  if (!verdict.ok) {
    await deps.setStatus(
      { state: 'waiting', waiting: verdict.reason, preflight: seenJson, worker: deps.workerId, mode },
      'pending',
    );
    return { kind: 'wait', reason: verdict.reason };
  }
  if (p.minFreeDiskGiB > 0) {
    const disk = await freeDiskGiB(p.runDir);
    if (disk.freeGiB < p.minFreeDiskGiB) {
      const reason = `disk ${disk.path}: ${disk.freeGiB.toFixed(1)} GiB free, ${p.minFreeDiskGiB} GiB needed${stepName === undefined ? '' : ` by step ${stepName}`}`;
      await deps.setStatus(
        { state: 'waiting', waiting: reason, preflight: seenJson, worker: deps.workerId, mode },
        'pending',
      );
      return { kind: 'wait', reason };
    }
  }
  return { kind: 'start', probe, verdict: { ...verdict, groups: verdict.groups ?? null }, seenJson };
}
