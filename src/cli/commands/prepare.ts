import type { Command } from 'commander';
import { prepareSources, sourcedDatasets, startRunOver } from '../../producers/index.js';
import { formatPrepareOutcome, printProgress, shown, whileNotSignalled } from '../prepare-run.js';
import { openRunContext, type RunContext } from '../run-context.js';

/**
 * `run --fresh`: the run's Redis keys and its folder's files (the embedded Redis server's folder
 * kept) are deleted, so the run starts over; refused while its producer runs.
 */
export async function startFresh(ctx: RunContext): Promise<void> {
  const { keys } = await startRunOver(ctx.redis, ctx.keys, ctx.runDir);
  process.stderr.write(
    `tokenmill: --fresh: run "${ctx.config.run}" starts over (${keys} Redis keys and the files in ${shown(ctx.runDir)} deleted)\n`,
  );
}

/** `prepare`: from the datasets' `source` files to their prompt files. */
export function registerPrepareCommand(program: Command): void {
  program
    .command('prepare')
    .description(
      "turn each dataset's source (JSONL, JSON or parquet files as downloaded) into its prompt file: prompts end with a user turn, duplicates, empty and malformed rows and prompts over maxPromptTokens dropped, limit/shuffle applied; a prepare-report.json per dataset",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print one JSON object per dataset')
    .action(async (opts: { config: string; json?: boolean }) => {
      const ctx = await openRunContext(opts.config);
      try {
        if (sourcedDatasets(ctx.config).length === 0) {
          process.stderr.write('tokenmill prepare: no dataset has a `source`; nothing to prepare\n');
          return;
        }
        const outcomes = await whileNotSignalled((signal) =>
          prepareSources({
            config: ctx.config,
            run: { redis: ctx.redis, keys: ctx.keys },
            signal,
            onDataset: (o) => {
              if (opts.json !== true) process.stdout.write(`${formatPrepareOutcome(o)}\n`);
            },
            onProgress: printProgress,
          }),
        );
        if (opts.json === true) for (const o of outcomes) process.stdout.write(`${JSON.stringify(o)}\n`);
      } finally {
        await ctx.close();
      }
    });
}
