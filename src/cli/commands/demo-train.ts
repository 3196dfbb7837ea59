import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import { formatRunStatus, readRunStatus, runDir, type ConfigInput } from '../../shared/index.js';
import { formatEvalOutcome, formatTrainResult, runTrainJob, trainStatusLine } from './train.js';
import type { RunContext } from '../run-context.js';
import {
  compareReports,
  evaluatedAttempts,
  formatComparison,
  formatReport,
  recordedReport,
  roundTrainJobId,
  type EvalOutcomeSeen,
} from '../../workers/index.js';

/**
 * The demo's train stage: when the reference trainer's Python environment exists
 * (`npm run setup:trainer`: torch and datasets in .venv), the demo ends with a short CPU training
 * of trainers/tiny_drafter.py on the merged demo dataset, then the eval step on it: two
 * simulators (`tokenmill sim`, one decoding speculatively with the attempt's drafter, one the
 * target alone) started by `eval.server`, measured on each dataset's held-out prompts. Without
 * the environment it says how to enable it.
 */

/** The interpreter of the trainer environment under `root`, or null when it is not set up. */
export function demoTrainerPython(root: string): string | null {
  const python = path.join(root, '.venv', 'bin', 'python');
  if (!existsSync(python) || !existsSync(path.join(root, 'trainers', 'tiny_drafter.py'))) return null;
  // find_spec does not import: this stays fast even where importing torch takes seconds.
  const probe = spawnSync(
    python,
    ['-c', 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("torch") and u.find_spec("datasets") else 1)'],
    { timeout: 30_000, stdio: 'ignore' },
  );
  return probe.status === 0 ? python : null;
}

/** The drafters `tokenmill demo --drafter` trains: EAGLE-3 style (the default) or a DFlash block drafter. */
export const DEMO_DRAFTERS = ['eagle3', 'dflash'] as const;
export type DemoDrafter = (typeof DEMO_DRAFTERS)[number];

/** The DFlash demo's block size (trainer `--block-size`, simulator `--speculative-dflash-block-size`). */
export const DEMO_DFLASH_BLOCK_SIZE = 8;
/**
 * The DFlash demo's mask token: `<|vision_pad|>` of the bundled Qwen3 tokenizer, a reserved
 * special token its rows never hold (not pad, not eos).
 */
export const DEMO_DFLASH_MASK_TOKEN_ID = 151654;
/** The DFlash demo's simulated drafter: mean accept length per block, per dataset where it differs. */
export const DEMO_DFLASH_ACCEPT_LENGTH = 3.4;
export const DEMO_DFLASH_PER_DATASET: Readonly<Record<string, number>> = {
  B2_magicoder: 4.3,
  B4_openmath: 3.9,
  B6_writing: 2.6,
};

/** Steps of the demo's training, and where `tokenmill train --resume` on its config continues to. */
export const DEMO_TRAIN_STEPS = 60;
export const DEMO_RESUME_STEPS = 2 * DEMO_TRAIN_STEPS;

/**
 * The demo config with a train section for the reference trainer under `root` (CPU, a short run);
 * its paths are absolute, as the command runs from the config file's folder. Resuming goes on to
 * {@link DEMO_RESUME_STEPS}, so that `train --resume` after the demo's finished training has steps left.
 */
export function withDemoTraining(
  config: ConfigInput,
  python: string | null,
  root: string,
  drafter: DemoDrafter = 'eagle3',
): ConfigInput {
  if (python === null) return config;
  const dflash =
    drafter === 'dflash'
      ? [
          '--mode',
          'dflash',
          '--block-size',
          String(DEMO_DFLASH_BLOCK_SIZE),
          '--mask-token-id',
          String(DEMO_DFLASH_MASK_TOKEN_ID),
        ]
      : [];
  return {
    ...config,
    train: {
      command: [
        python,
        path.join(root, 'trainers', 'tiny_drafter.py'),
        ...dflash,
        '--data',
        '{dataset}',
        '--output',
        '{output}',
        '--steps',
        String(DEMO_TRAIN_STEPS),
        '--batch-size',
        '8',
        '--seq-len',
        '64',
        '--save-every',
        '20',
        '--log-every',
        '5',
      ],
      gpus: 0,
      minFreeGpuMemMiB: 0,
      mode: 'from-scratch',
      resumeArgs: ['--resume', '{checkpoint}', '--steps', String(DEMO_RESUME_STEPS)],
      preflightPollMs: 1_000,
      cancelGraceMs: 5_000,
    },
  };
}

