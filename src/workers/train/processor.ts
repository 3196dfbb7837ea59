import { writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';
import {
  AppError,
  CancelledError,
  TrainPayloadSchema,
  formatInt,
  parsePayload,
  type Logger,
  type TrainPayload,
  type TrainProgress,
  type TrainHiddenStates,
  type TrainResult,
  type TrainState,
} from '../../shared/index.js';
import { createAttempt, listCheckpoints, resolveResumeCheckpoint, trainDir } from './attempts.js';
import { doneInfo, freeDiskGiB, markStepDone, placeChainStep, withStepOutputs, type ChainStepPlace } from './chain.js';
import { buildArgv } from './command.js';
import { collectFingerprint, fingerprintChanges, type EnvFingerprint } from './fingerprint.js';
import type { GpuInfo, GpuProbe } from './gpus.js';
import { checkHiddenStates } from './hidden-states.js';
import { preflight } from './preflight.js';
import { ProgressTracker, isCudaOom } from './progress.js';
import { killLeftGroup, recordedIdentity } from './left-groups.js';
import { groupAlive, runCommand } from './run-command.js';

/** This job's earlier record, when a worker already ran it (it died, or was stopped). */
export interface PreviousRun {
  state: TrainState;
  worker: string | null;
  host: string | null;
  pid: number | null;
  /** Its command's leader as recorded with the pid (see left-groups.ts); null when none was. */
  pidIdentity: string | null;
  attempt: string | null;
}

/** What the train processor needs from its worker: Redis, BullMQ and the machine, as functions. */
export interface TrainDeps {
  jobId: string;
  workerId: string;
  /** GPU indices this worker may use (`--gpus`); all when omitted. */
  allowedGpus?: readonly number[];
  probeGpus(): Promise<GpuProbe>;
  /** Writes fields of the run's train status (and the `train` phase when `phase` is given). */
  setStatus(
    fields: Record<string, string | number>,
    phase?: 'pending' | 'in_progress' | 'completed' | 'failed',
  ): Promise<void>;
  previousRun(): Promise<PreviousRun | null>;
  lastGoodEnv(): Promise<EnvFingerprint | null>;
  saveGoodEnv(fp: EnvFingerprint): Promise<void>;
  isCancelled(): Promise<boolean>;
  /** Appends a line to the job's log in Bull Board (the caller bounds it). */
  jobLog(line: string): void;
  reportProgress(p: TrainProgress): Promise<void>;
  /** Records a chain step's hidden-state estimate (shown by `status`, the page and /metrics). */
  recordHiddenStates(entry: TrainHiddenStates): Promise<void>;
  /** The return value of the job's child: a round's merge, or a chain's previous step. */
  childResult(): Promise<unknown>;
  /** Aborted when the worker stops (SIGTERM): the command is stopped too. */
  shutdown: AbortSignal;
  logger: Logger;
  /** How often the cancel flag is read while the command runs (ms). Default 500. */
  cancelPollMs?: number;
}

/** The processor's outcome: finished (result), or not yet startable (wait and try again). */
export type TrainOutcome =
  { kind: 'done'; result: TrainResult } | { kind: 'wait'; reason: string } | { kind: 'requeue'; reason: string };

/** The job was cancelled (`tokenmill train --cancel`). Never retried. */
export class TrainCancelledError extends AppError {
  constructor(message: string) {
    super(message, { retryable: false });
  }
}

/** `GPU 0 (NVIDIA H200): 21,000 of 143,771 MiB free` for each GPU preflight saw. */
function describeSeen(seen: readonly GpuInfo[], assigned: readonly GpuInfo[], need: number): string {
  const list = (assigned.length > 0 ? assigned : seen).map(
    (g) => `GPU ${g.index} (${g.name}): ${formatInt(g.freeMiB)} of ${formatInt(g.totalMiB)} MiB free`,
  );
  return list.length === 0 ? 'no GPU' : `${list.join('; ')} (${formatInt(need)} MiB needed)`;
}

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

  // 2. Preflight: enough GPUs with enough free memory, or wait.
  const probe = await deps.probeGpus();
  const verdict = preflight({ gpus: p.gpus, minFreeGpuMemMiB: p.minFreeGpuMemMiB }, probe, deps.allowedGpus);
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
  const assigned = verdict.assigned;
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

  // 3. Environment fingerprint against the last good run's.
  const fp = await collectFingerprint({
    command: p.command,
    ...(p.python === undefined ? {} : { python: p.python }),
    cwd: p.cwd,
    gpus: assigned,
    driver: verdict.seen[0]?.driver ?? probe.gpus[0]?.driver ?? null,
  });
  const lastGood = await deps.lastGoodEnv();
  const changes = lastGood === null ? [] : fingerprintChanges(lastGood, fp);
  await deps.setStatus({
    fingerprint: JSON.stringify(fp),
    envChanges: JSON.stringify(changes),
    preflight: seenJson,
    waiting: '',
  });
  if (changes.length > 0) {
    if (!p.allowEnvChange) {
      throw new AppError(
        `the trainer environment changed since the last successful train run: ${changes.join('; ')}. ` +
          'Training a run on another stack is how a run dies (e.g. of out-of-memory) hours in; set train.allowEnvChange: true or pass --allow-env-change to start anyway',
      );
    }
    deps.jobLog(`environment changed (allowed): ${changes.join('; ')}`);
    log.warn({ changes }, 'the trainer environment changed since the last successful run (allowed)');
  }

  // 4. What to run, then a new attempt folder (earlier ones are never touched).
  let attempt: { attempt: string; dir: string; checkpoints: string; log: string };
  let argv: string[];
  if (p.steps !== undefined) {
    // A chain step reruns whole: it has no checkpoint of its own to resume.
    place ??= await placeChainStep({ ...p, mode }, previousStep, deps.jobId);
    attempt = { attempt: place.attempt, dir: place.attemptDir, checkpoints: place.output, log: place.log };
    argv = withStepOutputs(
      buildArgv(p.command, [], {
        dataset: p.dataset,
        output: place.output,
        checkpoint: null,
        gpus: assigned.map((g) => g.index),
      }),
      p,
      place.attemptDir,
    );
    checkpoint = undefined;
  } else {
    if (mode === 'resume') checkpoint = await resolveResumeCheckpoint(p.runDir, checkpoint);
    const argvOf = (output: string): string[] =>
      buildArgv(p.command, p.resumeArgs, {
        dataset: p.dataset,
        output,
        checkpoint: mode === 'resume' ? (checkpoint ?? null) : null,
        gpus: assigned.map((g) => g.index),
      });
    argvOf(''); // refuse a resume without {checkpoint} before an attempt folder is made
    attempt = await createAttempt(p.runDir, {
      jobId: deps.jobId,
      mode,
      resumedFrom: mode === 'resume' ? (checkpoint ?? null) : null,
    });
    argv = argvOf(attempt.checkpoints);
  }
  await writeFile(
    path.join(place?.stepDir ?? attempt.dir, 'environment.json'),
    `${JSON.stringify({ ...fp, preflight: verdict.seen, assignedGpus: assigned.map((g) => g.index), changes }, null, 2)}\n`,
  );

  // 5. Run and watch.
  const tracker =
    p.progressRegex === undefined ? new ProgressTracker() : new ProgressTracker(new RegExp(p.progressRegex));
  let oomLine: string | null = null;
  const lastLines: string[] = [];
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
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    CUDA_VISIBLE_DEVICES: assigned.map((g) => g.index).join(','),
    PYTHONUNBUFFERED: '1',
    TOKENMILL_TRAIN_DATASET: p.dataset,
    TOKENMILL_TRAIN_OUTPUT: attempt.checkpoints,
    TOKENMILL_TRAIN_ATTEMPT: attempt.attempt,
    ...(mode === 'resume' && checkpoint !== undefined ? { TOKENMILL_TRAIN_CHECKPOINT: checkpoint } : {}),
  };
  deps.jobLog(
    `attempt ${attempt.attempt} (${mode}${mode === 'resume' ? ` from ${checkpoint ?? ''}` : ''}) on ${assigned.length === 0 ? 'CPU' : `GPU ${assigned.map((g) => g.index).join(',')}`}: ${argv.join(' ')}`,
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
      startedAt: new Date().toISOString(),
      reason: '',
    },
    'in_progress',
  );
  log.info(
    { attempt: attempt.attempt, mode, argv, gpus: assigned.map((g) => g.index), pid: running.pid },
    'training started',
  );

  let stopping: 'cancel' | 'shutdown' | null = null;
  const onShutdown = (): void => {
    stopping ??= 'shutdown';
    void running.stop(p.cancelGraceMs);
  };
  deps.shutdown.addEventListener('abort', onShutdown, { once: true });
  if (deps.shutdown.aborted) onShutdown();
  const poll = setInterval(() => {
    if (stopping !== null) return;
    void deps.isCancelled().then(
      (c) => {
        if (c && stopping === null) {
          stopping = 'cancel';
          deps.jobLog(`cancelled: SIGTERM to the process group, SIGKILL after ${p.cancelGraceMs} ms`);
          void running.stop(p.cancelGraceMs);
        }
      },
      () => undefined,
    );
  }, deps.cancelPollMs ?? 500);
  let exit;
  try {
    exit = await running.exited;
  } finally {
    clearInterval(poll);
    deps.shutdown.removeEventListener('abort', onShutdown);
  }
  report(true);
  await reporting;
  const pr = tracker.progress;
  const lastCheckpoint = (await listCheckpoints(attempt.checkpoints)).at(-1) ?? null;
  const where = `${stepName === undefined ? '' : `step ${stepName} of `}attempt ${attempt.attempt} (${attempt.log})`;
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
      `CUDA out of memory in ${where}: "${oomLine}"; free memory at preflight: ${describeSeen(verdict.seen, assigned, p.minFreeGpuMemMiB)}`,
    );
  }
  if (exit.spawnError !== null || exit.code !== 0) {
    const tail = lastLines
      .filter((l) => l.trim() !== '')
      .slice(-3)
      .join(' | ');
    throw new AppError(`the training command failed (${how}) in ${where}${tail === '' ? '' : `: ${tail}`}`);
  }
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

/** Whether an error means "cancelled" (for the status' state). */
export function isCancel(e: unknown): boolean {
  return e instanceof TrainCancelledError || e instanceof CancelledError;
}
