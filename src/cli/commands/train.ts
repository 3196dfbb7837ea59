import type { Command } from 'commander';
import { AppError, formatTrainProgress, type TrainResult, type TrainStatus } from '../../shared/index.js';
import { parseGpuList } from '../../workers/index.js';
import {
  cancelTrainJobs,
  describeHiddenStatesAtQueue,
  queueTrainJob,
  trainPayloadOf,
  waitForTrainJob,
  type TrainOutcomeSeen,
} from '../../workers/index.js';
import { TrainWorker } from '../../workers/index.js';
import { armStopDeadline, exitInterrupted, onceSignalled, openRunContext, type RunContext } from '../run-context.js';

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

/**
 * Waits for train job `jobId`, printing each status change to stderr; with `worker`, serves the
 * train queue in this process meanwhile (it takes the job only if this machine can). Returns
 * the outcome, or 'signalled'. Exported for `demo`.
 */
export async function runTrainJob(
  ctx: RunContext,
  jobId: string,
  options: { worker: boolean; gpus?: readonly number[]; quiet?: boolean },
): Promise<TrainOutcomeSeen | 'signalled'> {
  let worker: TrainWorker | undefined;
  if (options.worker) {
    worker = new TrainWorker({
      redisUrl: ctx.redisUrl,
      keys: ctx.keys,
      ...(options.gpus === undefined ? {} : { gpus: options.gpus }),
      lockDurationMs: ctx.config.workers.lockDurationMs,
      stalledIntervalMs: ctx.config.workers.stalledIntervalMs,
    });
    await worker.start();
  }
  const abort = new AbortController();
  try {
    const waiting = waitForTrainJob(ctx.redis, ctx.keys, jobId, {
      signal: abort.signal,
      onStatus: (s) => {
        if (options.quiet !== true) process.stderr.write(`tokenmill: ${trainStatusLine(s)}\n`);
      },
    });
    const outcome = await Promise.race([waiting, onceSignalled().then(() => 'signalled' as const)]);
    if (outcome === 'signalled') {
      // A stop is bounded even when Redis is gone: the longer grace (the command's, the workers') + 30 s.
      armStopDeadline(Math.max(ctx.config.workers.shutdownGraceMs, ctx.config.train?.cancelGraceMs ?? 0) + 30_000);
      abort.abort();
      await waiting.catch(() => undefined);
    }
    return outcome;
  } finally {
    await worker?.stop();
  }
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
          const done = await cancelTrainJobs(ctx.redis, ctx.keys);
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
        if (outcome.status === 'failed') throw new AppError(`train job ${jobId} failed: ${outcome.reason}`);
        process.stdout.write(
          opts.json === true ? `${JSON.stringify(outcome.result)}\n` : `${formatTrainResult(outcome.result)}\n`,
        );
      } finally {
        await ctx.close();
      }
    });
}

/** `worker --role train [--gpus 0,1]`: serves the run's train queue until a signal. */
export async function runTrainWorker(ctx: RunContext, gpus?: string): Promise<void> {
  const allowed = gpus === undefined ? undefined : parseGpuList(gpus);
  const worker = new TrainWorker({
    redisUrl: ctx.redisUrl,
    keys: ctx.keys,
    ...(allowed === undefined ? {} : { gpus: allowed }),
    lockDurationMs: ctx.config.workers.lockDurationMs,
    stalledIntervalMs: ctx.config.workers.stalledIntervalMs,
  });
  const signal = onceSignalled();
  await worker.start();
  process.stderr.write(
    `tokenmill: train worker ready (queue train, GPUs ${allowed === undefined ? 'all' : allowed.join(',')}); stop it with SIGTERM\n`,
  );
  try {
    await signal;
  } finally {
    // The worker (a running command is stopped, its job failed or handed back), then the run's Redis (closed by the caller).
    await worker.stop();
  }
}
