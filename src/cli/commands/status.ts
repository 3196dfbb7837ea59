import type { Command } from 'commander';
import { delay, errorMessage, formatRunStatus, readRunStatus, type RunStatus } from '../../shared/index.js';
import { onceSignalled, openRunContext, type RunContext } from '../run-context.js';

/** How often `status --watch` refreshes, and how long one read may take before the note shows (ms). */
const WATCH_INTERVAL_MS = 2_000;
const WATCH_READ_PATIENCE_MS = 3_000;

/**
 * `status --watch`: redraws every 2 seconds until SIGINT / SIGTERM. When Redis does not answer
 * (a restart, a network blip) it keeps the last table on screen under a note saying for how
 * long, and goes on by itself once Redis answers again. One read at a time: a read stuck behind
 * a reconnect is waited for, never piled up.
 */
async function watchStatus(ctx: RunContext, json: boolean): Promise<void> {
  const stop = onceSignalled();
  let done = false;
  void stop.then(() => (done = true));
  let last: RunStatus | undefined;
  let pending: Promise<RunStatus> | undefined;
  let failingSinceMs: number | undefined;
  let failure = '';
  while (!done) {
    pending ??= readRunStatus(ctx.redis, ctx.keys, ctx.config);
    const outcome = await Promise.race([
      pending.then(
        (status) => ({ status }),
        (e: unknown) => ({ error: errorMessage(e) }),
      ),
      new Promise<{ slow: true }>((r) => setTimeout(() => r({ slow: true }), WATCH_READ_PATIENCE_MS).unref()),
      stop.then(() => ({ slow: true as const })),
    ]);
    if (done) break;
    if ('status' in outcome) {
      pending = undefined;
      last = outcome.status;
      failingSinceMs = undefined;
    } else {
      if ('error' in outcome) pending = undefined;
      failure = 'error' in outcome ? outcome.error : `no answer within ${WATCH_READ_PATIENCE_MS / 1000}s`;
      failingSinceMs ??= Date.now();
    }
    const note =
      failingSinceMs === undefined
        ? undefined
        : `! Redis unreachable for ${Math.round((Date.now() - failingSinceMs) / 1000)}s (${failure}); retrying${last === undefined ? '' : ' — the figures below are from the last read'}`;
    if (json)
      process.stdout.write(`${JSON.stringify(note === undefined ? last : { error: note, last: last ?? null })}\n`);
    else
      process.stdout.write(
        `\x1b[2J\x1b[H${note === undefined ? '' : `${note}\n\n`}${last === undefined ? '' : formatRunStatus(last)}\n`,
      );
    // A failed read returns at once: wait before the next one; a slow one is simply waited on.
    if (failingSinceMs === undefined || 'error' in outcome) await Promise.race([stop, delay(WATCH_INTERVAL_MS)]);
  }
}

/** `status`, `pause`, `resume`, `retry-failed`. */
export function registerStatusCommand(program: Command): void {
  program
    .command('status')
    .description(
      'show per-dataset progress: records, tokens / budget, in flight, failed, skipped, tok/s, ETA, and the phases',
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print one JSON object')
    .option('--watch', 'refresh every 2 seconds until interrupted')
    .action(async (opts: { config: string; json?: boolean; watch?: boolean }) => {
      const ctx = await openRunContext(opts.config);
      try {
        if (opts.watch === true) {
          await watchStatus(ctx, opts.json === true);
          return;
        }
        const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
        process.stdout.write(opts.json === true ? `${JSON.stringify(status)}\n` : `${formatRunStatus(status)}\n`);
      } finally {
        await ctx.close();
      }
    });
}