/**
 * The eval table of the demo's end: the new attempt's; with no new attempt (a rerun that merged
 * nothing new), the latest attempt's, as measured then.
 */
async function demoEvalText(ctx: RunContext, e: EvalOutcomeSeen, latest: string | null | undefined): Promise<string> {
  if (e.status !== 'completed' || e.result.status !== 'skipped' || latest === null || latest === undefined)
    return formatEvalOutcome(e);
  const report = await recordedReport(ctx.redis, ctx.keys, latest);
  if (report === null) return formatEvalOutcome(e);
  return `${formatEvalOutcome(e)}the latest evaluation, of attempt ${latest}:\n${formatReport(report)}`;
}

/** Prompts of each demo dataset held out of generation for the eval step. */
export const DEMO_EVAL_HOLDOUT = 4;

/**
 * The demo's simulated drafter: the mean acceptance length (tokens per verify step) of the
 * speculative simulator, per dataset where it differs from {@link DEMO_DRAFT_ACCEPT_LENGTH}.
 */
export const DEMO_DRAFT_ACCEPT_LENGTH = 2.6;
export const DEMO_DRAFT_PER_DATASET: Readonly<Record<string, number>> = {
  B2_magicoder: 3.1,
  B4_openmath: 2.9,
  B6_writing: 2.2,
};

/**
 * This CLI as a command line (`node [--import <tsx>] <its script>`), with every path absolute so
 * that it runs from any folder.
 */
export function cliCommand(): string[] {
  const execArgv: string[] = [];
  for (let i = 0; i < process.execArgv.length; i++) {
    const a = process.execArgv[i] ?? '';
    const next = process.execArgv[i + 1];
    // `--import tsx` (the CLI run from source) resolved from here, not from the server's folder.
    if ((a === '--import' || a === '--loader') && next !== undefined && !next.startsWith('-')) {
      execArgv.push(a, next.startsWith('.') || next.startsWith('/') ? next : import.meta.resolve(next));
      i++;
    } else execArgv.push(a);
  }
  return [process.execPath, ...execArgv, path.resolve(process.argv[1] ?? '')];
}

/** A TCP port of 127.0.0.1 free now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      probe.close(() => resolve(port));
    });
  });
}

/**
 * The demo config with datasets' held-out prompts and, with training, an eval section whose
 * `eval.server` starts two simulators of this CLI on `ports` for each attempt: one decoding
 * speculatively with the attempt's drafter ({@link DEMO_DRAFT_ACCEPT_LENGTH}), one the target alone.
 */
export function withDemoEval(
  config: ConfigInput,
  options: { timeScale: number; ports: [number, number]; cli: readonly string[]; drafter?: DemoDrafter },
): ConfigInput {
  const datasets = (config.datasets ?? []).map((d) => ({ ...d, evalHoldout: DEMO_EVAL_HOLDOUT }));
  if (config.train === undefined) return { ...config, datasets };
  const sim = [...options.cli, 'sim', '--port', '{port}', '--time-scale', String(options.timeScale), '--seed', '7'];
  return {
    ...config,
    datasets,
    eval: {
      server: {
        command: options.drafter === 'dflash' ? demoDflashServer(sim) : demoEagle3Server(sim),
        baselineCommand: sim,
        port: options.ports[0],
        baselinePort: options.ports[1],
        gpus: 0,
        healthTimeoutMs: 60_000,
        stopGraceMs: 5_000,
      },
      maxPromptsPerDataset: DEMO_EVAL_HOLDOUT,
      concurrency: 8,
      maxNewTokens: 128,
    },
  };
}

