// A chain of GPU steps (train.steps), with the fake trainer: each step is its own train job in
// the chain's attempt folder, a later step reads an earlier one's output ({output:<step>}), a
// failed step stops the chain, and `--resume` reruns it from that step without redoing the
// finished ones; a step waits while the disk lacks the space it asks for.
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TRAIN_QUEUE, loadConfig } from '../../src/shared/index.js';
import { cancelTrainJobs } from '../../src/workers/train/train-jobs.js';
import { fakeTrainer, startTrainHarness, waitForStatus, type TrainHarness } from '../helpers/train.js';

describe('train.steps', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    h = await startTrainHarness();
    await h.worker();
  });
  afterAll(async () => {
    await h?.close();
  });

  it('refuses a train section with both or neither of command and steps', () => {
    const load = (train: Record<string, unknown>) => () =>
      loadConfig({ object: { datasets: [{ name: 'a', conversations: 'a.jsonl' }], train }, baseDir: h.root });
    expect(load({ mode: 'from-scratch' })).toThrow(/train: expected exactly one of "command" or "steps", got neither/);
    expect(load({ mode: 'from-scratch', command: ['t'], steps: [{ name: 'a', command: ['t'] }] })).toThrow(/got both/);
    expect(
      load({
        mode: 'from-scratch',
        steps: [
          { name: 'a', command: ['t'] },
          { name: 'a', command: ['u'] },
        ],
      }),
    ).toThrow(/train\.steps\[1\]\.name: expected a unique step name, got "a" again/);
  });

  it('runs the steps in order in one attempt; a failed step stops the chain; --resume reruns from it, never redoing finished ones', async () => {
    const count = path.join(h.root, 'count.txt');
    const failFlag = path.join(h.root, 'fail');
    const envOut = path.join(h.root, 'env-train.json');
    writeFileSync(failFlag, '');
    const config = h.config({
      steps: [
        { name: 'extract', command: fakeTrainer('--steps', '3', '--count', count, '--name', 'extract') },
        {
          name: 'train',
          command: fakeTrainer(
            '--steps',
            '4',
            '--count',
            count,
            '--name',
            'train',
            '--fail-if',
            failFlag,
            '--features',
            '{output:extract}',
            '--env-out',
            envOut,
          ),
        },
      ],
      gpus: 0,
      mode: 'from-scratch',
    });
    const first = await h.queue(config);
    const queue = new Queue(TRAIN_QUEUE, { connection: h.redis.connection(), prefix: h.keys.bullPrefix });
    expect((await Job.fromId(queue, `${first}-extract`))?.data).toMatchObject({
      stepIndex: 0,
      command: expect.arrayContaining(['extract']) as unknown,
    });
    await queue.close();
    const failed = await h.wait(first);
    expect(failed.status).toBe('failed');
    expect(failed.status === 'failed' ? failed.reason : '').toMatch(
      /the training command failed \(exit code 3\) in step train of attempt 0001 .*fake-trainer: failing at step 2/,
    );
    const attempt = path.join(h.root, 'out', 'r1', 'train', '0001');
    expect(existsSync(path.join(attempt, 'extract', 'done.json'))).toBe(true);
    expect(readFileSync(path.join(attempt, 'extract', 'train.log'), 'utf8')).toContain('step 3/3');
    expect(existsSync(path.join(attempt, 'extract', 'output', 'step-3'))).toBe(true);
    expect(existsSync(path.join(attempt, 'train', 'done.json'))).toBe(false);
    expect(JSON.parse(readFileSync(envOut, 'utf8')).argv).toEqual(
      expect.arrayContaining(['--features', path.join(attempt, 'extract', 'output')]) as unknown,
    );
    expect(readFileSync(count, 'utf8')).toBe('extract\ntrain\n');

    rmSync(failFlag);
    const rerun = await h.wait(await h.queue(config, { mode: 'resume' }));
    expect(rerun).toMatchObject({
      status: 'completed',
      result: { status: 'completed', step: 'train', attempt: '0001', progress: { step: 4, total: 4 } },
    });
    // extract was not run again; train ran again in the same attempt.
    expect(readFileSync(count, 'utf8')).toBe('extract\ntrain\ntrain\n');
    expect(existsSync(path.join(attempt, 'train', 'done.json'))).toBe(true);
    expect(existsSync(path.join(h.root, 'out', 'r1', 'train', '0002'))).toBe(false);
  });

  it('a step waits while the disk lacks the space it asks for, saying how much there is', async () => {
    const config = h.config({
      steps: [{ name: 'extract', command: fakeTrainer('--steps', '1'), minFreeDiskGiB: 1e9 }],
      gpus: 0,
      mode: 'from-scratch',
    });
    const jobId = await h.queue(config);
    const waiting = await waitForStatus(
      h,
      (s) => s.jobId === jobId && s.state === 'waiting',
      'the step to wait for disk space',
    );
    expect(waiting.waiting).toMatch(/^disk \/\S*: [\d.]+ GiB free, 1000000000 GiB needed by step extract$/);
    expect(waiting.chainStep).toBe('extract (1/1)');
    const cancelled = await cancelTrainJobs(h.redis.connection(), h.keys);
    expect(cancelled.map((c) => c.jobId)).toEqual([jobId]);
  });
});
