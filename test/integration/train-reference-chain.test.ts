// The reference trainer's two-step chain (train.steps): `--extract` saves a frozen target's
// hidden states, then the drafter trains on them (`--features {output:extract}`), each step its
// own train job, on a dataset written by tokenmill's writer. Needs the `trainer` environment.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoTrainerPython } from '../../src/cli/commands/demo-train.js';
import { writeHfDataset, type HfRow } from '../../src/shared/hf-dataset/index.js';
import { REPO_ROOT, VENV_PYTHON, runProcess } from '../helpers/python.js';
import { startTrainHarness, type TrainHarness } from '../helpers/train.js';

function rows(n: number): HfRow[] {
  return Array.from({ length: n }, (_, i) => {
    const input_ids = Array.from({ length: 30 }, (_, k) => 500 + (((i % 3) + 5 * k) % 11) * 31);
    return {
      id: `s${i}`,
      dataset: 'd1',
      input_ids,
      loss_mask: input_ids.map((_, k) => (k < 6 ? 0 : 1)),
      num_tokens: input_ids.length,
      finish_reason: 'stop',
    };
  });
}

describe('reference trainer as a chain: extract, then train', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    if (demoTrainerPython(REPO_ROOT) === null) {
      const setup = await runProcess('bash', [path.join(REPO_ROOT, 'scripts/setup-python.sh'), 'trainer'], {
        timeoutMs: 15 * 60_000,
        env: process.env,
      });
      if (setup.code !== 0) throw new Error(`scripts/setup-python.sh trainer failed:\n${setup.stderr}`);
    }
    h = await startTrainHarness();
    await writeHfDataset(path.join(h.root, 'dataset'), rows(12), { shardSizeMiB: 1 });
    await h.worker();
  }, 16 * 60_000);
  afterAll(async () => {
    await h?.close();
  });

  it('extracts hidden states, then trains the drafter on them, the loss falling', async () => {
    const trainer = path.join(REPO_ROOT, 'trainers/tiny_drafter.py');
    const config = h.config({
      steps: [
        {
          name: 'extract',
          command: [VENV_PYTHON, trainer, '--extract', '--data', '{dataset}', '--output', '{output}'],
        },
        {
          name: 'train',
          command: [
            VENV_PYTHON,
            trainer,
            '--features',
            '{output:extract}',
            '--data',
            '{dataset}',
            '--output',
            '{output}',
            '--steps',
            '15',
            '--batch-size',
            '4',
            '--seq-len',
            '24',
            '--save-every',
            '15',
          ],
        },
      ],
      gpus: 0,
      mode: 'from-scratch',
    });
    const outcome = await h.wait(await h.queue(config), 240_000);
    expect(outcome.status === 'failed' ? outcome.reason : '').toBe('');
    if (outcome.status !== 'completed') return;
    const attempt = outcome.result.attemptDir ?? '';
    expect(outcome.result).toMatchObject({ step: 'train', progress: { step: 15, total: 15 } });
    expect(outcome.result.lastLoss ?? Infinity).toBeLessThan((outcome.result.firstLoss ?? 0) * 0.5);
    expect(existsSync(path.join(attempt, 'extract', 'output', 'features.pt'))).toBe(true);
    expect(readFileSync(path.join(attempt, 'extract', 'train.log'), 'utf8')).toMatch(
      /features .*: 12 samples, 360 positions, width 96/,
    );
    expect(existsSync(path.join(attempt, 'train', 'output', 'step-000015.pt'))).toBe(true);
  }, 300_000);
});
