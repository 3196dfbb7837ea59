import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { TrainPayloadSchema, parsePayload, type TrainPayload, type TrainResult } from '../../shared/index.js';
import { listCheckpoints } from './attempts.js';
import { doneInfo, markStepDone, placeChainStep, type ChainStepPlace } from './chain.js';
import { planAttempt } from './attempt-plan.js';
import { TrainCancelledError } from './cancelled.js';
import { judgeExit } from './command-exit.js';
import { takeOverDeadRun } from './dead-worker.js';
import { checkEnvironment } from './environment-check.js';
import { checkStart } from './start-checks.js';
import type { TrainDeps, TrainOutcome } from './train-deps.js';
import { runAndWatch } from './watch-command.js';

export { TrainCancelledError, isCancel } from './cancelled.js';
export type { PreviousRun, TrainDeps, TrainOutcome } from './train-deps.js';

/**
 * Runs one train job: worker-death check, the hidden states a chain step writes sized against
 * its disk (refuse what can never fit, wait for free space), GPU preflight (wait when memory is short),
 * environment fingerprint (refuse a change unless allowed), a new attempt folder, then the
 * command in its own process group, watched (progress, OOM, cancel) until it exits.
 */
export async function processTrain(data: unknown, deps: TrainDeps): Promise<TrainOutcome> {
  const p: TrainPayload = parsePayload(TrainPayloadSchema, data, 'train');
  const log = deps.logger;
  const started = Date.now();
  if (await deps.isCancelled())
    throw new TrainCancelledError('cancelled by `tokenmill train --cancel` before it started');

  const index = p.stepIndex ?? 0;
  const stepName = p.steps?.[index]?.name;
  const skipped = (reason: string, attemptDir: string | null = null): TrainOutcome => ({
    kind: 'done',
    result: {
      status: 'skipped',
      attempt: attemptDir === null ? null : path.basename(attemptDir),
      attemptDir,
      mode: p.mode,
      checkpoint: null,
      lastCheckpoint: null,
      progress: null,
      firstLoss: null,
      lastLoss: null,
      gpus: [],
      durationMs: Date.now() - started,
      reason,
      ...(stepName === undefined ? {} : { step: stepName }),
    },
  });
  const child =
    p.origin !== 'cli' || index > 0
      ? ((await deps.childResult()) as { status?: unknown; attemptDir?: unknown } | undefined)
      : undefined;
  const nothingNew =
    index === 0 ? child?.status === 'nothing-new' : child?.status === 'skipped' && child.attemptDir === null;
  if (nothingNew) {
    const reason =
      'the post-process round merged nothing new; training not started (run `tokenmill train` to train anyway)';
    await deps.setStatus({ state: 'skipped', reason, mode: p.mode });
    return skipped(reason);
  }
  const previousStep =
    index > 0 ? { attemptDir: typeof child?.attemptDir === 'string' ? child.attemptDir : null } : null;
  if (stepName !== undefined) await deps.setStatus({ chainStep: `${stepName} (${index + 1}/${p.steps?.length ?? 1})` });

  // 1. A worker that ran this job before and is gone.
  const taken = await takeOverDeadRun(p, deps, stepName);
  const { mode } = taken;

  // A chain step: where it runs; a step finished in an earlier run is not redone.
  let place: ChainStepPlace | null = null;
  if (p.steps !== undefined && (index > 0 || mode === 'resume')) {
    place = await placeChainStep({ ...p, mode }, previousStep, deps.jobId);
    if (place.done) {
      const reason = `step ${stepName ?? ''} finished in an earlier run of attempt ${place.attempt} (${await doneInfo(place)}); not redone`;
      deps.jobLog(reason);
      return {
        kind: 'done',
        result: {
          ...(skipped(reason, place.attemptDir) as { kind: 'done'; result: TrainResult }).result,
          status: 'completed',
        },
      };
    }
  }

  // 2. Before it starts: the hidden states a chain step writes fit its disk (sized first, so a
  // step that can never fit fails at once), then preflight: enough GPUs with enough free memory
  // and enough free disk, or wait.
  const start = await checkStart(p, deps, { mode, stepName, place });
  if (start.kind === 'wait') return start;
  const verdict = start.verdict;
  const assigned = verdict.assigned;

  // 3. Environment fingerprint against the last good run's.
  const { fp, changes } = await checkEnvironment(p, deps, start);

  // 4. What to run, then a new attempt folder (earlier ones are never touched).
  const planned = await planAttempt(p, deps, { mode, checkpoint: taken.checkpoint, place, previousStep, assigned });
  const { attempt, argv, checkpoint } = planned;
  place = planned.place;
  await writeFile(
    path.join(place?.stepDir ?? attempt.dir, 'environment.json'),
    `${JSON.stringify({ ...fp, preflight: verdict.seen, assignedGpus: assigned.map((g) => g.index), changes }, null, 2)}\n`,
  );

  // 5. Run and watch.
  const run = await runAndWatch(p, deps, { mode, planned, assigned });
  const { tracker } = run;
  const pr = tracker.progress;
  const lastCheckpoint = (await listCheckpoints(attempt.checkpoints)).at(-1) ?? null;
  const where = `${stepName === undefined ? '' : `step ${stepName} of `}attempt ${attempt.attempt} (${attempt.log})`;
  const stopped = judgeExit(p, run, { pr, where, seen: verdict.seen, assigned });
  if (stopped !== null) return stopped;
  await deps.saveGoodEnv(fp);
  if (place !== null) await markStepDone(place, { jobId: deps.jobId, argv, progress: pr });
  const result: TrainResult = {
    status: 'completed',
    attempt: attempt.attempt,
    attemptDir: attempt.dir,
    mode,
    checkpoint: mode === 'resume' ? (checkpoint ?? null) : null,
    lastCheckpoint,
    progress: pr,
    firstLoss: tracker.firstLoss,
    lastLoss: pr.loss,
    gpus: assigned.map((g) => g.index),
    durationMs: Date.now() - started,
    ...(stepName === undefined ? {} : { step: stepName }),
  };
  await deps.setStatus({ state: 'completed', finishedAt: new Date().toISOString() }, 'completed');
  log.info({ attempt: attempt.attempt, progress: pr }, 'training completed');
  return { kind: 'done', result };
}
