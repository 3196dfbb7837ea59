// `retry-failed` while a producer runs (issue 7, defect 8): one atomic script gives the
// failures back (none recorded meanwhile is lost), and the running producer sends them again.
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { RunKeys, loadConfig, readRunStatus } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, writeConfig, writePrompts } from '../helpers/pipeline.js';

const { redis, scripts: r, tmp, startSim } = useHarness({ scripts: true, tmp: true, cli: true });

function retry(keys: RunKeys, ds: string): Promise<number> {
  return r.retryFailed(keys.failed(ds), keys.attempts(ds), keys.stats(ds), keys.producer(ds));
}

describe('retry-failed-4.lua', () => {
  it('gives back exactly the failures it read, with their attempts; a failure recorded after it keeps its entry', async () => {
    const keys = new RunKeys(redis.prefix, 'lua-retry');
    await r.hset(keys.failed('ds'), 'a', '{"reason":"x"}', 'b', '{"reason":"y"}');
    await r.hset(keys.attempts('ds'), 'a', 3, 'b', 3, 'c', 1);
    expect(await retry(keys, 'ds')).toBe(2);
    expect(await r.hlen(keys.failed('ds'))).toBe(0);
    // The attempts of the prompts given back are reset; another prompt's are untouched.
    expect(await r.hgetall(keys.attempts('ds'))).toEqual({ c: '1' });
    expect(await r.hget(keys.producer('ds'), 'retryGen')).toBe('1');
    expect(await r.hget(keys.stats('ds'), 'status')).toBe('in_progress');
    // A failure recorded after the script is not touched by it.
    expect(
      await r.failSample(
        keys.done('ds'),
        keys.failed('ds'),
        keys.inflight('ds'),
        keys.inflight('ds'),
        keys.attempts('ds'),
        keys.skipped('ds'),
        'c',
        '{"reason":"z"}',
        'rid-c',
      ),
    ).toBe(1);
    expect(await r.hkeys(keys.failed('ds'))).toEqual(['c']);
    expect(await retry(keys, 'empty')).toBe(0);
    // More than one unpack() slice.
    const many = Array.from({ length: 2_500 }, (_, i) => [`m${i}`, '{}']).flat();
    await r.hset(keys.failed('big'), ...many);
    expect(await retry(keys, 'big')).toBe(2_500);
    expect(await r.exists(keys.failed('big'))).toBe(0);
  });

  it('complete-dataset refuses while a retry came in after the pass began', async () => {
    const keys = new RunKeys(redis.prefix, 'lua-complete');
    expect(await r.completeDataset(keys.stats('ds'), keys.producer('ds'), '0', 'exhausted')).toBe(1);
    await r.hset(keys.failed('ds'), 'a', '{}');
    await retry(keys, 'ds');
    expect(await r.hget(keys.stats('ds'), 'status')).toBe('in_progress');
    expect(await r.completeDataset(keys.stats('ds'), keys.producer('ds'), '0', 'exhausted')).toBe(0);
    expect(await r.hget(keys.stats('ds'), 'status')).toBe('in_progress');
    expect(await r.completeDataset(keys.stats('ds'), keys.producer('ds'), '1', 'exhausted')).toBe(1);
    // The budget completes a dataset whatever the retries.
    expect(await r.completeDataset(keys.stats('ds'), keys.producer('ds'), '', 'budget')).toBe(1);
    expect(await r.hget(keys.stats('ds'), 'completedReason')).toBe('budget');
  });

  it('the CLI loses no failure recorded while it runs (the old HKEYS-then-DEL dropped them)', async () => {
    writePrompts(tmp.dir, 'race', 3);
    const cfg = writeTestConfig(
      tmp.dir,
      {
        run: 'race',
        redis,
        sim: 'http://127.0.0.1:9',
        datasets: [{ name: 'race', prompts: 'race.jsonl', tokenBudget: 1_000 }],
      },
      'race.yaml',
    );
    const keys = new RunKeys(redis.prefix, 'race');
    const writer = redis.connection();
    let stop = false;
    let written = 0;
    // Failures land continuously, as workers record them, until the CLI has finished.
    const writing = (async () => {
      while (!stop) {
        const p = writer.pipeline();
        for (let i = 0; i < 50; i += 1) p.hset(keys.failed('race'), `f${written + i}`, '{"reason":"500"}');
        await p.exec();
        written += 50;
      }
    })();
    await waitFor(async () => (await r.hlen(keys.failed('race'))) > 1_000, 'failures recorded');
    const cli = spawnCli(['retry-failed', '-c', cfg, 'race']);
    const code = await cli.exited;
    stop = true;
    await writing;
    expect(code, cli.output()).toBe(0);
    const given = Number(/race: (\d+) failed prompt\(s\) will be sent again/.exec(cli.output())?.[1] ?? NaN);
    expect(given).toBeGreaterThan(1_000);
    // Every failure ever recorded was either given back (and said so) or is still recorded.
    expect(given + (await r.hlen(keys.failed('race')))).toBe(written);
  }, 60_000);
});

