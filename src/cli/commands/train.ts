import type { Command } from 'commander';
import {
  AppError,
  formatTrainProgress,
  type EvalJobStatus,
  type TrainResult,
  type TrainStatus,
} from '../../shared/index.js';
import { parseGpuList } from '../../workers/index.js';
import {
  cancelEvalJobs,
  cancelTrainJobs,
  describeHiddenStatesAtQueue,
  evalJobAfter,
  EvalWorker,
  formatReport,
  queueTrainJob,
  trainPayloadOf,
  waitForEvalJob,
  waitForTrainJob,
  type EvalOutcomeSeen,
  type TrainOutcomeSeen,
} from '../../workers/index.js';
import { TrainWorker } from '../../workers/index.js';
import { armStopDeadline, exitInterrupted, onceSignalled, openRunContext, type RunContext } from '../run-context.js';
import { EVAL_CHECK_FAILED_EXIT, evalTokenizer } from './eval.js';

interface TrainOptions {
  config: string;
  fromScratch?: boolean;
  resume?: string | boolean;
  allowEnvChange?: boolean;
  cancel?: boolean;
  worker?: boolean;
  gpus?: string;
  json?: boolean;
}

/** A train status change as one line for people. */
export function trainStatusLine(s: TrainStatus): string {
  const at = `${s.attempt === null ? '' : ` attempt ${s.attempt}`}${s.chainStep === null ? '' : ` step ${s.chainStep}`}`;
  if (s.state === 'waiting') return `train${at}: waiting — ${s.waiting ?? ''}`;
  if (s.state === 'running') {
    const p = formatTrainProgress(s);
    return `train${at}: ${p === '' ? `running (${s.mode ?? ''}${s.gpus.length > 0 ? `, GPUs ${s.gpus.join(',')}` : ', CPU'})` : p}`;
  }
  return `train${at}: ${s.state}${s.reason === null ? '' : ` — ${s.reason}`}`;
}

/** A finished training for people: attempt, steps, loss first → last, checkpoint. */
export function formatTrainResult(r: TrainResult): string {
  if (r.status === 'skipped') return `train: skipped — ${r.reason ?? ''}`;
  const p = r.progress;
  const lines = [
    `train: completed, attempt ${r.attempt ?? '?'} (${r.mode}${r.checkpoint === null ? '' : ` from ${r.checkpoint}`}) on ${r.gpus.length === 0 ? 'CPU' : `GPU ${r.gpus.join(',')}`}`,
    `  steps        ${p?.step ?? '?'}${p?.total === null || p?.total === undefined ? '' : `/${p.total}`}${p?.stepsPerSec === null || p?.stepsPerSec === undefined ? '' : ` (${p.stepsPerSec.toFixed(2)} steps/s)`}`,
    `  loss         ${r.firstLoss === null ? '?' : r.firstLoss.toPrecision(5)} -> ${r.lastLoss === null ? '?' : r.lastLoss.toPrecision(5)}`,
    `  checkpoint   ${r.lastCheckpoint ?? '(none)'}`,
    `  folder       ${r.attemptDir ?? ''}`,
  ];
  return lines.join('\n');
}

/** An eval job's state change as one line for people. */
export function evalStatusLine(s: EvalJobStatus): string {
  const at = s.attempt === null ? '' : ` attempt ${s.attempt}`;
  if (s.state === 'waiting') return `eval${at}: waiting — ${s.waiting ?? ''}`;
  if (s.state === 'running') return `eval${at}: ${s.detail ?? 'running'}`;
  return `eval${at}: ${s.state}${s.reason === null ? '' : ` — ${s.reason}`}`;
}

/** A training and the eval that followed it (null when none follows: no `eval` section, or the training failed). */
export interface TrainJobOutcome {
  train: TrainOutcomeSeen;
  eval: EvalOutcomeSeen | null;
}

