import type { Command } from 'commander';
import {
  AppError,
  autoConcurrencyOf,
  formatRunStatus,
  logger,
  readRunStatus,
  redactRedisUrl,
  StallWatchdog,
  WorkerHeartbeat,
} from '../../shared/index.js';
import { postprocessOptions } from '../../shared/index.js';
import type { RoundOutcome } from '../../workers/index.js';
import { PostprocessWorker } from '../../workers/index.js';
import { startGeneration, startPostprocess, type GenerationOptions } from '../pipeline.js';
import { startProgress } from '../progress.js';
import { watchRedisOutage } from '../redis-outage.js';
import { smallMaxmemoryWarning } from '../redis-memory.js';
import { armStopDeadline, exitInterrupted, onceSignalled, openRunContext, type RunContext } from '../run-context.js';
import type { SinkCrashPoint } from '../../producers/index.js';
import { dropContextOf } from '../drop-summary.js';
import { formatPostprocessResult, runPostprocess, throwIfFailed } from './postprocess.js';
import { runTrainWorker } from './train.js';
import { startFresh } from './prepare.js';

interface RunOptions {
  config: string;
  json?: boolean;
  crashAt?: SinkCrashPoint;
}

/**
 * Runs generation parts until they finish or a signal arrives; prints the final status.
 * Exported for `demo`.
 */
export async function runGeneration(
  ctx: RunContext,
  options: GenerationOptions & { json?: boolean; quiet?: boolean; progressMs?: number },
): Promise<'finished' | 'signalled'> {
  const handle = await startGeneration(ctx, options);
  void smallMaxmemoryWarning(
    ctx.redis,
    ctx.keys,
    ctx.config.datasets.map((d) => d.name),
  ).then((w) => {
    if (w !== undefined) process.stderr.write(`tokenmill: warning: ${w}\n`);
  });
  const signal = onceSignalled();
  // A Redis that goes away mid-run is said in a line a person reads, not only in JSON logs.
  const stopOutageWatch = watchRedisOutage(ctx.redisUrl, {
    waiting:
      ctx.config.redis.sentinels !== undefined
        ? 'generation waits for the Sentinels to name a primary'
        : ctx.config.redis.url === undefined
          ? 'the embedded server is restarted on its AOF; generation waits'
          : 'generation waits for it to come back',
  });
  const stopProgress = options.progressMs === undefined ? () => undefined : startProgress(ctx, options.progressMs);
  // The producer's process always exists while generating: it watches for a run that silently sits.
  const watchdog = options.produce ? stallWatchdog(ctx) : undefined;
  watchdog?.start();
  let outcome: 'finished' | 'signalled';
  const graceMs = ctx.config.workers.shutdownGraceMs;
  try {
    outcome = await Promise.race([
      handle.finished.then(() => 'finished' as const),
      signal.then(() => 'signalled' as const),
    ]);
    if (outcome === 'signalled') {
      // Unfinished: a non-zero exit (143 / 130), and a bound on the whole stop even when Redis is gone.
      // A worker alone (`worker --role inference`) has nothing to finish: SIGTERM is how it ends, exit 0.
      if (options.produce) exitInterrupted();
      armStopDeadline(graceMs + STOP_MARGIN_MS);
      process.stderr.write(
        `tokenmill: ${await signal}: stopping; requests in flight get up to ${Math.round(graceMs / 1000)} s, then are aborted and handed back (exits within ${Math.round((graceMs + STOP_MARGIN_MS) / 1000)} s)\n`,
      );
    }
  } finally {
    await watchdog?.stop();
    await stopOutageWatch();
    stopProgress();
    await stopWithin(handle, graceMs + STOP_MARGIN_MS - CLOSE_RESERVE_MS);
  }
  if (options.quiet !== true) await printFinalStatus(ctx, options.json === true);
  return outcome;
}

/** Of the stop's bound, what is kept for closing Redis and printing the status (ms). */
const CLOSE_RESERVE_MS = 5_000;
/** How long the final status may take to read before it is left out (Redis gone). */
const FINAL_STATUS_TIMEOUT_MS = 3_000;

/** The run's status table (or JSON); one line instead when Redis does not answer in time. */
async function printFinalStatus(ctx: RunContext, json: boolean): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((resolve) => {
    timer = setTimeout(() => resolve('late'), FINAL_STATUS_TIMEOUT_MS);
  });
  try {
    const status = await Promise.race([readRunStatus(ctx.redis, ctx.keys, ctx.config), late]);
    if (status === 'late') {
      process.stderr.write(
        `tokenmill: no final status: Redis at ${redactRedisUrl(ctx.redisUrl)} did not answer within ${FINAL_STATUS_TIMEOUT_MS / 1000} s\n`,
      );
      return;
    }
    process.stdout.write(json ? `${JSON.stringify(status)}\n` : `${formatRunStatus(status)}\n`);
  } finally {
    clearTimeout(timer);
  }
}

