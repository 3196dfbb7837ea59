// The reference trainer (trainers/tiny_drafter.py, PyTorch on the CPU here) through a train
// worker, on a dataset written by tokenmill's own dataset writer: the loss falls over a short
// run, and a resume from its mid-run checkpoint starts at the next step and reaches the same loss
// as the uninterrupted run. Needs the `trainer` Python environment (torch==2.13.0 in .venv),
// built here by scripts/setup-python.sh when missing.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoTrainerPython } from '../../src/cli/commands/demo-train.js';
import { writeHfDataset, type HfRow } from '../../src/shared/hf-dataset/index.js';
import { REPO_ROOT, VENV_PYTHON, runProcess } from '../helpers/python.js';
import { startTrainHarness, type TrainHarness } from '../helpers/train.js';

/** Rows a drafter can learn: each sample cycles through a pattern of token ids; the first 8 are the prompt. */
function learnableRows(n: number): HfRow[] {
  return Array.from({ length: n }, (_, i) => {
    const input_ids = Array.from({ length: 40 }, (_, k) => 1000 + (((i % 4) + 3 * k) % 13) * 97);
    return {
      id: `s${i}`,
      dataset: 'd1',
      input_ids,
      loss_mask: input_ids.map((_, k) => (k < 8 ? 0 : 1)),
      num_tokens: input_ids.length,
      finish_reason: 'stop',
    };
  });
}

/** `step N/M loss X` lines of a train.log. */
function losses(log: string): Map<number, number> {
  const out = new Map<number, number>();
  for (const m of log.matchAll(/^step (\d+)\/\d+ loss ([\d.]+)$/gm)) out.set(Number(m[1]), Number(m[2]));
  return out;
}

describe('reference trainer (tiny_drafter.py)', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    // Built when missing (a fresh clone); an existing one is only looked up, not imported (slow).
    if (demoTrainerPython(REPO_ROOT) === null) {
      const setup = await runProcess('bash', [path.join(REPO_ROOT, 'scripts/setup-python.sh'), 'trainer'], {
        timeoutMs: 15 * 60_000,
        env: process.env,
      });
      if (setup.code !== 0) throw new Error(`scripts/setup-python.sh trainer failed:\n${setup.stderr}`);
    }
    h = await startTrainHarness();
    await writeHfDataset(path.join(h.root, 'dataset'), learnableRows(24), { shardSizeMiB: 1 });
    await h.worker();
  }, 16 * 60_000);
  afterAll(async () => {
    await h?.close();
  });

  const trainer = (steps: number) =>
    h.config({
      command: [
        VENV_PYTHON,
        path.join(REPO_ROOT, 'trainers/tiny_drafter.py'),
        '--data',
        '{dataset}',
        '--output',
        '{output}',
        '--steps',
        String(steps),
        '--batch-size',
        '4',
        '--seq-len',
        '32',
        '--save-every',
        '10',
        '--lr',
        '0.003',
      ],
      gpus: 0,
      mode: 'from-scratch',
    });

  it('the loss falls over a short CPU run, and a resume from the mid-run checkpoint continues at the same step to the same loss', async () => {
    const first = await h.wait(await h.queue(trainer(20)), 120_000);
    expect(first.status === 'failed' ? first.reason : '').toBe('');
    if (first.status !== 'completed') return;
    const r = first.result;
    expect(r.progress).toMatchObject({ step: 20, total: 20 });
    expect(r.firstLoss).not.toBeNull();
    expect(r.lastLoss).not.toBeNull();
    expect(r.lastLoss ?? Infinity).toBeLessThan((r.firstLoss ?? 0) * 0.5);
    const ckpts = path.join(r.attemptDir ?? '', 'checkpoints');
    expect(existsSync(path.join(ckpts, 'step-000010.pt'))).toBe(true);
    expect(r.lastCheckpoint).toBe(path.join(ckpts, 'step-000020.pt'));
    const straight = losses(readFileSync(path.join(r.attemptDir ?? '', 'train.log'), 'utf8'));
    expect(straight.size).toBe(20);

    const mid = path.join(ckpts, 'step-000010.pt');
    const resumed = await h.wait(await h.queue(trainer(20), { mode: 'resume', checkpoint: mid }), 120_000);
    expect(resumed.status === 'failed' ? resumed.reason : '').toBe('');
    if (resumed.status !== 'completed') return;
    const log = readFileSync(path.join(resumed.result.attemptDir ?? '', 'train.log'), 'utf8');
    expect(log).toContain(`resumed from ${mid} at step 10`);
    const again = losses(log);
    expect([...again.keys()][0]).toBe(11);
    expect(again.size).toBe(10);
    // Same batches, same optimizer state: the same losses as the run that was not interrupted.
    for (const [step, loss] of again) expect(loss, `step ${step}`).toBeCloseTo(straight.get(step) ?? NaN, 4);
    expect(resumed.result.lastCheckpoint).toBe(
      path.join(resumed.result.attemptDir ?? '', 'checkpoints', 'step-000020.pt'),
    );
  }, 300_000);

  it('--mode dflash: the block drafter trains a few steps on anchors with the reserved mask token, its loss falls, and it refuses a mask token the data holds', async () => {
    const dflash = (maskTokenId: number) =>
      h.config({
        command: [
          VENV_PYTHON,
          path.join(REPO_ROOT, 'trainers/tiny_drafter.py'),
          '--mode',
          'dflash',
          '--mask-token-id',
          String(maskTokenId),
          '--block-size',
          '4',
          '--anchors-per-sample',
          '4',
          '--data',
          '{dataset}',
          '--output',
          '{output}',
          '--steps',
          '20',
          '--batch-size',
          '4',
          '--seq-len',
          '16',
          '--save-every',
          '20',
        ],
        gpus: 0,
        mode: 'from-scratch',
      });
    const done = await h.wait(await h.queue(dflash(7)), 120_000);
    expect(done.status === 'failed' ? done.reason : '').toBe('');
    if (done.status !== 'completed') return;
    const r = done.result;
    expect(r.progress).toMatchObject({ step: 20, total: 20 });
    expect(r.lastLoss ?? Infinity).toBeLessThan((r.firstLoss ?? 0) * 0.7);
    expect(r.lastCheckpoint).toBe(path.join(r.attemptDir ?? '', 'checkpoints', 'step-000020.pt'));
    const log = readFileSync(path.join(r.attemptDir ?? '', 'train.log'), 'utf8');
    expect(log).toMatch(/tiny_drafter: dflash, 24 samples with anchors \(0 without\), block 4, mask token 7/);
    expect(log).toMatch(/^step 20\/20 loss [\d.]+ slot1_acc [\d.]+$/m);

    // 1000 is a token of every row: not a reserved mask token.
    const refused = await h.wait(await h.queue(dflash(1000)), 120_000);
    expect(refused.status === 'failed' ? refused.reason : '').toContain('the mask token 1000 is in 24 row(s)');
  }, 300_000);
});