/** The train worker and the eval worker beside it, as `worker --role train` runs them. */
export async function startTrainWorkers(
  ctx: RunContext,
  gpus: readonly number[] | undefined,
): Promise<{ stop(): Promise<void> }> {
  const common = {
    redisUrl: ctx.redisUrl,
    keys: ctx.keys,
    ...(gpus === undefined ? {} : { gpus }),
    lockDurationMs: ctx.config.workers.lockDurationMs,
    stalledIntervalMs: ctx.config.workers.stalledIntervalMs,
  };
  const train = new TrainWorker(common);
  const evaluation = new EvalWorker({ ...common, config: ctx.config, loadTokenizer: evalTokenizer });
  await train.start();
  await evaluation.start();
  return {
    async stop() {
      // Both stop their commands and servers; neither waits for the other.
      await Promise.all([train.stop(), evaluation.stop()]);
    },
  };
}

/**
 * Waits for train job `jobId`, then for the eval job after it (when one follows and the training
 * completed), printing each status change to stderr; with `worker`, serves the train and eval
 * queues in this process meanwhile (a job is taken only if this machine can). Returns the
 * outcomes, or 'signalled'. Exported for `demo`.
 */
export async function runTrainJob(
  ctx: RunContext,
  jobId: string,
  options: { worker: boolean; gpus?: readonly number[]; quiet?: boolean },
): Promise<TrainJobOutcome | 'signalled'> {
  const workers = options.worker ? await startTrainWorkers(ctx, options.gpus) : undefined;
  const abort = new AbortController();
  const say = (line: string): void => {
    if (options.quiet !== true) process.stderr.write(`tokenmill: ${line}\n`);
  };
  const signalled = onceSignalled().then(() => 'signalled' as const);
  const stopWaiting = async (waiting: Promise<unknown>): Promise<'signalled'> => {
    // A stop is bounded even when Redis is gone: the longer grace (the command's, the servers', the workers') + 30 s.
    armStopDeadline(
      Math.max(
        ctx.config.workers.shutdownGraceMs,
        ctx.config.train?.cancelGraceMs ?? 0,
        ctx.config.eval?.server?.stopGraceMs ?? 0,
      ) + 30_000,
    );
    abort.abort();
    await waiting.catch(() => undefined);
    return 'signalled';
  };
  try {
    const waiting = waitForTrainJob(ctx.redis, ctx.keys, jobId, {
      signal: abort.signal,
      onStatus: (s) => say(trainStatusLine(s)),
    });
    const train = await Promise.race([waiting, signalled]);
    if (train === 'signalled') return await stopWaiting(waiting);
    const evalJob = train.status === 'completed' ? await evalJobAfter(ctx.redis, ctx.keys, jobId) : null;
    if (evalJob === null) return { train, eval: null };
    const evaluating = waitForEvalJob(ctx.redis, ctx.keys, evalJob, {
      signal: abort.signal,
      onStatus: (s) => say(evalStatusLine(s)),
    });
    const evaluation = await Promise.race([evaluating, signalled]);
    if (evaluation === 'signalled') return await stopWaiting(evaluating);
    return { train, eval: evaluation };
  } finally {
    await workers?.stop();
  }
}

/** The eval after a training for people: its table, or why it failed (with the table when it measured). */
export function formatEvalOutcome(e: EvalOutcomeSeen): string {
  if (e.status === 'completed' && e.result.status === 'skipped') return `eval: skipped — ${e.result.reason ?? ''}\n`;
  const table = e.report === null ? '' : formatReport(e.report);
  return e.status === 'failed' ? `${table}eval: failed — ${e.reason}\n` : table;
}

