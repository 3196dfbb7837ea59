import type { Command } from 'commander';
import { AppError, formatRunStatus, readRunStatus } from '../../shared/index.js';
import { startGeneration, type GenerationOptions } from '../pipeline.js';
import { onceSignalled, openRunContext, type RunContext } from '../run-context.js';
import type { SinkCrashPoint } from '../../producers/results-sink.js';

interface RunOptions {
  config: string;
  json?: boolean;
  crashAt?: SinkCrashPoint;
}

/**
 * Runs generation parts until they finish or a signal arrives; prints the final status.
 * Exported for `demo`.
 */
export async function runGeneration(ctx: RunContext, options: GenerationOptions & { json?: boolean; quiet?: boolean }): Promise<'finished' | 'signalled'> {
  const handle = await startGeneration(ctx, options);
  const signal = onceSignalled();
  let outcome: 'finished' | 'signalled';
  try {
    outcome = await Promise.race([handle.finished.then(() => 'finished' as const), signal.then(() => 'signalled' as const)]);
  } finally {
    await handle.stop();
  }
  if (options.quiet !== true) {
    const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
    process.stdout.write(options.json === true ? `${JSON.stringify(status)}\n` : `${formatRunStatus(status)}\n`);
  }
  return outcome;
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
    .description('run the whole generation pipeline in this process (producer, inference worker, results sink) until every dataset is completed')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print the final status as JSON')
    .addOption(hiddenCrashOption(program))
    .action(async (opts: RunOptions) => {
      await withRun(opts.config, (ctx) =>
        runGeneration(ctx, { produce: true, infer: true, ...(opts.crashAt === undefined ? {} : { crashAt: opts.crashAt }), ...(opts.json === undefined ? {} : { json: opts.json }) }),
      );
    });

  program
    .command('produce')
    .description('feed the dataset queues from the prompt files and write results to disk, until every dataset is completed (run workers elsewhere)')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print the final status as JSON')
    .addOption(hiddenCrashOption(program))
    .action(async (opts: RunOptions) => {
      await withRun(opts.config, (ctx) =>
        runGeneration(ctx, { produce: true, infer: false, ...(opts.crashAt === undefined ? {} : { crashAt: opts.crashAt }), ...(opts.json === undefined ? {} : { json: opts.json }) }),
      );
    });

  program
    .command('worker')
    .description('run a worker: inference (calls SGLang for queued prompts; start any number, on any machine)')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--role <role>', 'inference | postprocess | train', 'inference')
    .action(async (opts: { config: string; role: string }) => {
      if (opts.role !== 'inference') {
        throw new AppError(`worker --role ${opts.role}: this version runs the inference role only`);
      }
      await withRun(opts.config, (ctx) => runGeneration(ctx, { produce: false, infer: true, quiet: true }));
    });
}

function hiddenCrashOption(program: Command) {
  return program.createOption('--crash-at <point>', 'test hook: kill this process at a sink step').choices(['after-write', 'after-checkpoint']).hideHelp();
}
