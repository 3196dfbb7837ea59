import { AppError, formatInt, type TrainPayload, type TrainProgress } from '../../shared/index.js';
import { TrainCancelledError } from './cancelled.js';
import type { GpuInfo } from '../gpu/index.js';
import type { TrainOutcome } from './train-deps.js';
import type { WatchedRun } from './watch-command.js';

/** `GPU 0 (NVIDIA H200): 21,000 of 143,771 MiB free` for each GPU preflight saw. */
function describeSeen(seen: readonly GpuInfo[], assigned: readonly GpuInfo[], need: number): string {
  const list = (assigned.length > 0 ? assigned : seen).map(
    (g) => `GPU ${g.index} (${g.name}): ${formatInt(g.freeMiB)} of ${formatInt(g.totalMiB)} MiB free`,
  );
  return list.length === 0 ? 'no GPU' : `${list.join('; ')} (${formatInt(need)} MiB needed)`;
}

/**
 * What a watched command's end means, before it counts as completed: cancelled (thrown), stopped
 * by the worker's shutdown (requeued with `train.autoResume`, else thrown), out of memory or
 * failed (thrown, with the line or the output's tail). Null when it completed.
 */
export function judgeExit(
  p: TrainPayload,
  run: WatchedRun,
  o: { pr: TrainProgress; where: string; seen: readonly GpuInfo[]; assigned: readonly GpuInfo[] },
): TrainOutcome | null {
  const { exit, stopping, oomLine, lastLines } = run;
  const { pr, where } = o;
  const how = exit.spawnError ?? (exit.signal !== null ? `killed by ${exit.signal}` : `exit code ${exit.code ?? '?'}`);

  if (stopping === 'cancel')
    throw new TrainCancelledError(
      `cancelled by \`tokenmill train --cancel\` at step ${pr.step ?? '?'} (${where}; ${exit.killed ? 'SIGKILL after the grace period' : 'stopped on SIGTERM'})`,
    );
  if (stopping === 'shutdown') {
    if (p.autoResume)
      return {
        kind: 'requeue',
        reason: `the train worker stopped during ${where}; another worker resumes it (train.autoResume)`,
      };
    throw new AppError(
      `the train worker was stopped during ${where} at step ${pr.step ?? '?'}; not resumed because train.autoResume is false — continue with \`tokenmill train --resume\``,
    );
  }
  if (oomLine !== null) {
    throw new AppError(
      `CUDA out of memory in ${where}: "${oomLine}"; free memory at preflight: ${describeSeen(o.seen, o.assigned, p.minFreeGpuMemMiB)}`,
    );
  }
  if (exit.spawnError !== null || exit.code !== 0) {
    const tail = lastLines
      .filter((l) => l.trim() !== '')
      .slice(-3)
      .join(' | ');
    throw new AppError(`the training command failed (${how}) in ${where}${tail === '' ? '' : `: ${tail}`}`);
  }
  return null;
}
