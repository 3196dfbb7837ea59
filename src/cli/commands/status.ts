import { Queue } from 'bullmq';
import type { Command } from 'commander';
import { AppError, formatRunStatus, generateQueueName, pauseDataset, readRunStatus, resumeDataset, retryFailedPrompts, type RunKeys } from '../../shared/index.js';
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
    ['pause', 'stop sending the dataset\'s prompts on every worker within a second (requests in flight finish); the same as Bull Board\'s pause of its queue'],
    ['resume', 'go on sending the dataset\'s prompts where they stopped'],
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
          await queue.close();
          if (verb === 'pause') await pauseDataset(ctx.redis, ctx.keys, dataset);
          else await resumeDataset(ctx.redis, ctx.keys, dataset);
          process.stdout.write(`${dataset}: ${verb === 'pause' ? 'paused' : 'resumed'}\n`);
        } finally {
          await ctx.close();
        }
      });
  }

  program
    .command('retry-failed')
    .description('send failed prompts again with fresh attempts: retries the failed jobs of each dataset queue (as Bull Board\'s Retry does) and gives failures without a failed job back to the producer')
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .argument('[dataset]', 'only this dataset (default: all)')
    .action(async (dataset: string | undefined, opts: { config: string }) => {
      const ctx = await openRunContext(opts.config);
      try {
        const names = ctx.config.datasets.filter((d) => d.prompts !== undefined).map((d) => d.name);
        if (dataset !== undefined && !names.includes(dataset)) throw new AppError(`no generation dataset "${dataset}" in the config (datasets: ${names.join(', ')})`);
        for (const name of dataset === undefined ? names : [dataset]) {
          // The same as Bull Board's "retry all failed", plus failures no failed job carries (src/shared/failed-prompts.ts).
          const r = await retryFailedPrompts(ctx.redis, ctx.keys, name);
          process.stdout.write(`${name}: ${r.prompts} failed prompt(s) will be sent again (${r.jobs} failed job(s) retried)\n`);
        }
      } finally {
        await ctx.close();
      }
    });
}
