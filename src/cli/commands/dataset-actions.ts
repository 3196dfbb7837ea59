/**
 * What a person does to a dataset's generation: `pause` / `resume` its requests on every worker,
 * `retry-failed` its failed prompts (and, with `turns: all`, the conversations that ended early
 * for a cause that may pass).
 */
import { Queue } from 'bullmq';
import type { Command } from 'commander';
import type { Redis } from 'ioredis';
import {
  AppError,
  generateQueueName,
  pauseDataset,
  resumeDataset,
  retryFailedPrompts,
  type RunKeys,
} from '../../shared/index.js';
import { reopenEndedConversations } from '../reopen-conversations.js';
import { openRunContext } from '../run-context.js';

async function datasetQueue(redis: Redis, keys: RunKeys, names: readonly string[], dataset: string): Promise<Queue> {
  if (!names.includes(dataset))
    throw new AppError(`no dataset "${dataset}" in the config (datasets: ${names.join(', ')})`);
  return new Queue(generateQueueName(dataset), { connection: redis, prefix: keys.bullPrefix });
}

/** Adds `pause`, `resume` and `retry-failed`. */
export function registerDatasetActionCommands(program: Command): void {
  for (const [verb, what] of [
    [
      'pause',
      "stop sending the dataset's prompts on every worker within a second (requests in flight finish); the same as Bull Board's pause of its queue",
    ],
    ['resume', "go on sending the dataset's prompts where they stopped"],
  ] as const) {
    program
      .command(verb)
      .description(what)
      .requiredOption('-c, --config <file>', 'config file (YAML)')
      .argument('<dataset>', 'dataset name')
      .action(async (dataset: string, opts: { config: string }) => {
        const ctx = await openRunContext(opts.config);
        try {
          const queue = await datasetQueue(
            ctx.redis,
            ctx.keys,
            ctx.config.datasets.map((d) => d.name),
            dataset,
          );
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
    .description(
      "send failed prompts again with fresh attempts: retries the failed jobs of each dataset queue (as Bull Board's Retry does) and gives failures without a failed job back to the producer",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .argument('[dataset]', 'only this dataset (default: all)')
    .action(async (dataset: string | undefined, opts: { config: string }) => {
      const ctx = await openRunContext(opts.config);
      try {
        const names = ctx.config.datasets.filter((d) => d.prompts !== undefined).map((d) => d.name);
        if (dataset !== undefined && !names.includes(dataset))
          throw new AppError(`no generation dataset "${dataset}" in the config (datasets: ${names.join(', ')})`);
        for (const name of dataset === undefined ? names : [dataset]) {
          // The same as Bull Board's "retry all failed", plus failures no failed job carries (src/shared/queues/failed-prompts.ts).
          const r = await retryFailedPrompts(ctx.redis, ctx.keys, name);
          process.stdout.write(
            `${name}: ${r.prompts} failed prompt(s) will be sent again (${r.jobs} failed job(s) retried)\n`,
          );
          if (ctx.config.datasets.find((d) => d.name === name)?.turns === 'all') {
            // Conversations that ended on a failed turn or an error resume at their next turn.
            const c = await reopenEndedConversations(ctx.redis, ctx.keys, name, ctx.runDir);
            process.stdout.write(
              `${name}: ${c.reopened} conversation(s) that ended early will resume at their next turn` +
                (c.kept === 0 ? '\n' : ` (${c.kept} that outgrew the context stay ended)\n`),
            );
          }
        }
      } finally {
        await ctx.close();
      }
    });
}
