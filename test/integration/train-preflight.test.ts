// The train stage's guards on a "GPU" machine (the stand-in nvidia-smi on the PATH; this
// machine has none): a job waits, delayed and not failed, while the GPU lacks free memory,
// `status` says why with the numbers, and it starts by itself once memory frees; CUDA_VISIBLE_DEVICES
// names the GPU assigned; a CUDA out-of-memory fails the job with that reason and the free
// memory seen at preflight; an environment change (driver) is refused, then allowed.
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import path from 'node:path';
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TRAIN_QUEUE, readRunStatus } from '../../src/shared/index.js';
import { waitFor } from '../helpers/pipeline.js';
import { fakeTrainer, startTrainHarness, waitForStatus, type TrainHarness } from '../helpers/train.js';

const H100 = { name: 'NVIDIA H100 80GB HBM3', totalMiB: 81_559 };

describe('train preflight, OOM and environment fingerprint', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    h = await startTrainHarness();
  });
  afterAll(async () => {
    await h?.close();
  });

  it('waits while the GPU lacks free memory, says why, then starts by itself when it frees', async () => {
    h.setGpus({ driver: '550.54.15', gpus: [{ ...H100, freeMiB: 14_200 }] });
    const envOut = path.join(h.root, 'env-1.json');
    const config = h.config({
      command: fakeTrainer('--steps', '6', '--env-out', envOut),
      gpus: 1,
      minFreeGpuMemMiB: 20_000,
      mode: 'from-scratch',
    });
    const jobId = await h.queue(config);
    await h.worker();

    const waiting = await waitForStatus(h, (s) => s.state === 'waiting', 'the job to wait for GPU memory');
    expect(waiting.waiting).toContain('GPU 0: 14,200 MiB free, 20,000 needed');
    expect(waiting.preflight).toEqual([{ index: 0, name: H100.name, freeMiB: 14_200, totalMiB: H100.totalMiB }]);
    // Delayed, not failed; nothing started.
    const queue = new Queue(TRAIN_QUEUE, { connection: h.redis.connection(), prefix: h.keys.bullPrefix });
    expect(await (await Job.fromId(queue, jobId))?.getState()).toBe('delayed');
    await queue.close();
    expect(existsSync(envOut)).toBe(false);
    // `status` shows the reason, with the numbers, in the train phase.
    const run = await readRunStatus(h.redis.connection(), h.keys, config);
    const phase = run.phases.find((p) => p.name === 'train');
    expect(phase?.detail).toContain('GPU 0: 14,200 MiB free, 20,000 needed');
    expect(run.train?.state).toBe('waiting');

    h.setGpus({ driver: '550.54.15', gpus: [{ ...H100, freeMiB: 30_000 }] });
    const outcome = await h.wait(jobId);
    expect(outcome.status).toBe('completed');
    if (outcome.status !== 'completed') return;
    expect(outcome.result.gpus).toEqual([0]);
    expect(outcome.result.progress?.step).toBe(6);
    const env = JSON.parse(readFileSync(envOut, 'utf8')) as Record<string, unknown>;
    expect(env.CUDA_VISIBLE_DEVICES).toBe('0');
    // The fingerprint is in the attempt folder and in the status.
    const recorded = JSON.parse(
      readFileSync(path.join(outcome.result.attemptDir ?? '', 'environment.json'), 'utf8'),
    ) as { driver: string; gpus: string[] };
    expect(recorded.driver).toBe('550.54.15');
    expect(recorded.gpus).toEqual([H100.name]);
    expect((await h.status())?.fingerprint?.driver).toBe('550.54.15');
    expect(
      (await readRunStatus(h.redis.connection(), h.keys, config)).phases.find((p) => p.name === 'train')?.status,
    ).toBe('completed');
  });

  it('fails a CUDA out-of-memory with that reason and the free memory seen at preflight', async () => {
    const config = h.config({
      command: fakeTrainer('--steps', '6', '--oom-at', '3'),
      gpus: 1,
      minFreeGpuMemMiB: 20_000,
      mode: 'from-scratch',
    });
    const outcome = await h.wait(await h.queue(config));
    expect(outcome.status).toBe('failed');
    if (outcome.status !== 'failed') return;
    expect(outcome.reason).toContain('CUDA out of memory');
    expect(outcome.reason).toContain('Tried to allocate 200.00 MiB');
    expect(outcome.reason).toContain(`GPU 0 (${H100.name}): 30,000 of 81,559 MiB free (20,000 MiB needed)`);
    const s = await h.status();
    expect(s?.state).toBe('failed');
    expect(s?.reason).toContain('CUDA out of memory');
  });

  it('refuses a changed environment (driver), showing the difference, then allows it when told', async () => {
    const attemptsBefore = readdirSync(path.join(h.root, 'out', 'r1', 'train')).length;
    h.setGpus({ driver: '555.42.02', gpus: [{ ...H100, freeMiB: 30_000 }] });
    const config = h.config({
      command: fakeTrainer('--steps', '3'),
      gpus: 1,
      minFreeGpuMemMiB: 20_000,
      mode: 'from-scratch',
    });
    const refused = await h.wait(await h.queue(config));
    expect(refused.status).toBe('failed');
    if (refused.status !== 'failed') return;
    expect(refused.reason).toContain('driver: 550.54.15 → 555.42.02');
    expect(refused.reason).toContain('--allow-env-change');
    expect((await h.status())?.envChanges).toEqual(['driver: 550.54.15 → 555.42.02']);
    // Refused before anything started: no new attempt folder.
    expect(readdirSync(path.join(h.root, 'out', 'r1', 'train'))).toHaveLength(attemptsBefore);

    const allowed = await h.wait(await h.queue(config, { allowEnvChange: true }));
    expect(allowed.status).toBe('completed');
    // The new environment is now the last good one: the same again needs no permission.
    const again = await h.wait(await h.queue(config));
    expect(again.status).toBe('completed');
    await waitFor(
      async () => (await h.status())?.fingerprint?.driver === '555.42.02',
      'the new fingerprint in the status',
    );
  });
});
