import path from 'node:path';
import type { Command } from 'commander';
import { CancelledError, loadConfig, runDir, type Config } from '../../shared/index.js';
import {
  chooseDrafter,
  compareReports,
  evaluatedAttempts,
  formatComparison,
  EvalError,
  evalSectionOf,
  formatReport,
  measureDrafter,
  probeGpus,
  writeEvalReport,
  type EvalReport,
  type EvalRunConfig,
  type RetryPolicy,
} from '../../workers/index.js';
import { armStopDeadline, exitInterrupted, onceSignalled } from '../run-context.js';
import { loadRunTokenizer } from '../tokenizer-check.js';

/** Exit code of a measurement below `eval.minAcceptLength` or `eval.minSpeedup`. */
export const EVAL_CHECK_FAILED_EXIT = 3;

interface EvalOptions {
  config: string;
  attempt?: string;
  checkpoint?: string;
  json?: boolean;
  out?: string;
  compare?: boolean;
}

/** What {@link evalCommand} did. */
export interface EvalCommandResult {
  report: EvalReport;
  /** Files the report was written to. */
  files: string[];
}

/** The run's tokenizer checked against the servers measured (their /model_info, /tokenize), as `run` does. */
export function evalTokenizer(config: EvalRunConfig): ReturnType<typeof loadRunTokenizer> {
  return loadRunTokenizer({
    ...config,
    sglang: { ...config.sglang, endpoints: [...config.eval.endpoints, ...(config.eval.baseline ?? [])] },
  });
}

/**
 * `tokenmill eval` without printing: the drafter chosen, measured (on the servers `eval.server`
 * starts, when set), compared and written. Exported for tests. Throws an AppError of one line for
 * a refusal, an endpoint that stays down or a server that does not start.
 */
export async function evalCommand(
  config: Config,
  opts: { attempt?: string; checkpoint?: string; out?: string },
  extra: { retry?: RetryPolicy; signal?: AbortSignal; onProgress?: (line: string) => void } = {},
): Promise<EvalCommandResult> {
  const ec = evalSectionOf(config);
  const dir = runDir(config);
  const drafter = await chooseDrafter(config, dir, { attempt: opts.attempt, checkpoint: opts.checkpoint });
  const measured = await measureDrafter(ec, dir, drafter, {
    loadTokenizer: evalTokenizer,
    probeGpus: () => probeGpus(),
    logDir: drafter.attemptDir ?? path.join(dir, 'eval'),
    ...extra,
  });
  if (measured.kind === 'wait')
    throw new EvalError(
      `eval: ${measured.reason}; tokenmill eval does not wait for GPUs (the eval step of the train worker does)`,
    );
  const report = measured.report;
  const files = await writeEvalReport(report, drafter, opts.out === undefined ? undefined : path.resolve(opts.out));
  return { report, files };
}

/** `eval`: acceptance length and speed-up of a trained drafter served by SGLang. */
export function registerEvalCommand(program: Command): void {
  program
    .command('eval')
    .description(
      "measure a trained drafter on SGLang: acceptance length and rate on each dataset's held-out prompts (eval.endpoints serve the target with the drafter), " +
        'output tokens/s against eval.baseline (the target alone) and the speed-up, compared with the previous attempt. ' +
        `Writes <run>/train/<attempt>/eval.json; exit code ${EVAL_CHECK_FAILED_EXIT} below eval.minAcceptLength / eval.minSpeedup`,
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--attempt <n>', 'the attempt whose final output is evaluated (default: the latest)')
    .option('--checkpoint <path>', 'evaluate this drafter folder instead of an attempt (the report goes to --out)')
    .option('--out <file>', 'also write the report (JSON) here')
    .option('--json', 'print the report as JSON')
    .option(
      '--compare',
      "measure nothing: every evaluated attempt of the run (EAGLE-3, DFlash, …) and no speculation side by side, per dataset, from the attempts' eval.json",
    )
    .action(async (opts: EvalOptions) => {
      const config = loadConfig({ path: opts.config });
      if (opts.compare === true) {
        if (opts.attempt !== undefined || opts.checkpoint !== undefined || opts.out !== undefined)
          throw new EvalError('eval: --compare measures nothing; leave out --attempt, --checkpoint and --out');
        const { reports, notes } = await evaluatedAttempts(runDir(config));
        const comparison = compareReports(reports, notes);
        process.stdout.write(
          opts.json === true ? `${JSON.stringify(comparison, null, 2)}\n` : formatComparison(comparison),
        );
        return;
      }
      const abort = new AbortController();
      let stopped = false;
      void onceSignalled().then(() => {
        stopped = true;
        armStopDeadline(30_000);
        abort.abort();
      });
      try {
        const { report, files } = await evalCommand(
          config,
          {
            ...(opts.attempt === undefined ? {} : { attempt: opts.attempt }),
            ...(opts.checkpoint === undefined ? {} : { checkpoint: opts.checkpoint }),
            ...(opts.out === undefined ? {} : { out: opts.out }),
          },
          {
            signal: abort.signal,
            onProgress: (line) => {
              if (opts.json !== true) process.stderr.write(`tokenmill: ${line}\n`);
            },
          },
        );
        process.stdout.write(opts.json === true ? `${JSON.stringify(report, null, 2)}\n` : formatReport(report));
        if (opts.json !== true) for (const f of files) process.stderr.write(`tokenmill: eval report written to ${f}\n`);
        if (opts.json === true) {
          // With --json the warnings also go to stderr, where a person sees them.
          for (const w of report.warnings) process.stderr.write(`tokenmill: WARNING: ${w}\n`);
          for (const f of report.failed) process.stderr.write(`tokenmill: FAILED: ${f.message}\n`);
        }
        if (!report.ok) process.exitCode = EVAL_CHECK_FAILED_EXIT;
      } catch (e: unknown) {
        if (stopped && e instanceof CancelledError) {
          process.stderr.write('tokenmill: eval stopped; nothing written\n');
          exitInterrupted();
          return;
        }
        throw e;
      }
    });
}
