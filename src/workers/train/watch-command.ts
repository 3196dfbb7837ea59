import { hostname } from 'node:os';
import type { TrainPayload } from '../../shared/index.js';
import type { PlannedAttempt } from './attempt-plan.js';
import {
  recordedIdentity,
  runCommand,
  type CommandExit,
  type GpuInfo,
  type Stopping,
  type StopSignal,
} from '../gpu/index.js';
import { ProgressTracker, isCudaOom } from './progress.js';
import { progressReporter } from './progress-report.js';
import type { TrainDeps } from './train-deps.js';

/** How a watched command ended, and what its output said. */
export interface WatchedRun {
  exit: CommandExit;
  /** Why the command was stopped: `tokenmill train --cancel`, the worker's shutdown, or not. */
  stopping: Stopping;
  /** The first CUDA out-of-memory line of its output. */
  oomLine: string | null;
  /** Its last 20 output lines. */
  lastLines: string[];
  tracker: ProgressTracker;
}

/**
 * Runs the command in its own process group until it exits: its output goes to the job's log,
 * progress to the status, an out-of-memory line is kept; `stop` (the cancel flag, the worker's
 * shutdown) stops it (SIGTERM, SIGKILL after `train.cancelGraceMs`).
 */
export async function runAndWatch(
  p: TrainPayload,
  deps: TrainDeps,
  o: {
    mode: TrainPayload['mode'];
    planned: PlannedAttempt;
    assigned: readonly GpuInfo[];
    /** A split step's groups (their GPUs are `assigned`, the target group's first). */
    groups: { target: readonly number[]; drafter: readonly number[] } | null;
  },
  stop: StopSignal,
): Promise<WatchedRun> {
  const { mode, assigned, groups } = o;
  const { attempt, argv, checkpoint } = o.planned;
  const log = deps.logger;
  const tracker =
    p.progressRegex === undefined ? new ProgressTracker() : new ProgressTracker(new RegExp(p.progressRegex));
  let oomLine: string | null = null;
  const lastLines: string[] = [];
  const reporter = progressReporter(tracker, deps, log);
  const report = reporter.report;
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    CUDA_VISIBLE_DEVICES: assigned.map((g) => g.index).join(','),
    PYTHONUNBUFFERED: '1',
    TOKENMILL_TRAIN_DATASET: p.dataset,
    TOKENMILL_TRAIN_OUTPUT: attempt.checkpoints,
    TOKENMILL_TRAIN_ATTEMPT: attempt.attempt,
    ...(mode === 'resume' && checkpoint !== undefined ? { TOKENMILL_TRAIN_CHECKPOINT: checkpoint } : {}),
    ...(groups === null
      ? {}
      : { TOKENMILL_TARGET_GPUS: groups.target.join(','), TOKENMILL_DRAFTER_GPUS: groups.drafter.join(',') }),
  };
  const onGpus =
    assigned.length === 0
      ? 'CPU'
      : groups === null
        ? `GPU ${assigned.map((g) => g.index).join(',')}`
        : `GPU ${describeGroups(groups)}`;
  deps.jobLog(
    `attempt ${attempt.attempt} (${mode}${mode === 'resume' ? ` from ${checkpoint ?? ''}` : ''}) on ${onGpus}: ${argv.join(' ')}`,
  );
  const running = runCommand({
    argv,
    cwd: p.cwd,
    env,
    logFile: attempt.log,
    onLine(line) {
      deps.jobLog(line);
      lastLines.push(line);
      if (lastLines.length > 20) lastLines.shift();
      if (oomLine === null && isCudaOom(line)) oomLine = line.trim();
      if (tracker.feed(line)) report(false);
    },
  });
  await deps.setStatus(
    {
      state: 'running',
      mode,
      attempt: attempt.attempt,
      attemptDir: attempt.dir,
      checkpoint: mode === 'resume' ? (checkpoint ?? '') : '',
      worker: deps.workerId,
      host: hostname(),
      pid: running.pid ?? '',
      pidIdentity: recordedIdentity(running.pid),
      gpus: assigned.map((g) => g.index).join(','),
      gpuGroups: groups === null ? '' : describeGroups(groups),
      startedAt: new Date().toISOString(),
      reason: '',
    },
    'in_progress',
  );
  log.info(
    { attempt: attempt.attempt, mode, argv, gpus: assigned.map((g) => g.index), gpuGroups: groups, pid: running.pid },
    'training started',
  );

  const onStop = (): void => {
    if (stop.why() === 'cancel')
      deps.jobLog(`cancelled: SIGTERM to the process group, SIGKILL after ${p.cancelGraceMs} ms`);
    void running.stop(p.cancelGraceMs);
  };
  stop.signal.addEventListener('abort', onStop, { once: true });
  if (stop.signal.aborted) onStop();
  let exit;
  try {
    exit = await running.exited;
  } finally {
    stop.signal.removeEventListener('abort', onStop);
  }
  report(true);
  await reporter.settled();
  return { exit, stopping: stop.why(), oomLine, lastLines, tracker };
}

/** A split step's groups in one phrase: `target 0,1,2,3,4 + drafter 5,6,7`. */
export function describeGroups(groups: { target: readonly number[]; drafter: readonly number[] }): string {
  return `target ${groups.target.join(',')} + drafter ${groups.drafter.join(',')}`;
}