/** Beyond the grace period, how long a stop may take before it is abandoned (ms). */
const STOP_MARGIN_MS = 30_000;

/**
 * Stops the generation parts, but never waits forever: a stop that outlives `limitMs` is
 * abandoned with an error, so the process still closes Redis (an embedded server stops with
 * it) and exits; whatever it held returns to the queue by lease and lock expiry.
 */
async function stopWithin(handle: { stop(): Promise<void> }, limitMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<'late'>((resolve) => {
    timer = setTimeout(() => resolve('late'), limitMs);
  });
  try {
    if ((await Promise.race([handle.stop().then(() => 'stopped' as const), deadline])) === 'late') {
      logger('generation').error({ limitMs }, 'stopping took too long; leaving the rest to lease and lock expiry');
      // Non-zero either way: 143 / 130 of an interrupted run stay, anything else becomes 1.
      if (process.exitCode === undefined || process.exitCode === 0) process.exitCode = 1;
    }
  } finally {
    clearTimeout(timer);
  }
}

function stallWatchdog(ctx: RunContext): StallWatchdog {
  const { config } = ctx;
  return new StallWatchdog({
    redis: ctx.redis,
    keys: ctx.keys,
    datasets: config.datasets.filter((d) => d.prompts !== undefined).map((d) => d.name),
    endpoints: config.sglang.endpoints,
    // With "auto", the least it can be: a dataset is never called stuck for slots that may not exist.
    concurrencyPerEndpoint:
      config.sglang.concurrency === 'auto' ? autoConcurrencyOf(config.sglang).min : config.sglang.concurrency,
    stallAfterMs: config.workers.stallAfterMs,
  });
}

async function withRun<T>(configPath: string, fn: (ctx: RunContext) => Promise<T>): Promise<T> {
  const ctx = await openRunContext(configPath);
  try {
    return await fn(ctx);
  } finally {
    await ctx.close();
  }
}