describe('retry-failed while a producer runs', () => {
  it('the running producer sends the given-back prompts again: all commit, none failed, no duplicates', async () => {
    const s = await startSim({
      timeScale: 20,
      maxRunningRequests: 8,
      seed: 11,
      outputLength: { distribution: 'fixed', mean: 300 },
    });
    const n = 400;
    writePrompts(tmp.dir, 'flaky', n);
    const yaml = {
      run: 'flaky',
      redis: { url: redis.url, prefix: redis.prefix },
      sglang: { endpoints: [s.url], concurrency: 8, maxAttempts: 1, requestTimeoutMs: 30_000 },
      datasets: [
        { name: 'flaky', prompts: 'flaky.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 1024, batchSize: 8 },
      ],
      output: { dir: 'out' },
      workers: { shutdownGraceMs: 2_000 },
    };
    const cfgPath = writeConfig(tmp.dir, yaml as never, 'flaky.yaml');
    const cfg = loadConfig({ baseDir: tmp.dir, object: yaml });
    // One attempt per prompt: every 500 fails its prompt.
    s.setFaults({ errorRate: 0.3 });
    const ctx = await openRunContextFor(cfg);
    const handle = await startGeneration(ctx, { produce: true, infer: true });
    let finished = false;
    void handle.finished.then(
      () => (finished = true),
      () => (finished = true),
    );
    const hlenFailed = (): Promise<number> => ctx.redis.hlen(ctx.keys.failed('flaky'));
    const records = async (): Promise<number> =>
      Number((await ctx.redis.hget(ctx.keys.stats('flaky'), 'records')) ?? 0);
    try {
      await waitFor(async () => (await hlenFailed()) >= 10, 'failures recorded', 90_000);
      s.clearFaults();
      // Every request answered before the faults were cleared has been handled by the worker
      // once two windows' worth of later requests have committed.
      const base = await records();
      await waitFor(async () => (await records()) >= base + 16, 'commits after the faults cleared', 90_000);
      const failedBefore = await hlenFailed();
      const cli = spawnCli(['retry-failed', '-c', cfgPath, 'flaky']);
      expect(await cli.exited, cli.output()).toBe(0);
      expect(cli.output()).toMatch(new RegExp(`flaky: ${failedBefore} failed prompt\\(s\\) will be sent again`));
      // The producer was still at work: the retry had to be picked up by it, not by a new run.
      expect(finished).toBe(false);
      await handle.finished;
    } finally {
      await handle.stop();
    }
    try {
      const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
      expect(status.datasets[0]).toMatchObject({ records: n, failed: 0, status: 'completed' });
      const lines = readGenerations(ctx.runDir, 'flaky');
      expect(lines.length).toBe(n);
      expect(duplicates(lines.map((l) => l.id))).toEqual([]);
    } finally {
      await ctx.close();
    }
  }, 240_000);
});
