/**
 * The producer never passes for ever (docs/design.md, invariant 12), with a real `produce`
 * process, real Redis and real BullMQ workers: batches that fail every time (a worker whose
 * processing throws) stop the dataset after a bounded number of passes, with `status: failed` and
 * a reason naming the failed job's error, the command exiting 1, the failed jobs bounded. And the
 * samples of one prompt that fill several batches (`samplesPerPrompt` ≥ 2 × `batchSize`) each get
 * a batch of their own id: every sample is generated in the first pass.
 */
import path from 'node:path';

import { UnrecoverableError, Worker } from 'bullmq';
import { describe, expect, it } from 'vitest';

import { batchIdOf } from '../../src/producers/batch-id.js';
import { MAX_PASSES_WITHOUT_PROGRESS } from '../../src/producers/dataset-end.js';
import { RunKeys, generateQueueName } from '../../src/shared/index.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, writePrompts } from '../helpers/pipeline.js';

const { redis, tmp, sim } = useHarness({
  redis: true,
  tmp: 'tm-progress-',
  cli: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 3, outputLength: { distribution: 'fixed', mean: 6 } },
});

describe('producer passes', () => {
  it('batches that fail every time stop the dataset after a bounded number of passes, naming the cause', async () => {
    const run = 'noprog';
    writePrompts(tmp.dir, run, 5);
    const config: TestConfigSpec = {
      run,
      redis,
      sim,
      datasets: [{ name: 'p', prompts: `${run}.jsonl`, tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 2 }],
    };
    const cfg = writeTestConfig(tmp.dir, config, `${run}.yaml`);
    const keys = new RunKeys(redis.prefix, run);
    // A worker whose processing throws for every batch (a defect of its own, not of a prompt).
    let taken = 0;
    const worker = new Worker(
      generateQueueName('p'),
      () => {
        taken += 1;
        throw new UnrecoverableError('renderer crashed: unexpected token in template');
      },
      { connection: redis.connection('worker'), prefix: keys.bullPrefix },
    );
    try {
      const produce = spawnCli(['produce', '-c', cfg]);
      const code = await Promise.race([
        produce.exited,
        new Promise((r) => setTimeout(() => r('still passing after 60 s'), 60_000)),
      ]);
      expect(code, produce.output().slice(-3_000)).toBe(1);
      expect(produce.output()).toMatch(
        /dataset p stopped: 3 passes over the prompts in a row sent samples .* renderer crashed: unexpected token in template/,
      );
      // 3 batches a pass, each failed once: bounded, not one more pass.
      expect(taken).toBe(3 * MAX_PASSES_WITHOUT_PROGRESS);
      const conn = redis.connection('client');
      const stats = await conn.hgetall(keys.stats('p'));
      expect(stats.status).toBe('failed');
      expect(stats.failedReason).toMatch(/renderer crashed/);
      const status = spawnCli(['status', '-c', cfg, '--json']);
      expect(await status.exited).toBe(0);
      const s = JSON.parse(status.stdout()) as {
        phases: { name: string; status: string }[];
        datasets: { status: string; failedReason?: string }[];
      };
      expect(s.datasets[0]).toMatchObject({ status: 'failed' });
      expect(s.datasets[0]?.failedReason).toMatch(/renderer crashed/);
      expect(s.phases.find((p) => p.name === 'generate')?.status).toBe('failed');
    } finally {
      await worker.close();
    }
  }, 120_000);

  it('samples of one prompt filling several batches each reach the queue: all generated in the first pass', async () => {
    const run = 'spp-batches';
    writePrompts(tmp.dir, run, 3);
    const config: TestConfigSpec = {
      run,
      redis,
      sim,
      sglang: { concurrency: 8 },
      datasets: [
        {
          name: 'p',
          prompts: `${run}.jsonl`,
          tokenBudget: 1_000_000,
          maxNewTokens: 16,
          batchSize: 2,
          samplesPerPrompt: 5,
        },
      ],
    };
    const cfg = writeTestConfig(tmp.dir, config, `${run}.yaml`);
    const p = spawnCli(['run', '-c', cfg]);
    expect(await p.exited, p.output().slice(-3_000)).toBe(0);
    const ids = readGenerations(path.join(tmp.dir, 'out', run), 'p').map((r) => r.id);
    expect(duplicates(ids)).toEqual([]);
    expect(ids).toHaveLength(15);
    // One pass: before, batches of the same lines shared a job id, BullMQ dropped all but one,
    // and their samples waited for a second pass.
    const keys = new RunKeys(redis.prefix, run);
    expect(await redis.connection('client').hget(keys.producer('p'), 'epoch')).toBeNull();
  }, 90_000);

  it('batch ids: the same batch the same id; the batches of one prompt distinct', () => {
    const ds = { name: 'B', samplesPerPrompt: 6 };
    const at = (line: number, j: number) => ({ id: `x${line}#s${j}`, line });
    expect(batchIdOf(ds, 0, at(4, 1), at(4, 2))).toBe('B:e0:4.s1-4.s2');
    expect(batchIdOf(ds, 0, at(4, 3), at(4, 4))).not.toBe(batchIdOf(ds, 0, at(4, 1), at(4, 2)));
    expect(batchIdOf(ds, 0, at(4, 5), at(5, 1))).toBe('B:e0:4.s5-5.s1');
    // One sample per prompt: the lines, as before (a real id ending in `#s2` is not read as a sample number).
    expect(batchIdOf({ name: 'B', samplesPerPrompt: 1 }, 2, { id: 'a#s2', line: 7 }, { id: 'b', line: 9 })).toBe(
      'B:e2:7-9',
    );
  });
});