/** The eval step's drafter server for the EAGLE-3 demo: the simulator decoding with EAGLE3. */
function demoEagle3Server(sim: readonly string[]): string[] {
  return [
    ...sim,
    '--speculative-algorithm',
    'EAGLE3',
    '--speculative-draft-model-path',
    '{checkpoint}',
    '--speculative-acceptance',
    String(DEMO_DRAFT_ACCEPT_LENGTH),
    ...Object.entries(DEMO_DRAFT_PER_DATASET).flatMap(([name, x]) => ['--speculative-dataset', `${name}=${x}`]),
  ];
}

/** The eval step's drafter server for the DFlash demo: the simulator decoding with DFLASH, blocks of 8. */
function demoDflashServer(sim: readonly string[]): string[] {
  return [
    ...sim,
    '--speculative-algorithm',
    'DFLASH',
    '--speculative-draft-model-path',
    '{checkpoint}',
    '--speculative-dflash-block-size',
    String(DEMO_DFLASH_BLOCK_SIZE),
    '--speculative-acceptance',
    String(DEMO_DFLASH_ACCEPT_LENGTH),
    ...Object.entries(DEMO_DFLASH_PER_DATASET).flatMap(([name, x]) => ['--speculative-dataset', `${name}=${x}`]),
  ];
}

/**
 * The drafters of the run side by side (`tokenmill eval --compare`), when more than one attempt
 * was evaluated (an EAGLE-3 demo, then a DFlash one, in the same folder); undefined otherwise.
 */
async function demoComparisonText(ctx: RunContext): Promise<string | undefined> {
  const { reports, notes } = await evaluatedAttempts(runDir(ctx.config));
  if (reports.length < 2) return undefined;
  return formatComparison(compareReports(reports, notes));
}

/**
 * After the demo's merge: runs the round's train job and the eval after it in this process and
 * prints the training's result, the eval table and the phases, or one line saying how to enable
 * training. Returns false when training or its eval failed.
 */
export async function finishDemoTraining(
  ctx: RunContext,
  python: string | null,
  options: { json?: boolean },
): Promise<boolean> {
  const say = (line: string): void => {
    (options.json === true ? process.stderr : process.stdout).write(`${line}\n`);
  };
  if (python === null) {
    say(
      '\ntrain: not run — `npm run setup:trainer` installs PyTorch into .venv, then the demo ends with a short CPU training of trainers/tiny_drafter.py',
    );
    return true;
  }
  const flowId = await ctx.redis.hget(ctx.keys.postprocess(), 'flowId');
  if (flowId === null) return true;
  process.stderr.write(`tokenmill demo: training trainers/tiny_drafter.py on the CPU (${python})\n`);
  const outcome = await runTrainJob(ctx, roundTrainJobId(flowId), { worker: true, quiet: true });
  if (outcome === 'signalled') return true;
  const { train, eval: evaluation } = outcome;
  if (train.status === 'failed') {
    say(`\ntrain: failed — ${train.reason}`);
    return false;
  }
  say(`\n${formatTrainResult(train.result)}`);
  const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
  if (evaluation !== null) say(`\n${(await demoEvalText(ctx, evaluation, status.eval?.report?.attempt)).trimEnd()}`);
  const comparison = evaluation === null ? undefined : await demoComparisonText(ctx);
  if (comparison !== undefined) say(`\n${comparison.trimEnd()}`);
  const phases = formatRunStatus(status)
    .split('\n')
    .find((l) => l.startsWith('phases:'));
  if (phases !== undefined) say(`\n${phases}`);
  if (status.train !== undefined && status.train !== null) say(trainStatusLine(status.train));
  return evaluation?.status !== 'failed';
}
