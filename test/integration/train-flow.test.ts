// With `train` configured, a post-process round is the flow `train ◀ merge ◀ tokenize(<dataset>)`:
// the train job waits for its merge, then a train worker runs it on the merged dataset; a round
// that merges nothing new does not train again. `tokenmill train -c F --from-scratch` (a real
// CLI process) queues a training, runs it and exits 0; without a flag it uses train.mode.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildProgram } from '../../src/cli/main.js';
import { startPostprocess } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import { MERGE_QUEUE, TRAIN_QUEUE, readRunStatus, type ConfigInput } from '../../src/shared/index.js';
import { roundTrainJobId, waitForTrainJob } from '../../src/workers/train/train-jobs.js';
import { TrainWorker } from '../../src/workers/train/worker.js';
import { killCliChildren, spawnCli, writeConfig } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';
import { fakeTrainer, startTrainHarness, type TrainHarness } from '../helpers/train.js';

describe('train ◀ merge ◀ tokenize', () => {
  let h: TrainHarness;
  let ctx: RunContext;
  let input: ConfigInput;
  let envOut: string;
  beforeAll(async () => {
    h = await startTrainHarness();
    const conv = path.join(h.root, 'conv.jsonl');
    writeFileSync(
      conv,
      Array.from({ length: 6 }, (_, i) =>
        JSON.stringify({
          id: `c${i}`,
          conversations: [
            { role: 'user', content: `What is ${i} + ${i}?` },
            { role: 'assistant', content: `It is ${2 * i}.` },
          ],
        }),
      ).join('\n'),
    );
    envOut = path.join(h.root, 'env.json');
    input = {
      run: 'r1',
      redis: { url: h.redis.url, prefix: h.redis.prefix },
      datasets: [{ name: 'd1', conversations: conv }],
      output: { dir: path.join(h.root, 'out') },
      postprocess: { target: path.join(h.root, 'dataset') },
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000 },
      train: {
        command: fakeTrainer('--steps', '4', '--env-out', envOut, '--data', '{dataset}'),
        gpus: 0,
        mode: 'from-scratch',
        preflightPollMs: 300,
      },
    };
    ctx = await openRunContextFor(h.config(input.train ?? { command: [], mode: 'from-scratch' }, input));
  });
  afterAll(async () => {
    await killCliChildren();
    await ctx?.close();
    await h?.close();
  });

  it("trains on the merged dataset once the round's merge is done, and not again for a round with nothing new", async () => {
    const pp = await startPostprocess(ctx, { worker: true, wait: true });
    const queue = new Queue(TRAIN_QUEUE, { connection: ctx.redis, prefix: ctx.keys.bullPrefix });
    const trainJobId = roundTrainJobId(pp.round.flowId);
    const trainJob = await Job.fromId(queue, trainJobId);
    expect(trainJob?.name).toBe('train');
    const deps = await trainJob?.getDependencies();
    const children = [...Object.keys(deps?.processed ?? {}), ...(deps?.unprocessed ?? [])];
    expect(children).toEqual([`${ctx.keys.bullPrefix}:${MERGE_QUEUE}:${pp.round.flowId}`]);
    const outcome = await pp.finished;
    await pp.stop();
    expect(outcome.status).toBe('completed');
    // The merge is done, nobody trains yet: the train job waits in its queue.
    expect(await (await Job.fromId(queue, trainJobId))?.getState()).toBe('waiting');

    const worker = new TrainWorker({
      redisUrl: h.redis.url,
      keys: ctx.keys,
      lockDurationMs: 2_000,
      stalledIntervalMs: 1_000,
      logger: quietLogger(),
    });
    await worker.start();
    try {
      const trained = await waitForTrainJob(ctx.redis, ctx.keys, trainJobId, { pollMs: 100 });
      expect(trained).toMatchObject({
        status: 'completed',
        result: { status: 'completed', attempt: '0001', mode: 'from-scratch' },
      });
      const env = JSON.parse(readFileSync(envOut, 'utf8')) as { argv: string[]; TOKENMILL_TRAIN_DATASET: string };
      expect(env.argv.slice(-2)).toEqual(['--data', path.join(h.root, 'dataset')]);
      expect(env.TOKENMILL_TRAIN_DATASET).toBe(path.join(h.root, 'dataset'));
      const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
      expect(status.phases.find((p) => p.name === 'train')).toMatchObject({ status: 'completed', configured: true });
      expect(status.train).toMatchObject({ jobId: trainJobId, state: 'completed', step: 4, total: 4 });

      // Same data again: the round merges nothing new, and its train job does not train.
      const again = await startPostprocess(ctx, { worker: true, wait: true });
      const o2 = await again.finished;
      await again.stop();
      expect(o2).toMatchObject({ status: 'completed', result: { status: 'nothing-new' } });
      const skipped = await waitForTrainJob(ctx.redis, ctx.keys, roundTrainJobId(again.round.flowId), { pollMs: 100 });
      expect(skipped).toMatchObject({ status: 'completed', result: { status: 'skipped', attempt: null } });
      expect(skipped.status === 'completed' ? skipped.result.reason : '').toContain('merged nothing new');
    } finally {
      await worker.stop();
      await queue.close();
    }
  });

  it('`tokenmill train --from-scratch` runs a training in its own worker and exits 0; a second flag is refused', async () => {
    const file = writeConfig(h.root, input);
    const cli = spawnCli(['train', '-c', file, '--from-scratch']);
    expect(await cli.exited).toBe(0);
    expect(cli.output()).toMatch(/train job r1-train-1 queued: from-scratch \(--from-scratch\)/);
    expect(cli.output()).toMatch(/train: completed, attempt 0002 \(from-scratch\) on CPU/);
    expect(cli.output()).toMatch(/loss {9}4\.0000 -> 1\.0000/);
    await expect(
      buildProgram().parseAsync(['node', 'tokenmill', 'train', '-c', file, '--from-scratch', '--resume']),
    ).rejects.toThrow('train: choose one of --from-scratch or --resume, not both');
  }, 90_000);
});
