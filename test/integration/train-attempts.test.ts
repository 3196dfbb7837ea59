// Attempts, resume, progress and cancel, with the fake trainer on the CPU (train.gpus: 0):
// from-scratch never deletes earlier checkpoints; resume takes the newest checkpoint of the
// latest attempt (or the one given); without one it fails listing what exists; progress is
// parsed from `step N/M loss X` or a configured regex; --cancel stops the whole process group.
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TRAIN_QUEUE, TrainProgressSchema } from '../../src/shared/index.js';
import { resolveResumeCheckpoint } from '../../src/workers/train/attempts.js';
import { cancelTrainJobs } from '../../src/workers/train/train-jobs.js';
import { waitFor } from '../helpers/pipeline.js';
import { alive, fakeTrainer, startTrainHarness, waitForStatus, type TrainHarness } from '../helpers/train.js';

describe('train attempts, resume, progress and cancel', () => {
  let h: TrainHarness;
  let trainRoot: string;
  beforeAll(async () => {
    h = await startTrainHarness();
    trainRoot = path.join(h.root, 'out', 'r1', 'train');
    await h.worker();
  });
  afterAll(async () => {
    await h?.close();
  });

  const cpu = (args: string[], extra: Record<string, unknown> = {}) =>
    h.config({ command: fakeTrainer(...args), gpus: 0, mode: 'from-scratch', ...extra });

  it('resume with nothing to resume fails, saying there is no attempt', async () => {
    const outcome = await h.wait(await h.queue(cpu(['--steps', '3']), { mode: 'resume' }));
    expect(outcome).toMatchObject({ status: 'failed' });
    expect(outcome.status === 'failed' ? outcome.reason : '').toContain(
      `no training attempt under ${trainRoot}; start one with --from-scratch`,
    );
  });

  it("from-scratch twice: two attempt folders, the first one's checkpoints untouched", async () => {
    const first = await h.wait(await h.queue(cpu(['--steps', '6'])));
    expect(first).toMatchObject({ status: 'completed', result: { attempt: '0001', mode: 'from-scratch' } });
    const firstCkpts = readdirSync(path.join(trainRoot, '0001', 'checkpoints')).sort();
    expect(firstCkpts).toEqual(['step-5', 'step-6']);
    const second = await h.wait(await h.queue(cpu(['--steps', '6'])));
    expect(second).toMatchObject({ status: 'completed', result: { attempt: '0002' } });
    expect(
      readdirSync(trainRoot)
        .filter((n) => /^\d+$/.test(n))
        .sort(),
    ).toEqual(['0001', '0002']);
    expect(readdirSync(path.join(trainRoot, '0001', 'checkpoints')).sort()).toEqual(firstCkpts);
    expect(readFileSync(path.join(trainRoot, '0001', 'checkpoints', 'step-6'), 'utf8')).toBe('{"step":6}');
    // Each attempt has its log.
    expect(readFileSync(path.join(trainRoot, '0002', 'train.log'), 'utf8')).toContain('step 6/6 loss 0.6667');
  });

  it('resume takes the newest checkpoint of the latest attempt, or the one given', async () => {
    const envOut = path.join(h.root, 'env-resume.json');
    const outcome = await h.wait(await h.queue(cpu(['--steps', '9', '--env-out', envOut]), { mode: 'resume' }));
    const newest = path.join(trainRoot, '0002', 'checkpoints', 'step-6');
    expect(outcome).toMatchObject({
      status: 'completed',
      result: { attempt: '0003', mode: 'resume', checkpoint: newest },
    });
    const env = JSON.parse(readFileSync(envOut, 'utf8')) as { argv: string[]; TOKENMILL_TRAIN_CHECKPOINT: string };
    expect(env.argv.slice(-2)).toEqual(['--resume', newest]);
    expect(env.TOKENMILL_TRAIN_CHECKPOINT).toBe(newest);
    const log = readFileSync(path.join(trainRoot, '0003', 'train.log'), 'utf8');
    expect(log.split('\n')[0]).toBe(`resumed from ${newest} at step 6`);
    expect(log).toContain('step 7/9');
    expect(log).not.toContain('step 6/9');

    const given = path.join(trainRoot, '0001', 'checkpoints', 'step-5');
    const explicit = await h.wait(await h.queue(cpu(['--steps', '9']), { mode: 'resume', checkpoint: given }));
    expect(explicit).toMatchObject({ status: 'completed', result: { attempt: '0004', checkpoint: given } });
  });

  it('resume when the latest attempt left no checkpoint fails listing every attempt and its checkpoints', async () => {
    const failed = await h.wait(await h.queue(cpu(['--steps', '9', '--fail-at', '2'])));
    expect(failed.status === 'failed' ? failed.reason : '').toMatch(
      /the training command failed \(exit code 3\) in attempt 0005 .*fake-trainer: failing at step 2/,
    );
    const outcome = await h.wait(await h.queue(cpu(['--steps', '9']), { mode: 'resume' }));
    expect(outcome.status).toBe('failed');
    const reason = outcome.status === 'failed' ? outcome.reason : '';
    expect(reason).toContain('the latest attempt 0005 has no checkpoint');
    expect(reason).toContain(`attempt 0001 (${path.join(trainRoot, '0001')}): checkpoints step-5, step-6`);
    expect(reason).toContain('attempt 0003');
    expect(reason).toContain('attempt 0005');
    expect(reason).toMatch(/attempt 0005 \([^)]*\): no checkpoint/);
    // Nothing was started for it: no attempt 0006.
    expect(readdirSync(trainRoot).filter((n) => /^\d+$/.test(n))).not.toContain('0006');
    await expect(resolveResumeCheckpoint(path.join(h.root, 'out', 'r1'), path.join(trainRoot, 'nope'))).rejects.toThrow(
      /checkpoint .*nope does not exist\. What exists: attempt 0001/,
    );
  });

  it('parses progress (step, total, loss, steps/s, ETA) into the status and the job, with the default and a custom pattern', async () => {
    const jobId = await h.queue(cpu(['--steps', '12', '--sleep-ms', '150']));
    const mid = await waitForStatus(h, (s) => s.state === 'running' && (s.step ?? 0) >= 4, 'progress while running');
    expect(mid.total).toBe(12);
    expect(mid.loss).toBeCloseTo(4 / (mid.step ?? 1), 3);
    const outcome = await h.wait(jobId);
    expect(outcome.status).toBe('completed');
    if (outcome.status !== 'completed') return;
    expect(outcome.result.progress).toMatchObject({ step: 12, total: 12, loss: 0.3333, etaSeconds: 0 });
    expect(outcome.result.progress?.stepsPerSec).toBeGreaterThan(0.5);
    expect(outcome.result.progress?.stepsPerSec).toBeLessThan(20);
    expect(outcome.result.firstLoss).toBe(4);
    const queue = new Queue(TRAIN_QUEUE, { connection: h.redis.connection(), prefix: h.keys.bullPrefix });
    const job = await Job.fromId(queue, jobId);
    expect(TrainProgressSchema.parse(job?.progress)).toMatchObject({ step: 12, total: 12 });
    const logs = await queue.getJobLogs(jobId);
    expect(logs.logs).toContain('step 12/12 loss 0.3333');
    await queue.close();

    const custom = cpu(['--steps', '6', '--format', 'custom'], {
      progressRegex: String.raw`it=(?<step>\d+) of (?<total>\d+) \| objective=(?<loss>[\d.]+)`,
    });
    const c = await h.wait(await h.queue(custom));
    expect(c).toMatchObject({
      status: 'completed',
      result: { progress: { step: 6, total: 6, loss: 0.6667 }, firstLoss: 4 },
    });
  });

  it('--cancel sends SIGTERM then SIGKILL to the whole process group (the command and its grandchild)', async () => {
    const pidFile = path.join(h.root, 'pids.json');
    const jobId = await h.queue(
      cpu(['--steps', '100000', '--sleep-ms', '200', '--grandchild', pidFile, '--ignore-term']),
    );
    await waitForStatus(h, (s) => s.state === 'running' && (s.step ?? 0) >= 1, 'the command to run');
    const pids = JSON.parse(
      await waitFor(() => {
        try {
          return readFileSync(pidFile, 'utf8');
        } catch {
          return '';
        }
      }, 'the pid file'),
    ) as { child: number; grandchild: number };
    expect(alive(pids.child) && alive(pids.grandchild)).toBe(true);
    const cancelled = await cancelTrainJobs(h.redis.connection(), h.keys);
    expect(cancelled).toEqual([{ jobId, state: 'active', action: 'signalled' }]);
    const outcome = await h.wait(jobId);
    expect(outcome.status).toBe('failed');
    expect(outcome.status === 'failed' ? outcome.reason : '').toMatch(
      /cancelled by `tokenmill train --cancel` at step \d+ .*SIGKILL after the grace period/,
    );
    expect(alive(pids.child)).toBe(false);
    expect(alive(pids.grandchild)).toBe(false);
    expect((await h.status())?.state).toBe('cancelled');
  });
});
