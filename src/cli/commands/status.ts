import { Queue } from 'bullmq';
import type { Command } from 'commander';
import { AppError, formatRunStatus, generateQueueName, readRunStatus, withScripts, type RunKeys } from '../../shared/index.js';
import { onceSignalled, openRunContext } from '../run-context.js';
import type { Redis } from 'ioredis';

async function datasetQueue(redis: Redis, keys: RunKeys, names: readonly string[], dataset: string): Promise<Queue> {
  if (!names.includes(dataset)) throw new AppError(`no dataset "${dataset}" in the config (datasets: ${names.join(', ')})`);
  return new Queue(generateQueueName(dataset), { connection: redis, prefix: keys.bullPrefix });
}

/** `status`, `pause`, `resume`, `retry-failed`. */
export function registerStatusCommands(program: Command): void {
  program
    .command('status')
    .description('show per-dataset progress: records, tokens / budget, in flight, failed, skipped, tok/s, ETA, and the phases')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print one JSON object')
    .option('--watch', 'refresh every 2 seconds until interrupted')
    .action(async (opts: { config: string; json?: boolean; watch?: boolean }) => {
      const ctx = await openRunContext(opts.config);
      try {
        const print = async (): Promise<void> => {
          const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
          if (opts.json === true) process.stdout.write(`${JSON.stringify(status)}\n`);
          else process.stdout.write(`${opts.watch === true ? '\x1b[2J\x1b[H' : ''}${formatRunStatus(status)}\n`);
        };
        await print();
        if (opts.watch === true) {
          const stop = onceSignalled();
          let done = false;
          void stop.then(() => (done = true));
          while (!done) {
            await Promise.race([stop, new Promise((r) => setTimeout(r, 2_000))]);
            if (!done) await print();
          }
        }
      } finally {
        await ctx.close();
      }
    });

  for (const [verb, what] of [
    ['pause', 'stop handing out the dataset\'s queued batches (batches being processed finish)'],
    ['resume', 'hand out the dataset\'s batches again'],
  ] as const) {
    program
      .command(verb)
      .description(what)
      .requiredOption('-c, --config <file>', 'config file (YAML)')
      .argument('<dataset>', 'dataset name')
      .action(async (dataset: string, opts: { config: string }) => {
        const ctx = await openRunContext(opts.config);
        try {
          const queue = await datasetQueue(ctx.redis, ctx.keys, ctx.config.datasets.map((d) => d.name), dataset);
          if (verb === 'pause') await queue.pause();
          else await queue.resume();
          await queue.close();
          process.stdout.write(`${dataset}: ${verb === 'pause' ? 'paused' : 'resumed'}\n`);
        } finally {
          await ctx.close();
        }
      });
  }

  program
    .command('retry-failed')
    .description('give failed prompts their attempts back; a running producer sends them again, or the next `run` / `produce` does')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .argument('[dataset]', 'only this dataset (default: all)')
    .action(async (dataset: string | undefined, opts: { config: string }) => {
      const ctx = await openRunContext(opts.config);
      try {
        const names = ctx.config.datasets.filter((d) => d.prompts !== undefined).map((d) => d.name);
        if (dataset !== undefined && !names.includes(dataset)) throw new AppError(`no generation dataset "${dataset}" in the config (datasets: ${names.join(', ')})`);
        const redis = withScripts(ctx.redis);
        for (const name of dataset === undefined ? names : [dataset]) {
          // One script: the failures deleted are exactly those given back, and a producer
          // running meanwhile sees the retry and makes a new pass (retry-failed-4.lua).
          const given = await redis.retryFailed(ctx.keys.failed(name), ctx.keys.attempts(name), ctx.keys.stats(name), ctx.keys.producer(name));
          process.stdout.write(`${name}: ${given} failed prompt(s) will be sent again\n`);
        }
      } finally {
        await ctx.close();
      }
    });
}
