// Hidden states sized before they are written (train.steps[].hiddenStates), with a real train
// worker, real Redis and the fake trainer: a step whose estimate exceeds the file system's size
// fails at once without its command running; one that fits runs, its estimate in `status`,
// /metrics and the lines printed when the chain is queued; on a small tmpfs (mounting needs
// root: skipped elsewhere, saying why) a step short of free space waits, `status --json` and
// `status` show the estimate and the reason, and it starts by itself once space frees.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { renderMetrics } from '../../src/dashboard/metrics.js';
import { DatasetIndex, readDatasetMeta, writeHfDataset, type HfRow } from '../../src/shared/hf-dataset/index.js';
import {
  formatRunStatus,
  readRunStatus,
  type ConfigInput,
  type RunStatus,
  type TrainStatus,
} from '../../src/shared/index.js';
import { describeHiddenStatesAtQueue } from '../../src/workers/train/hidden-states.js';
import { cancelTrainJobs, trainPayloadOf } from '../../src/workers/train/train-jobs.js';
import { spawnCli, writeConfig } from '../helpers/pipeline.js';
import { fakeTrainer, startTrainHarness, waitForStatus, type TrainHarness } from '../helpers/train.js';

/** 12 rows of 30 tokens: 360 tokens. */
function rows(n: number): HfRow[] {
  return Array.from({ length: n }, (_, i) => {
    const input_ids = Array.from({ length: 30 }, (_, k) => 100 + i + k);
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

function writeModel(dir: string, hiddenSize: number): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ hidden_size: hiddenSize, num_hidden_layers: 36 }));
  return dir;
}

