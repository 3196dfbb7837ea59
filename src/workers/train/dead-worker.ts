import { hostname } from 'node:os';
import { AppError, type TrainPayload } from '../../shared/index.js';
import { resolveResumeCheckpoint } from './attempts.js';
import { groupAlive, killLeftGroup } from '../gpu/index.js';
import type { TrainDeps } from './train-deps.js';

/** How a job runs once an earlier, dead worker's run of it is taken over. */
export interface TakenOver {
  mode: TrainPayload['mode'];
  checkpoint: TrainPayload['checkpoint'];
}

/**
 * A worker that ran this job before and is gone: its command's process group, if left on this
 * machine, is killed; the job resumes (`train.autoResume`) or fails naming how to continue.
 * With no dead run, the payload's mode and checkpoint.
 */
export async function takeOverDeadRun(
  p: TrainPayload,
  deps: TrainDeps,
  stepName: string | undefined,
): Promise<TakenOver> {
  const log = deps.logger;
  let mode = p.mode;
  let checkpoint = p.checkpoint;
  const prev = await deps.previousRun();
  if (prev !== null && prev.state === 'running') {
    if (prev.host === hostname() && prev.pid !== null && groupAlive(prev.pid)) {
      // Its command outlived it on this machine: it must not train beside the next attempt —
      // unless the pid names another process by now (a restart), which is left alone.
      const left = await killLeftGroup(prev.pid, prev.pidIdentity);
      if (left.killed) log.warn({ pgid: prev.pid }, 'killed the process group left by the dead train worker');
      else log.warn({ pgid: prev.pid }, `the dead train worker's process group: ${left.reason}`);
    }
    const who = `the train worker ${prev.worker ?? '(unknown)'} running attempt ${prev.attempt ?? '(unknown)'} died`;
    if (!p.autoResume && p.steps !== undefined) {
      throw new AppError(
        `${who}; not resumed because train.autoResume is false — \`tokenmill train --resume\` reruns the chain from step ${stepName ?? ''}`,
      );
    }
    if (!p.autoResume) {
      let newest = '';
      try {
        newest = `; newest checkpoint: ${await resolveResumeCheckpoint(p.runDir)}`;
      } catch {
        newest = '; it left no checkpoint';
      }
      throw new AppError(
        `${who}; not resumed because train.autoResume is false${newest} — continue with \`tokenmill train --resume\``,
      );
    }
    mode = 'resume';
    if (p.steps === undefined) checkpoint = await resolveResumeCheckpoint(p.runDir);
    deps.jobLog(
      `${who}; ${p.steps === undefined ? `resuming from ${checkpoint ?? ''}` : `running step ${stepName ?? ''} again`} (train.autoResume)`,
    );
    log.warn({ checkpoint }, `${who}; resuming (train.autoResume)`);
  }
  return { mode, checkpoint };
}
