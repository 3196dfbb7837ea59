import { Command, CommanderError } from 'commander';
import { AppError, createRootLogger, errorMessage } from '../shared/index.js';
import { registerCommands } from './commands/index.js';
import { describeRedisRefusal } from './redis-memory.js';

/** Commands whose default log level is `warn`: they print their own progress lines. */
export const PROGRESS_COMMANDS: ReadonlySet<string> = new Set(['run', 'demo']);

/** Builds the `tokenmill` command tree. Exported for tests. */
export function buildProgram(): Command {
  const program = new Command('tokenmill')
    .description(
      'Turn prompt datasets into training data for speculative-decoding drafters (EAGLE-3, DFlash) with SGLang.',
    )
    .option(
      '--log-level <level>',
      'log level: fatal|error|warn|info|debug|trace|silent (default: info; warn for run and demo, which print progress lines)',
      'info',
    )
    .showHelpAfterError()
    .exitOverride();
  program.hook('preAction', (_program, action) => {
    const opts = action.optsWithGlobals<{ logLevel?: string }>();
    // Commands that draw a progress line on stderr (`run`, `demo`) log warnings and errors only
    // unless asked for more: info-level JSON lines would bury the progress lines.
    const quiet = PROGRESS_COMMANDS.has(action.name()) && program.getOptionValueSource('logLevel') === 'default';
    createRootLogger({ level: quiet ? 'warn' : (opts.logLevel ?? 'info') });
  });
  registerCommands(program);
  return program;
}

/** Runs the CLI; sets the exit code, prints one clear line for expected errors. */
export async function main(argv: readonly string[]): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync([...argv]);
  } catch (err: unknown) {
    if (err instanceof CommanderError) {
      process.exitCode = err.exitCode;
      return;
    }
    const refusal = describeRedisRefusal(err);
    if (refusal !== undefined) {
      process.stderr.write(`tokenmill: ${refusal}\n`);
    } else if (err instanceof AppError) {
      process.stderr.write(`tokenmill: ${err.message}\n`);
    } else {
      process.stderr.write(
        `tokenmill: unexpected error: ${errorMessage(err)}\n${err instanceof Error ? (err.stack ?? '') : ''}\n`,
      );
    }
    process.exitCode = 1;
  }
}

const invokedDirectly = import.meta.url === `file://${process.argv[1] ?? ''}`;
if (invokedDirectly) {
  await main(process.argv);
  // The command is done: anything still holding the event loop (a socket, a timer) must not
  // keep the process alive, or a finished run would look hung.
  setTimeout(() => process.exit(), 5_000).unref();
}
