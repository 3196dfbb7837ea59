import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { TrainPayloadSchema, parsePayload, type TrainPayload, type TrainResult } from '../../shared/index.js';
import { runGpuJob, type GpuJobPhases, type Next, type StopSignal, type Watched } from '../gpu/index.js';
import { listCheckpoints } from './attempts.js';
import { doneInfo, markStepDone, placeChainStep, type ChainStepPlace } from './chain.js';
import { groupIndices, planAttempt, type PlannedAttempt } from './attempt-plan.js';
import { TrainCancelledError } from './cancelled.js';
import { judgeExit } from './command-exit.js';
import { takeOverDeadRun } from './dead-worker.js';
import { checkEnvironment } from './environment-check.js';
import type { EnvFingerprint } from './fingerprint.js';
import { checkStart, type StartCheck } from './start-checks.js';
import type { TrainDeps, TrainOutcome } from './train-deps.js';
import { runAndWatch, type WatchedRun } from './watch-command.js';

export { TrainCancelledError } from './cancelled.js';
export type { PreviousRun, TrainDeps, TrainOutcome } from './train-deps.js';

/**
 * Runs one train job: worker-death check, the hidden states a chain step writes sized against
 * its disk (refuse what can never fit, wait for free space), GPU preflight (wait when memory is short),
 * environment fingerprint (refuse a change unless allowed), a new attempt folder, then the
 * command in its own process group, watched (progress, OOM, cancel) until it exits.
 */
export async function processTrain(data: unknown, deps: TrainDeps): Promise<TrainOutcome> {
  return runGpuJob(deps, new TrainJob(parsePayload(TrainPayloadSchema, data, 'train'), deps));
}

/** How the job runs, once a dead worker's run of it is taken over: its mode, checkpoint and chain step. */
interface Prepared {
  mode: TrainPayload['mode'];
  checkpoint: TrainPayload['checkpoint'];
  place: ChainStepPlace | null;
  previousStep: { attemptDir: string | null } | null;
}

/** What preflight chose: the GPUs, the environment, the attempt. */
interface Ready {
  mode: TrainPayload['mode'];
  start: Extract<StartCheck, { kind: 'start' }>;
  fp: EnvFingerprint;
  planned: PlannedAttempt;
}

/** The phases of one train job (see {@link processTrain}). */
class TrainJob implements GpuJobPhases<Prepared, Ready, WatchedRun, TrainResult> {
  private readonly started = Date.now();
  private readonly index: number;
  private readonly stepName: string | undefined;

  constructor(
    private readonly p: TrainPayload,
    private readonly deps: TrainDeps,
  ) {
    this.index = p.stepIndex ?? 0;
    this.stepName = p.steps?.[this.index]?.name;
  }

  cancelled(message: string): Error {
    return new TrainCancelledError(message);
  }

  /** Nothing new to train on; a worker that ran this job before and is gone; a chain step already done. */
  async prepare(): Promise<Next<Prepared, TrainResult>> {
    const { p, deps, index, stepName } = this;
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
      return this.done('skipped', reason);
    }
    const previousStep =
      index > 0 ? { attemptDir: typeof child?.attemptDir === 'string' ? child.attemptDir : null } : null;
    if (stepName !== undefined)
      await deps.setStatus({ chainStep: `${stepName} (${index + 1}/${p.steps?.length ?? 1})` });
    const { mode, checkpoint } = await takeOverDeadRun(p, deps, stepName);
    // A chain step: where it runs; a step finished in an earlier run is not redone.
    let place: ChainStepPlace | null = null;
    if (p.steps !== undefined && (index > 0 || mode === 'resume')) {
      place = await placeChainStep({ ...p, mode }, previousStep, deps.jobId);
      if (place.done) {
        const reason = `step ${stepName ?? ''} finished in an earlier run of attempt ${place.attempt} (${await doneInfo(place)}); not redone`;
        deps.jobLog(reason);
        return this.done('completed', reason, place.attemptDir);
      }
    }
    return { kind: 'go', value: { mode, checkpoint, place, previousStep } };
  }

  /**
   * The hidden states a chain step writes fit its disk (sized first, so a step that can never fit
   * fails at once), enough GPUs with enough free memory and enough free disk, or wait; then the
   * environment against the last good run's, and a new attempt folder (earlier ones are never touched).
   */
  async preflight(prep: Prepared): Promise<Next<Ready, TrainResult>> {
    const { p, deps } = this;
    const { mode, place } = prep;
    const start = await checkStart(p, deps, { mode, stepName: this.stepName, place });
    if (start.kind === 'wait') return start;
    const { fp, changes } = await checkEnvironment(p, deps, start);
    const assigned = start.verdict.assigned;
    const groups = start.verdict.groups;
    const planned = await planAttempt(p, deps, { ...prep, assigned, groups });
    const gpuGroups = groupIndices(groups);
    await writeFile(
      path.join(planned.place?.stepDir ?? planned.attempt.dir, 'environment.json'),
      `${JSON.stringify({ ...fp, preflight: start.verdict.seen, assignedGpus: assigned.map((g) => g.index), ...(gpuGroups === null ? {} : { gpuGroups }), changes }, null, 2)}\n`,
    );
    return { kind: 'go', value: { mode, start, fp, planned } };
  }

  /** The command in its own process group, until it exits. */
  run(ready: Ready, stop: StopSignal): Promise<WatchedRun> {
    return runAndWatch(
      this.p,
      this.deps,
      {
        mode: ready.mode,
        planned: ready.planned,
        assigned: ready.start.verdict.assigned,
        groups: groupIndices(ready.start.verdict.groups),
      },
      stop,
    );
  }

  /** Cancelled, stopped, out of memory or failed (thrown, or handed back); else completed. */
  async finish(ready: Ready, watched: Watched<WatchedRun>): Promise<TrainOutcome> {
    if (!watched.ok) throw watched.error;
    const { p, deps, stepName } = this;
    const { mode, planned, start } = ready;
    const { attempt, argv, checkpoint, place } = planned;
    const { tracker } = watched.value;
    const pr = tracker.progress;
    const assigned = start.verdict.assigned;
    const lastCheckpoint = (await listCheckpoints(attempt.checkpoints)).at(-1) ?? null;
    const where = `${stepName === undefined ? '' : `step ${stepName} of `}attempt ${attempt.attempt} (${attempt.log})`;
    const stopped = judgeExit(p, watched.value, { pr, where, seen: start.verdict.seen, assigned });
    if (stopped !== null) return stopped;
    await deps.saveGoodEnv(ready.fp);
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
      durationMs: Date.now() - this.started,
      ...(stepName === undefined ? {} : { step: stepName }),
    };
    await deps.setStatus({ state: 'completed', finishedAt: new Date().toISOString() }, 'completed');
    deps.logger.info({ attempt: attempt.attempt, progress: pr }, 'training completed');
    return { kind: 'done', result };
  }

  /** A job that ran nothing: skipped, or a chain step completed in an earlier run. */
  private done(status: 'skipped' | 'completed', reason: string, attemptDir: string | null = null): TrainOutcome {
    const stepName = this.stepName;
    return {
      kind: 'done',
      result: {
        status,
        attempt: attemptDir === null ? null : path.basename(attemptDir),
        attemptDir,
        mode: this.p.mode,
        checkpoint: null,
        lastCheckpoint: null,
        progress: null,
        firstLoss: null,
        lastLoss: null,
        gpus: [],
        durationMs: Date.now() - this.started,
        reason,
        ...(stepName === undefined ? {} : { step: stepName }),
      },
    };
  }
}
