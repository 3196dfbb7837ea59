import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { formatRunStatus, readRunStatus, type ConfigInput } from '../../shared/index.js';
import { formatTrainResult, runTrainJob, trainStatusLine } from './train.js';
import type { RunContext } from '../run-context.js';
import { roundTrainJobId } from '../../workers/index.js';

/**
 * The demo's train stage: when the reference trainer's Python environment exists
 * (`npm run setup:trainer`: torch and datasets in .venv), the demo ends with a short CPU training
 * of trainers/tiny_drafter.py on the merged demo dataset; otherwise it says how to enable it.
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

/** Steps of the demo's training, and where `tokenmill train --resume` on its config continues to. */
export const DEMO_TRAIN_STEPS = 60;
export const DEMO_RESUME_STEPS = 2 * DEMO_TRAIN_STEPS;

/**
 * The demo config with a train section for the reference trainer under `root` (CPU, a short run);
 * its paths are absolute, as the command runs from the config file's folder. Resuming goes on to
 * {@link DEMO_RESUME_STEPS}, so that `train --resume` after the demo's finished training has steps left.
 */
export function withDemoTraining(config: ConfigInput, python: string | null, root: string): ConfigInput {
  if (python === null) return config;
  return {
    ...config,
    train: {
      command: [
        python,
        path.join(root, 'trainers', 'tiny_drafter.py'),
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
 * After the demo's merge: runs the round's train job in this process and prints its result and
 * the phases, or one line saying how to enable training. Returns false when training failed.
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
  if (outcome.status === 'failed') {
    say(`\ntrain: failed — ${outcome.reason}`);
    return false;
  }
  say(`\n${formatTrainResult(outcome.result)}`);
  const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
  const phases = formatRunStatus(status)
    .split('\n')
    .find((l) => l.startsWith('phases:'));
  if (phases !== undefined) say(phases);
  if (status.train !== undefined && status.train !== null) say(trainStatusLine(status.train));
  return true;
}