/** `train`: queue a training on what has been merged and wait for it; or cancel one. */
export function registerTrainCommand(program: Command): void {
  program
    .command('train')
    .description(
      'train on the merged training dataset with train.command: --from-scratch (a new attempt folder; earlier checkpoints are kept) ' +
        'or --resume [checkpoint] (default: the newest checkpoint of the latest attempt); without either, train.mode decides. Waits and prints progress. --cancel stops a running one',
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--from-scratch', 'start a new training run')
    .option('--resume [checkpoint]', 'continue from this checkpoint, or from the newest one of the latest attempt')
    .option('--allow-env-change', "start even if the environment differs from the last successful run's")
    .option(
      '--cancel',
      "cancel the run's unfinished train jobs (SIGTERM to the command's process group, SIGKILL after train.cancelGraceMs)",
    )
    .option('--no-worker', 'only queue the job and wait: train workers elsewhere run it')
    .option('--gpus <list>', "GPU indices this process's worker may use, e.g. 0,1, or all (default: all)")
    .option('--json', 'print the result as JSON')
    .action(async (opts: TrainOptions) => {
      const ctx = await openRunContext(opts.config);
      try {
        if (opts.cancel === true) {
          // Each kind cancels its own jobs: the trainings, then the evals after them.
          const done = [
            ...(await cancelTrainJobs(ctx.redis, ctx.keys)),
            ...(await cancelEvalJobs(ctx.redis, ctx.keys)),
          ];
          if (done.length === 0) process.stdout.write('no unfinished train job\n');
          for (const j of done)
            process.stdout.write(
              `${j.jobId} (${j.state}): ${j.action === 'removed' ? 'removed from the queue' : 'cancel sent to its worker'}\n`,
            );
          return;
        }
        if (opts.fromScratch === true && opts.resume !== undefined)
          throw new AppError('train: choose one of --from-scratch or --resume, not both');
        // The flag chooses; without one, train.mode does (required in the config: never a guess).
        const mode = opts.fromScratch === true ? 'from-scratch' : opts.resume !== undefined ? 'resume' : undefined;
        const payload = trainPayloadOf(ctx.config, ctx.runDir, {
          ...(mode === undefined ? {} : { mode }),
          ...(typeof opts.resume === 'string' ? { checkpoint: opts.resume } : {}),
          ...(opts.allowEnvChange === true ? { allowEnvChange: true } : {}),
          origin: 'cli',
        });
        const jobId = await queueTrainJob(ctx.redis, ctx.keys, payload);
        const chosenBy = mode === undefined ? 'train.mode' : opts.fromScratch === true ? '--from-scratch' : '--resume';
        process.stderr.write(
          `tokenmill: train job ${jobId} queued: ${payload.mode} (${chosenBy})${payload.checkpoint === undefined ? '' : ` from ${payload.checkpoint}`}\n`,
        );
        for (const line of await describeHiddenStatesAtQueue(payload)) process.stderr.write(`tokenmill: ${line}\n`);
        const gpus = opts.gpus === undefined ? undefined : parseGpuList(opts.gpus);
        const outcome = await runTrainJob(ctx, jobId, {
          worker: opts.worker !== false,
          ...(gpus === undefined ? {} : { gpus }),
        });
        if (outcome === 'signalled') {
          process.stderr.write(
            `tokenmill: stopped waiting; train job ${jobId} stays queued for train workers (cancel it with \`tokenmill train --cancel\`)\n`,
          );
          exitInterrupted();
          return;
        }
        const { train, eval: evaluation } = outcome;
        if (train.status === 'failed') throw new AppError(`train job ${jobId} failed: ${train.reason}`);
        process.stdout.write(
          opts.json === true
            ? `${JSON.stringify(evaluation === null ? train.result : { ...train.result, eval: evaluation.report })}\n`
            : `${formatTrainResult(train.result)}\n${evaluation === null ? '' : `\n${formatEvalOutcome(evaluation)}`}`,
        );
        if (evaluation?.status === 'failed') {
          // Below eval.minAcceptLength / minSpeedup: the report says why; anything else is an error.
          if (evaluation.report !== null && !evaluation.report.ok) process.exitCode = EVAL_CHECK_FAILED_EXIT;
          else
            throw new AppError(
              `train job ${jobId} completed (attempt ${train.result.attempt ?? '?'}), but its eval failed: ${evaluation.reason}`,
            );
        }
      } finally {
        await ctx.close();
      }
    });
}

/** `worker --role train [--gpus 0,1]`: serves the run's train and eval queues until a signal. */
export async function runTrainWorker(ctx: RunContext, gpus?: string): Promise<void> {
  const allowed = gpus === undefined ? undefined : parseGpuList(gpus);
  const signal = onceSignalled();
  const worker = await startTrainWorkers(ctx, allowed);
  process.stderr.write(
    `tokenmill: train worker ready (queues train and eval, GPUs ${allowed === undefined ? 'all' : allowed.join(',')}); stop it with SIGTERM\n`,
  );
  try {
    await signal;
  } finally {
    // The worker (a running command is stopped, its job failed or handed back), then the run's Redis (closed by the caller).
    await worker.stop();
  }
}