/** `run`, `produce` and `worker`: the generation stage, in one process or spread out. */
export function registerGenerationCommands(program: Command): void {
  program
    .command('run')
    .description(
      "run the whole pipeline in this process (the datasets' sources prepared into prompt files, producer, inference worker, results sinks) until every dataset is completed, then tokenize and merge into the training dataset",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print the final status as JSON')
    .option(
      '--fresh',
      'start the run over: delete its Redis state and the files in <output.dir>/<run> (generations included) first',
    )
    .addOption(hiddenCrashOption(program))
    .action(async (opts: RunOptions & { fresh?: boolean }) => {
      await withRun(opts.config, async (ctx) => {
        if (opts.fresh === true) await startFresh(ctx);
        await runPipeline(ctx, {
          progressMs: 10_000,
          ...(opts.crashAt === undefined ? {} : { crashAt: opts.crashAt }),
          ...(opts.json === undefined ? {} : { json: opts.json }),
        });
      });
    });

  program
    .command('produce')
    .description(
      'feed the dataset queues from the prompt files and write results to disk until every dataset is completed (run workers elsewhere), then queue the post-process round for postprocess workers',
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print the final status as JSON')
    .addOption(hiddenCrashOption(program))
    .action(async (opts: RunOptions) => {
      await withRun(opts.config, async (ctx) => {
        const outcome = await runGeneration(ctx, {
          produce: true,
          infer: false,
          ...(opts.crashAt === undefined ? {} : { crashAt: opts.crashAt }),
          ...(opts.json === undefined ? {} : { json: opts.json }),
        });
        if (outcome !== 'finished') return;
        await failIfDatasetsStopped(ctx);
        // Generation is complete: queue the post-process round for the post-processing workers.
        const pp = await startPostprocess(ctx, { worker: false, wait: false });
        await pp.stop();
        process.stderr.write(
          `tokenmill: post-processing ${pp.round.flowId} queued for \`worker --role postprocess\`\n`,
        );
      });
    });

  program
    .command('worker')
    .description(
      'run a worker until SIGTERM: inference (calls SGLang for queued prompts) or postprocess (tokenize and merge rounds); start any number, on any machine',
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--role <role>', 'inference | postprocess | train', 'inference')
    .option(
      '--gpus <list>',
      'train role: GPU indices this worker may use, e.g. 0,1 (default: all that nvidia-smi lists)',
    )
    .action(async (opts: { config: string; role: string; gpus?: string }) => {
      if (opts.role === 'train') {
        await withRun(opts.config, (ctx) => runTrainWorker(ctx, opts.gpus));
        return;
      }
      if (opts.role === 'postprocess') {
        await withRun(opts.config, runPostprocessWorker);
        return;
      }
      if (opts.role !== 'inference')
        throw new AppError(`worker --role ${opts.role}: expected inference, postprocess or train`);
      await withRun(opts.config, (ctx) => runGeneration(ctx, { produce: false, infer: true, quiet: true }));
    });
}

/** `worker --role postprocess`: serves the run's tokenize and merge queues until a signal. */
async function runPostprocessWorker(ctx: RunContext): Promise<void> {
  const worker = new PostprocessWorker({ ...postprocessOptions(ctx.config), redisUrl: ctx.redisUrl, keys: ctx.keys });
  const signal = onceSignalled();
  const heartbeat = new WorkerHeartbeat({ redis: ctx.redis, keys: ctx.keys, role: 'postprocess' });
  await worker.start();
  await heartbeat.start();
  process.stderr.write('tokenmill: post-processing worker ready (queues tokenize, merge); stop it with SIGTERM\n');
  try {
    await signal;
  } finally {
    // The worker (its running jobs finish), its heartbeat, then the run's Redis (closed by the caller).
    await worker.stop();
    await heartbeat.stop();
  }
}

/**
 * Prints the run's status (table, or one JSON object with the post-process result under
 * `postprocess`), then the post-process round's report. Exported for `demo`.
 */
export async function printRunSummary(
  ctx: RunContext,
  options: { json?: boolean; postprocess?: RoundOutcome | 'signalled'; extra?: Record<string, unknown> },
): Promise<void> {
  const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
  const pp = options.postprocess === 'signalled' ? undefined : options.postprocess;
  if (options.json === true) {
    const postprocess =
      pp === undefined
        ? {}
        : {
            postprocess:
              pp.status === 'completed' ? pp.result : { status: 'failed', flowId: pp.flowId, reason: pp.reason },
          };
    process.stdout.write(`${JSON.stringify({ ...status, ...postprocess, ...options.extra })}\n`);
    return;
  }
  process.stdout.write(`${formatRunStatus(status)}\n`);
  if (pp?.status === 'completed')
    process.stdout.write(`\n${formatPostprocessResult(pp.result, dropContextOf(ctx.config))}\n`);
}

/**
 * `run`: generation until every dataset is completed, then a post-process round (tokenize +
 * merge) served in this process; prints the status and the validation report. A failed round
 * fails the command with its reason. Exported for `demo`.
 */
export async function runPipeline(
  ctx: RunContext,
  options: { json?: boolean; crashAt?: SinkCrashPoint; progressMs?: number },
): Promise<'completed' | 'signalled'> {
  const { generation, postprocess } = await runPipelineStages(ctx, options);
  await printRunSummary(ctx, {
    ...(options.json === undefined ? {} : { json: options.json }),
    ...(postprocess === undefined ? {} : { postprocess }),
  });
  if (postprocess !== undefined) throwIfFailed(postprocess);
  if (generation === 'finished') await failIfDatasetsStopped(ctx);
  return generation === 'finished' && postprocess !== 'signalled' ? 'completed' : 'signalled';
}

/**
 * A dataset the producer stopped for want of progress is work unfinished: the command says so
 * and exits 1 (docs/design.md, invariant 11), after the other datasets were post-processed.
 */
async function failIfDatasetsStopped(ctx: RunContext): Promise<void> {
  const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
  const stopped = status.datasets.filter((d) => d.status === 'failed');
  for (const d of stopped) process.stderr.write(`tokenmill: dataset ${d.name} ${d.failedReason ?? 'stopped'}\n`);
  if (stopped.length > 0 && (process.exitCode === undefined || process.exitCode === 0)) process.exitCode = 1;
}

/**
 * {@link runPipeline} without its summary: generation, then the post-process round when it
 * finished (undefined when it was stopped). Exported for `demo`, which prints its summary after
 * its train stage.
 */
export async function runPipelineStages(
  ctx: RunContext,
  options: { crashAt?: SinkCrashPoint; progressMs?: number },
): Promise<{ generation: 'finished' | 'signalled'; postprocess?: RoundOutcome | 'signalled' }> {
  const generation = await runGeneration(ctx, {
    produce: true,
    infer: true,
    quiet: true,
    ...(options.crashAt === undefined ? {} : { crashAt: options.crashAt }),
    ...(options.progressMs === undefined ? {} : { progressMs: options.progressMs }),
  });
  const postprocess = generation === 'finished' ? await runPostprocess(ctx) : undefined;
  if (postprocess === 'signalled') {
    // Stopped mid-round: unfinished, so a non-zero exit; the round stays queued for the next `run`.
    exitInterrupted();
    armStopDeadline(ctx.config.workers.shutdownGraceMs + STOP_MARGIN_MS);
    process.stderr.write(
      'tokenmill: interrupted during post-processing; the round stays queued and the next `run` or `postprocess` joins it\n',
    );
  }
  return { generation, ...(postprocess === undefined ? {} : { postprocess }) };
}

function hiddenCrashOption(program: Command) {
  return program
    .createOption('--crash-at <point>', 'test hook: kill this process at a sink step')
    .choices(['after-write', 'after-checkpoint'])
    .hideHelp();
}
