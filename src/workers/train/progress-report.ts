import type { Logger } from '../../shared/index.js';
import type { ProgressTracker } from './progress.js';
import type { TrainDeps } from './train-deps.js';

/** Writes a running command's progress to the train status and the job. */
export interface ProgressReporter {
  /** Writes the tracker's progress: at most once every 500 ms, unless `force`. */
  report(force: boolean): void;
  /** Settles once every write asked for so far is done. */
  settled(): Promise<void>;
}

/**
 * The tracker's progress, written in order (status fields, then the job's progress); a write
 * that fails is logged, and training goes on.
 */
export function progressReporter(
  tracker: ProgressTracker,
  deps: Pick<TrainDeps, 'setStatus' | 'reportProgress'>,
  log: Logger,
): ProgressReporter {
  let lastReport = 0;
  let reporting: Promise<void> = Promise.resolve();
  const report = (force: boolean): void => {
    const now = Date.now();
    if (!force && now - lastReport < 500) return;
    lastReport = now;
    const pr = tracker.progress;
    const fields = {
      step: pr.step ?? '',
      total: pr.total ?? '',
      loss: pr.loss ?? '',
      stepsPerSec: pr.stepsPerSec ?? '',
      etaSeconds: pr.etaSeconds === null ? '' : Math.round(pr.etaSeconds),
    };
    reporting = reporting
      .then(async () => {
        await deps.setStatus(fields);
        await deps.reportProgress(pr);
      })
      .catch((e: unknown) => log.warn({ err: e }, 'could not record training progress'));
  };
  return { report, settled: () => reporting };
}
