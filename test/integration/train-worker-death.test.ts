// A train worker that dies (SIGKILL of `tokenmill worker --role train`, a real child process):
// its job is picked up by another worker once its lock lapses, and fails saying so — unless
// train.autoResume, when it resumes from the newest checkpoint. The dead worker's command
// (in its own process group) does not train on beside the next attempt.
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killCliChildren, spawnCli, waitFor, writeConfig } from '../helpers/pipeline.js';
import { alive, fakeTrainer, startTrainHarness, waitForStatus, type TrainHarness } from '../helpers/train.js';

describe('train worker death', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    h = await startTrainHarness();
  });
  afterAll(async () => {
    await killCliChildren();
    await h?.close();
  });

  /** Queues a job, lets a CLI train worker run it past a checkpoint, then SIGKILLs that worker. */
  async function killWorkerMidway(
    autoResume: boolean,
    steps: number,
  ): Promise<{ jobId: string; pid: number; runDir: string }> {
    const train = {
      command: fakeTrainer('--steps', String(steps), '--sleep-ms', '150', '--save-every', '3'),
      gpus: 0,
      mode: 'from-scratch' as const,
      autoResume,
    };
    const config = h.config(train);
    const file = writeConfig(h.root, {
      run: 'r1',
      redis: { url: h.redis.url, prefix: h.redis.prefix },
      datasets: [{ name: 'd1', conversations: 'conv.jsonl' }],
      output: { dir: path.join(h.root, 'out') },
      postprocess: { target: path.join(h.root, 'dataset') },
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000 },
      train: { ...train, cancelGraceMs: 1_000 },
    });
    const cli = spawnCli(['worker', '-c', file, '--role', 'train']);
    const jobId = await h.queue(config);
    const running = await waitForStatus(
      h,
      (s) => s.jobId === jobId && s.state === 'running' && (s.step ?? 0) >= 4,
      'the CLI worker to run past a checkpoint',
      45_000,
    );
    // The CLI worker runs it (no other worker is up), as the leader of its own process group.
    expect(running.worker).toBe(`${hostname()}:${cli.child.pid ?? ''}`);
    const pid = Number(await h.redis.connection().hget(`${h.keys.base}:train`, 'pid'));
    cli.child.kill('SIGKILL');
    await cli.exited;
    return { jobId, pid, runDir: h.runDir(config) };
  }

  it('fails the job, saying the worker died and where the newest checkpoint is, when autoResume is off', async () => {
    const { jobId, pid, runDir } = await killWorkerMidway(false, 100_000);
    const worker = await h.worker();
    const outcome = await h.wait(jobId, 45_000);
    await worker.stop();
    expect(outcome.status).toBe('failed');
    const reason = outcome.status === 'failed' ? outcome.reason : '';
    expect(reason).toMatch(
      /the train worker \S+ running attempt 0001 died; not resumed because train\.autoResume is false; newest checkpoint: .*0001\/checkpoints\/step-\d+ — continue with `tokenmill train --resume`/,
    );
    expect(reason).toContain(path.join(runDir, 'train', '0001', 'checkpoints'));
    // The dead worker's command is gone (killed by its stdout pipe closing, or by the next worker).
    await waitFor(() => !alive(pid), 'the orphaned command to be gone', 10_000);
  });

  it('resumes from the newest checkpoint on another worker when autoResume is on', async () => {
    const { jobId, runDir } = await killWorkerMidway(true, 14);
    await h.worker();
    const outcome = await h.wait(jobId, 45_000);
    expect(outcome.status).toBe('completed');
    if (outcome.status !== 'completed') return;
    expect(outcome.result.mode).toBe('resume');
    expect(outcome.result.attempt).toBe('0003');
    expect(outcome.result.checkpoint).toMatch(
      new RegExp(`${path.join(runDir, 'train', '0002', 'checkpoints')}/step-\\d+$`),
    );
    expect(outcome.result.progress?.step).toBe(14);
    const log = readFileSync(path.join(runDir, 'train', '0003', 'train.log'), 'utf8');
    expect(log.split('\n')[0]).toMatch(/^resumed from .*0002\/checkpoints\/step-\d+ at step \d+$/);
  });
});
