// The CLI as users run it: `run`, then `status --json`, `pause`, `resume`, `retry-failed`.
import { beforeAll, describe, expect, it } from 'vitest';
import type { RunStatus } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { loopbackPort, startFaultProxy } from '../helpers/fault-proxy.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 100,
    maxRunningRequests: 16,
    seed: 2,
    contextLength: 4096,
    outputLength: { distribution: 'fixed', mean: 40 },
  },
  tmp: true,
  cli: true,
});
let configPath: string;

beforeAll(() => {
  writePrompts(tmp.dir, 'alpha', 30);
  writePrompts(tmp.dir, 'beta', 20, (i) =>
    i === 3 ? { id: 'beta-3', prompt: 'word '.repeat(5000) } : { id: `beta-${i}`, prompt: `beta ${i}` },
  );
  configPath = writeTestConfig(tmp.dir, {
    run: 'cli',
    redis,
    sim,
    sglang: { contextLength: 100_000 },
    datasets: [
      { name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 100_000, maxNewTokens: 64, batchSize: 8 },
      { name: 'beta', prompts: 'beta.jsonl', tokenBudget: 100_000, maxNewTokens: 64, batchSize: 8 },
    ],
  });
});

async function cli(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  if (code !== 0) throw new Error(`tokenmill ${args.join(' ')} exited ${code}:\n${p.output()}`);
  return p.output();
}