describe('train.steps[].hiddenStates', () => {
  let h: TrainHarness;
  let mounted: string | undefined;
  let models: string;
  beforeAll(async () => {
    h = await startTrainHarness();
    const dataset = path.join(h.root, 'dataset');
    await writeHfDataset(dataset, rows(12), { shardSizeMiB: 1 });
    // As a merge leaves it: the shards' index files carry their token counts.
    await (await DatasetIndex.open(dataset, (await readDatasetMeta(dataset)).shards, { persist: true })).close();
    models = path.join(h.root, 'models');
    writeModel(path.join(models, 'huge'), 1_000_000_000_000);
    writeModel(path.join(models, 'small'), 256);
    writeModel(path.join(models, 'mid'), 1024);
    await h.worker();
  });
  afterAll(async () => {
    if (mounted !== undefined) execFileSync('umount', ['-l', mounted]);
    await h?.close();
  });

  const train = (marker: string, model: string, extra: Record<string, unknown> = {}) => ({
    steps: [
      {
        name: 'extract',
        command: fakeTrainer('--steps', '2', '--count', marker, '--name', 'extract'),
        hiddenStates: { model, ...extra },
      },
      { name: 'train', command: fakeTrainer('--steps', '2', '--count', marker, '--name', 'train') },
    ],
    gpus: 0,
    mode: 'from-scratch' as const,
  });

  it("an estimate beyond the file system's size fails the step at once, in one line; no command runs", async () => {
    const marker = path.join(h.root, 'refused-ran.txt');
    const config = h.config(train(marker, path.join(models, 'huge')));
    const jobId = await h.queue(config);
    const outcome = await h.wait(jobId);
    expect(outcome.status).toBe('failed');
    const reason = outcome.status === 'failed' ? outcome.reason : '';
    expect(reason).not.toContain('\n');
    expect(reason).toMatch(
      /^r1-train-\d+-extract: step extract: hidden states ≈ 2\.9 PB \(360 tokens × \(1,000,000,000,000 hidden × 4 layers × 2 B bfloat16 \+ 16 B\)\), 3\.0 PB with the 5% margin, cannot fit on \/\S*: its file system is [\d.]+ [kMGT]?B in all \(train\.steps\[0\]\.hiddenStates; tokens of .*dataset, hidden size from .*huge\/config\.json\)$/,
    );
    expect(existsSync(marker)).toBe(false);
    const status = await h.status();
    expect(status?.state).toBe('failed');
    expect(status?.hiddenStates).toMatchObject([
      { step: 'extract', verdict: 'refused', tokens: 360, tokensFrom: 'merge index', hiddenSize: 1e12, layers: 4 },
    ]);
  });

  it('an estimate that fits runs the chain; status, /metrics and the queue-time lines show it', async () => {
    const marker = path.join(h.root, 'fits-ran.txt');
    const config = h.config(train(marker, path.join(models, 'small')));
    const payload = trainPayloadOf(config, h.runDir(config), { origin: 'cli' });
    const [line] = await describeHiddenStatesAtQueue(payload);
    expect(line).toMatch(
      /^step extract: hidden states ≈ 743 kB \(360 tokens × \(256 hidden × 4 layers × 2 B bfloat16 \+ 16 B\)\); \/\S*: [\d.]+ [kMGT]?B free of [\d.]+ [kMGT]?B — fits$/,
    );
    const outcome = await h.wait(await h.queue(config));
    expect(outcome).toMatchObject({ status: 'completed', result: { step: 'train' } });
    expect(readFileSync(marker, 'utf8')).toBe('extract\ntrain\n');
    const status = (await h.status()) as TrainStatus;
    expect(status.hiddenStates).toHaveLength(1);
    expect(status.hiddenStates[0]).toMatchObject({
      step: 'extract',
      stepIndex: 0,
      steps: 2,
      verdict: 'fits',
      bytes: 360 * (256 * 4 * 2 + 16),
      tokens: 360,
      hiddenSize: 256,
      dtype: 'bfloat16',
      configFile: path.join(models, 'small', 'config.json'),
    });
    const log = readFileSync(
      path.join(h.runDir(config), 'train', status.attempt ?? '', 'extract', 'train.log'),
      'utf8',
    );
    expect(log).toContain('step 2/2');
    const metrics = await renderMetrics(h.redis.connection(), h.keys, config);
    expect(metrics.body).toContain(`tokenmill_train_step_hidden_states_bytes{run="r1",step="extract"} ${360 * 2064}`);
  });

  it('short of free space it waits, status (text and --json) saying why, and starts by itself once space frees', async (ctx) => {
    const mount = path.join(h.root, 'small-fs');
    mkdirSync(mount, { recursive: true });
    try {
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', mount], { stdio: 'pipe' });
    } catch (e: unknown) {
      ctx.skip(
        `cannot mount a 4 MiB tmpfs here (${String((e as Error).message).split('\n')[0]}): the wait needs a file system whose free space the test controls`,
      );
    }
    mounted = mount;
    const real = realpathSync(mount);
    // 2.5 MiB taken: about 1.7 MB free, short of the 3.1 MB needed (the 3.0 MB estimate + 5 %).
    const filler = path.join(mount, 'filler');
    writeFileSync(filler, Buffer.alloc(2.5 * 1024 * 1024, 1));
    const marker = path.join(h.root, 'waited-ran.txt');
    const input: ConfigInput = {
      run: 'r1',
      redis: { url: h.redis.url, prefix: h.redis.prefix },
      datasets: [{ name: 'd1', conversations: 'conv.jsonl' }],
      output: { dir: mount },
      postprocess: { target: path.join(h.root, 'dataset') },
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000 },
      train: { preflightPollMs: 300, cancelGraceMs: 1_000, ...train(marker, 'models/mid') },
    };
    const config = h.config(train(marker, 'models/mid'), { output: { dir: mount } });
    const jobId = await h.queue(config);
    try {
      const waiting = await waitForStatus(h, (s) => s.state === 'waiting', 'the step to wait for free space');
      expect(waiting.jobId).toBe(`${jobId}-extract`);
      expect(waiting.waiting).toMatch(
        new RegExp(
          `^hidden states ≈ 3\\.0 MB \\(360 tokens × \\(1,024 hidden × 4 layers × 2 B bfloat16 \\+ 16 B\\)\\), ${real} has 1\\.\\d MB free; step extract waits for 3\\.1 MB \\(the estimate \\+ 5% margin\\)$`,
        ),
      );
      expect(existsSync(marker)).toBe(false);

      const cfgFile = writeConfig(h.root, input, 'hidden-states.yaml');
      const cli = spawnCli(['status', '--json', '-c', cfgFile]);
      expect(await cli.exited, cli.output()).toBe(0);
      const json = JSON.parse(cli.stdout()) as RunStatus;
      expect(json.train?.state).toBe('waiting');
      expect(json.train?.waiting).toBe(waiting.waiting);
      expect(json.train?.hiddenStates).toMatchObject([
        {
          step: 'extract',
          verdict: 'waiting',
          bytes: 360 * (1024 * 4 * 2 + 16),
          tokens: 360,
          hiddenSize: 1024,
          layers: 4,
          dtype: 'bfloat16',
          disk: { path: real, totalBytes: 4 * 1024 * 1024 },
        },
      ]);
      const text = formatRunStatus(await readRunStatus(h.redis.connection(), h.keys, config));
      expect(text).toMatch(
        new RegExp(
          `^  train step extract: hidden states ≈ 3\\.0 MB \\(360 tokens .*\\); ${real}: 1\\.\\d MB free of 4\\.2 MB — waiting for 3\\.1 MB free$`,
          'm',
        ),
      );

      rmSync(filler);
      const outcome = await h.wait(jobId);
      expect(outcome).toMatchObject({ status: 'completed', result: { step: 'train' } });
      expect(readFileSync(marker, 'utf8')).toBe('extract\ntrain\n');
      expect((await h.status())?.hiddenStates[0]).toMatchObject({ step: 'extract', verdict: 'fits' });
    } finally {
      await cancelTrainJobs(h.redis.connection(), h.keys);
    }
  }, 60_000);
});