describe('CLI: status, pause, resume, retry-failed', () => {
  it('run finishes and status --json prints the documented object', async () => {
    await cli(['run', '-c', configPath]);
    const out = await cli(['status', '-c', configPath, '--json']);
    const status = JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as RunStatus;
    expect(status.run).toBe('cli');
    expect(status.phases.map((p) => p.name)).toEqual(['prepare', 'generate', 'tokenize', 'merge', 'train', 'eval']);
    expect(status.phases.find((p) => p.name === 'generate')?.status).toBe('completed');
    const alpha = status.datasets.find((d) => d.name === 'alpha');
    const beta = status.datasets.find((d) => d.name === 'beta');
    expect(alpha).toMatchObject({
      records: 30,
      outputTokens: 30 * 40,
      tokenBudget: 100_000,
      inFlight: 0,
      failed: 0,
      skipped: 0,
      status: 'completed',
    });
    expect(alpha?.etaSeconds).toEqual({ low: 0, high: 0 });
    expect(typeof alpha?.tokensPerSec).toBe('number');
    // beta-3 is longer than the simulator's context: SGLang's 400 fails it alone.
    expect(beta).toMatchObject({ records: 19, failed: 1, status: 'completed' });
  });

  it('status prints a readable table', async () => {
    const out = await cli(['status', '-c', configPath]);
    expect(out).toMatch(/run cli/);
    expect(out).toMatch(/\[x\] generate/);
    expect(out).toMatch(/alpha\s+completed\s+1,200 \/ 100,000/);
  });

  it('a paused dataset sends nothing and shows paused until resumed', async () => {
    writePrompts(tmp.dir, 'delta', 24);
    const cfg = writeTestConfig(
      tmp.dir,
      {
        run: 'cli-pause',
        redis,
        sim,
        datasets: [{ name: 'delta', prompts: 'delta.jsonl', tokenBudget: 100_000, maxNewTokens: 64, batchSize: 8 }],
      },
      'pause.yaml',
    );
    await cli(['pause', '-c', cfg, 'delta']);
    const run = spawnCli(['run', '-c', cfg]);
    try {
      const statusOf = async (): Promise<RunStatus['datasets'][number] | undefined> =>
        (JSON.parse((await cli(['status', '-c', cfg, '--json'])).trim().split('\n').at(-1) ?? '{}') as RunStatus)
          .datasets[0];
      // The producer has registered the dataset and queued batches, yet nothing is sent.
      await waitFor(
        async () =>
          Number(await redis.connection('client').llen(`${redis.prefix}:cli-pause:q:generate-delta:wait`)) > 0,
        'batches queued',
        30_000,
      );
      expect(await statusOf()).toMatchObject({ status: 'paused', records: 0 });
      expect(sim.stats().requests.filter((r) => r.rid.startsWith('delta/')).length).toBe(0);
      await cli(['resume', '-c', cfg, 'delta']);
      expect(await run.exited, run.output()).toBe(0);
      expect(await statusOf()).toMatchObject({ status: 'completed', records: 24 });
    } finally {
      run.child.kill('SIGKILL');
    }
    await expect(cli(['pause', '-c', cfg, 'nope'])).rejects.toThrow(
      /no dataset "nope" in the config \(datasets: delta\)/,
    );
  });

  it('retry-failed gives failed prompts back, and the next run sends them again', async () => {
    const before = sim.stats().failed;
    const out = await cli(['retry-failed', '-c', configPath, 'beta']);
    expect(out).toMatch(/beta: 1 failed prompt\(s\) will be sent again/);
    await cli(['run', '-c', configPath]);
    // Sent again, failed again for the same reason: one more 400 at the server.
    expect(sim.stats().failed).toBe(before + 1);
    const status = JSON.parse(
      (await cli(['status', '-c', configPath, '--json'])).trim().split('\n').at(-1) ?? '{}',
    ) as RunStatus;
    expect(status.datasets.find((d) => d.name === 'beta')).toMatchObject({ records: 19, failed: 1 });
  });

  it('status lists the live workers by role (host, pid, uptime) and their endpoint health; a stopped worker drops out', async () => {
    const worker = spawnCli(['worker', '-c', configPath, '--role', 'inference']);
    const pid = worker.child.pid ?? -1;
    const line = new RegExp(`^  inference\\s+\\S+:${pid}  up \\d+s, 0 in flight$`, 'm');
    const out = (await waitFor(
      async () => {
        const o = await cli(['status', '-c', configPath]);
        return line.test(o) && /^endpoints: 1\/1 endpoints healthy$/m.test(o) ? o : undefined;
      },
      'the worker in status',
      30_000,
      250,
    )) as string;
    expect(out).toMatch(/^workers: 1 inference$/m);
    const json = JSON.parse(
      (await cli(['status', '-c', configPath, '--json'])).trim().split('\n').at(-1) ?? '{}',
    ) as RunStatus;
    expect(json.workers).toEqual([expect.objectContaining({ role: 'inference', pid, inFlight: 0 })]);
    worker.child.kill('SIGTERM');
    expect(await worker.exited).toBe(0);
    // A clean stop withdraws the heartbeat at once.
    expect(await cli(['status', '-c', configPath])).not.toMatch(/^workers:/m);
  }, 60_000);

  it('status --watch shows a note while Redis is unreachable, keeps the last figures, and recovers by itself', async () => {
    const proxy = await startFaultProxy({ target: { host: '127.0.0.1', port: loopbackPort(redis.url) } });
    try {
      const cfg = writeTestConfig(
        tmp.dir,
        {
          run: 'cli',
          redis: { url: proxy.url('redis'), prefix: redis.prefix },
          sim,
          datasets: [
            { name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 100_000, maxNewTokens: 64, batchSize: 8 },
            { name: 'beta', prompts: 'beta.jsonl', tokenBudget: 100_000, maxNewTokens: 64, batchSize: 8 },
          ],
        },
        'watch.yaml',
      );
      const watch = spawnCli(['status', '-c', cfg, '--watch']);
      const screens = (): string[] => watch.output().split('\x1b[2J\x1b[H');
      await waitFor(() => screens().some((s) => /alpha\s+completed/.test(s)), 'the first table', 30_000, 100);
      await proxy.setMode('refuse');
      const blip = (await waitFor(
        () => screens().find((s) => s.startsWith('! Redis unreachable for')),
        'the note',
        20_000,
        100,
      )) as string;
      expect(blip).toMatch(
        /^! Redis unreachable for \d+s \(.+\); retrying — the figures below are from the last read\n\nrun cli/,
      );
      expect(blip).toMatch(/alpha\s+completed/);
      expect(watch.child.exitCode).toBeNull();
      await proxy.setMode('pass');
      const noted = screens().length;
      await waitFor(
        () =>
          screens()
            .slice(noted)
            .some((s) => s.startsWith('run cli') && /alpha\s+completed/.test(s)),
        'a fresh table without the note',
        30_000,
        100,
      );
      watch.child.kill('SIGINT');
      expect(await watch.exited).toBe(0);
    } finally {
      await proxy.close();
    }
  }, 90_000);

  it('a bad config names the file, line and path', async () => {
    const bad = writeConfig(
      tmp.dir,
      { datasets: [{ name: 'x', prompts: 'alpha.jsonl', tokenBudget: -5 }] } as never,
      'bad.yaml',
    );
    const p = spawnCli(['run', '-c', bad]);
    expect(await p.exited).toBe(1);
    expect(p.output()).toMatch(/bad\.yaml:\d+: datasets\[0\]\.tokenBudget: expected a positive integer.*got -5/);
  });
});
