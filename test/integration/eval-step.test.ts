// The eval step after every training: with an `eval` section, a train job is the child of an
// eval job (`eval ◀ train`) that a train worker's eval worker runs once the attempt completed. Here
// eval.server starts two real `tokenmill sim` child processes per attempt (one decoding
// speculatively with the attempt's drafter, one the target alone), after the GPU preflight; the
// step writes the attempt's eval.json, and status (text and --json), /metrics and the dashboard's
// /api data show it, each saying the figures are the simulator's configured acceptance (the
// simulators announce themselves); a second attempt is compared with the first; a weak drafter warns
// and fails the eval job on eval.minSpeedup while its training stays completed.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import path from 'node:path';
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EVAL_CHECK_FAILED_EXIT, evalTokenizer } from '../../src/cli/commands/eval.js';
import { freePort } from '../../src/cli/commands/demo-train.js';
import { renderMetrics } from '../../src/dashboard/metrics.js';
import { startDashboard } from '../../src/dashboard/server.js';
import {
  EVAL_QUEUE,
  TRAIN_QUEUE,
  TrainKeys,
  evalJobId,
  formatRunStatus,
  readRunStatus,
  type Config,
  type ConfigInput,
  type RunStatus,
} from '../../src/shared/index.js';
import { EvalWorker, portFree, waitForEvalJob, writeEvalStatus, type EvalReport } from '../../src/workers/index.js';
import { recordedIdentity } from '../../src/workers/gpu/index.js';
import { killCliChildren, spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';
import { simCommand } from '../helpers/sim-command.js';
import { alive, fakeTrainer, startTrainHarness, type TrainHarness } from '../helpers/train.js';

const SIM = [
  '--port',
  '{port}',
  '--time-scale',
  '20',
  '--seed',
  '7',
  '--output-distribution',
  'fixed',
  '--mean-output-tokens',
  '120',
];
const PROMPTS = 6;

let h: TrainHarness;
let ports: [number, number];
let strong: Config;
let weak: Config;
let evalWorker: EvalWorker;

/** The eval section of the tests: the two simulators, started for each attempt on `ports`. */
function evalWith(
  speculative: string[],
  extra: Partial<NonNullable<ConfigInput['eval']>> = {},
): NonNullable<ConfigInput['eval']> {
  return {
    server: {
      command: simCommand(
        ...SIM,
        '--speculative-algorithm',
        'EAGLE3',
        '--speculative-draft-model-path',
        '{checkpoint}',
        ...speculative,
      ),
      baselineCommand: simCommand(...SIM),
      port: ports[0],
      baselinePort: ports[1],
      gpus: 1,
      minFreeGpuMemMiB: 20_000,
      healthTimeoutMs: 60_000,
      stopGraceMs: 5_000,
    },
    concurrency: 4,
    maxNewTokens: 128,
    ...extra,
  };
}

const TRAIN = { command: fakeTrainer('--steps', '4', '--save-every', '2'), gpus: 0, mode: 'from-scratch' } as const;
const DATASETS = [{ name: 'ds', prompts: 'prompts.jsonl', tokenBudget: 1_000_000 }];

function configWith(speculative: string[], extra: Partial<NonNullable<ConfigInput['eval']>> = {}): Config {
  return h.config(
    { ...TRAIN, command: [...TRAIN.command] },
    { datasets: DATASETS, eval: evalWith(speculative, extra) },
  );
}

/** Trains one attempt with `config` and waits for its eval job. */
async function trainAndEvaluate(config: Config) {
  const jobId = await h.queue(config, { mode: 'from-scratch' });
  const trained = await h.wait(jobId, 60_000);
  expect(trained.status, JSON.stringify(trained)).toBe('completed');
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 120_000);
  try {
    const evaluated = await waitForEvalJob(h.redis.connection(), h.keys, evalJobId(jobId), {
      signal: ac.signal,
      pollMs: 100,
    });
    return { jobId, trained, evaluated };
  } finally {
    clearTimeout(timer);
  }
}

const status = (config: Config): Promise<RunStatus> => readRunStatus(h.redis.connection(), h.keys, config);

beforeAll(async () => {
  h = await startTrainHarness();
  ports = [await freePort(), await freePort()];
  while (ports[1] === ports[0]) ports[1] = await freePort();
  writePrompts(h.root, 'prompts', 4);
  strong = configWith(['--speculative-acceptance', '3']);
  weak = configWith(['--speculative-acceptance', '1.2', '--speculative-draft-overhead', '1'], { minSpeedup: 1 });
  // The held-out prompts the eval step sends (written by datasets[].evalHoldout in a real run).
  mkdirSync(path.join(h.runDir(strong), 'ds'), { recursive: true });
  writePrompts(path.join(h.runDir(strong), 'ds'), 'eval-prompts', PROMPTS);
  // Two GPUs (one per server), short of the 20,000 MiB free each needs: the eval job waits until it frees.
  h.setGpus({
    driver: '550.54.15',
    gpus: [0, 1].map(() => ({ name: 'NVIDIA H100 80GB HBM3', totalMiB: 81_559, freeMiB: 9_000 })),
  });
  await h.worker();
  evalWorker = new EvalWorker({
    redisUrl: h.redis.url,
    keys: h.keys,
    config: strong,
    loadTokenizer: evalTokenizer,
    lockDurationMs: 5_000,
    stalledIntervalMs: 5_000,
    logger: quietLogger(),
  });
  await evalWorker.start();
}, 60_000);

afterAll(async () => {
  await killCliChildren();
  await evalWorker?.stop();
  await h?.close();
});

describe('eval ◀ train', () => {
  it('evaluates the completed attempt on the servers it starts: eval.json, status, --json, /metrics and /api', async () => {
    const jobId = await h.queue(strong, { mode: 'from-scratch' });
    // The flow: the train job under its eval job, which waits for it.
    const evalQueue = new Queue(EVAL_QUEUE, { connection: h.redis.connection(), prefix: h.keys.bullPrefix });
    try {
      const evalJob = await Job.fromId(evalQueue, evalJobId(jobId));
      expect(evalJob?.name).toBe('eval');
      const deps = await evalJob?.getDependencies();
      expect([...Object.keys(deps?.processed ?? {}), ...(deps?.unprocessed ?? [])]).toEqual([
        `${h.keys.bullPrefix}:${TRAIN_QUEUE}:${jobId}`,
      ]);
    } finally {
      await evalQueue.close();
    }
    expect(await h.wait(jobId, 60_000)).toMatchObject({ status: 'completed', result: { attempt: '0001' } });

    // The GPU preflight holds the servers back, saying why, until memory frees.
    const waiting = await (async () => {
      for (let i = 0; i < 100; i++) {
        const s = await status(strong);
        if (s.eval?.job?.state === 'waiting') return s;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error('the eval job never waited for GPU memory');
    })();
    expect(waiting.eval?.job?.waiting).toBe(
      'eval servers: 2 GPU(s) with 20,000 MiB free needed, 0 have it — GPU 0: 9,000 MiB free, 20,000 needed; GPU 1: 9,000 MiB free, 20,000 needed',
    );
    expect(waiting.phases.find((p) => p.name === 'eval')).toMatchObject({ status: 'pending', configured: true });
    h.setGpus({
      driver: '550.54.15',
      gpus: [0, 1].map(() => ({ name: 'NVIDIA H100 80GB HBM3', totalMiB: 81_559, freeMiB: 70_000 })),
    });

    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 120_000);
    const evaluated = await waitForEvalJob(h.redis.connection(), h.keys, evalJobId(jobId), {
      signal: ac.signal,
      pollMs: 100,
    }).finally(() => clearTimeout(timer));
    expect(evaluated.status, JSON.stringify(evaluated)).toBe('completed');
    const attemptDir = path.join(h.runDir(strong), 'train', '0001');
    const drafter = path.join(attemptDir, 'checkpoints', 'step-4');
    expect(evaluated.status === 'completed' && evaluated.result).toMatchObject({
      status: 'completed',
      attempt: '0001',
      drafter,
      report: path.join(attemptDir, 'eval.json'),
    });
    const report = JSON.parse(readFileSync(path.join(attemptDir, 'eval.json'), 'utf8')) as EvalReport;
    expect(report).toMatchObject({ attempt: '0001', drafter, ok: true, previous: null, warnings: [] });
    expect(report.endpoints[0]).toMatchObject({ url: `http://127.0.0.1:${ports[0]}`, draftModelPath: drafter });
    expect(report.baseline?.[0]?.url).toBe(`http://127.0.0.1:${ports[1]}`);
    expect(report.datasets[0]?.drafter.requests).toBe(PROMPTS);
    expect(report.overall.drafter.acceptLength).toBeGreaterThan(2.5);
    expect(report.overall.speedup).toBeGreaterThan(1.3);
    // The simulators announced themselves: the figures are their configured acceptance, and say so.
    expect(report).toMatchObject({
      source: 'simulator',
      simulated: { acceptanceConfigured: true, datasets: { ds: 3 } },
    });
    // The servers logged to the attempt folder and are gone: their ports are free again.
    expect(readFileSync(path.join(attemptDir, 'eval-server-drafter.log'), 'utf8')).toContain(
      `SGLang simulator listening on http://127.0.0.1:${ports[0]}`,
    );
    expect(existsSync(path.join(attemptDir, 'eval-server-baseline.log'))).toBe(true);
    expect(await portFree(ports[0])).toBe(true);
    expect(await portFree(ports[1])).toBe(true);

    const s = await status(strong);
    expect(s.phases.map((p) => p.name)).toEqual(['prepare', 'generate', 'tokenize', 'merge', 'train', 'eval']);
    const phase = s.phases.find((p) => p.name === 'eval');
    expect(phase).toMatchObject({ status: 'completed', configured: true });
    expect(phase?.detail).toMatch(/^attempt 0001 \(SIMULATED\): accept len \d\.\d\d, speed-up \d\.\d\dx$/);
    // --json: the attempt's eval.json, whole, and the series.
    const json = JSON.parse(JSON.stringify(s)) as RunStatus;
    expect(json.eval?.report).toEqual(report);
    expect(json.eval?.attempts.map((a) => [a.attempt, a.source])).toEqual([['0001', 'simulator']]);
    expect(json.eval?.job).toMatchObject({ jobId: evalJobId(jobId), state: 'completed', attempt: '0001' });
    const text = formatRunStatus(s);
    expect(text).toContain('eval of attempt 0001: passed (simulated ');
    expect(text).toContain(
      "\n  SIMULATED: the acceptance is the simulator's configured one (accept len 3.00), not measured from the drafter;",
    );
    expect(text).toMatch(/^ {2}ds {2}accept len \d\.\d\d, speed-up \d\.\d\dx, configured 3\.00$/m);

    const metrics = (await renderMetrics(h.redis.connection(), h.keys, strong)).body;
    const acceptLine = new RegExp(
      `^tokenmill_eval_accept_length\\{run="r1",attempt="0001",dataset="overall"\\} ([\\d.]+)$`,
      'm',
    );
    expect(Number(acceptLine.exec(metrics)?.[1])).toBeCloseTo(report.overall.drafter.acceptLength ?? 0, 6);
    expect(metrics).toMatch(/^tokenmill_eval_speedup\{run="r1",attempt="0001",dataset="ds"\} [\d.]+$/m);
    expect(metrics).toMatch(/^tokenmill_eval_simulated\{run="r1",attempt="0001"\} 1$/m);
    expect(metrics).toMatch(
      /^tokenmill_eval_tokens_per_second\{run="r1",attempt="0001",dataset="overall",phase="baseline"\} [\d.]+$/m,
    );

    // The pipeline page's data: the per-attempt series, from the dashboard's /api/status.
    const dashboard = await startDashboard({
      redis: h.redis.connection(),
      keys: h.keys,
      config: strong,
      host: '127.0.0.1',
      port: 0,
      token: 'eval-step-token-0123456789abcdef',
      logger: quietLogger(),
    });
    try {
      const res = await fetch(new URL('/api/status', dashboard.url), {
        headers: { authorization: 'Bearer eval-step-token-0123456789abcdef' },
      });
      const api = (await res.json()) as RunStatus;
      expect(api.eval?.attempts).toEqual([
        expect.objectContaining({
          attempt: '0001',
          acceptLength: report.overall.drafter.acceptLength,
          ok: true,
          source: 'simulator',
        }),
      ]);
    } finally {
      await dashboard.stop();
    }
  }, 240_000);

  it('a second attempt is compared with the first: the deltas in the report and in status', async () => {
    const { evaluated } = await trainAndEvaluate(strong);
    expect(evaluated.status).toBe('completed');
    const report = evaluated.report;
    expect(report?.attempt).toBe('0002');
    expect(report?.previous).toMatchObject({ attempt: '0001', comparable: true });
    expect(report?.overall.delta?.acceptLength).not.toBeNull();
    expect(report?.datasets[0]?.delta?.speedup).not.toBeNull();
    const s = await status(strong);
    expect(s.eval?.attempts.map((a) => a.attempt)).toEqual(['0001', '0002']);
    const text = formatRunStatus(s);
    expect(text).toContain('eval of attempt 0002: passed (simulated ');
    expect(text).toContain(', changes since attempt 0001)');
    expect(text).toMatch(
      /^ {2}ds {2}accept len \d\.\d\d \([+-]\d\.\d\d\), speed-up \d\.\d\dx \([+-]\d\.\d\d\), configured 3\.00$/m,
    );
  }, 240_000);

  it('a weak drafter: the warning in status, the eval job failed on eval.minSpeedup, the training completed', async () => {
    const { trained, evaluated } = await trainAndEvaluate(weak);
    expect(trained).toMatchObject({ status: 'completed', result: { attempt: '0003' } });
    expect(evaluated.status).toBe('failed');
    expect(evaluated.status === 'failed' ? evaluated.reason : '').toMatch(
      /^eval attempt 0003: speed-up 0\.\d\dx \([\d.]+ vs [\d.]+ tok\/s\) is below eval\.minSpeedup 1 \(report .*0003\/eval\.json\)$/,
    );
    expect(evaluated.report).toMatchObject({ attempt: '0003', ok: false });
    expect(evaluated.report?.warnings.some((w) => w.includes('acceptance length fell by'))).toBe(true);
    const s = await status(weak);
    expect(s.train).toMatchObject({ state: 'completed', attempt: '0003' });
    expect(s.phases.find((p) => p.name === 'train')?.status).toBe('completed');
    expect(s.phases.find((p) => p.name === 'eval')).toMatchObject({ status: 'failed' });
    expect(s.phases.find((p) => p.name === 'eval')?.detail).toMatch(/, FAILED: speed-up 0\.\d\dx/);
    const text = formatRunStatus(s);
    expect(text).toContain('eval of attempt 0003: FAILED');
    expect(text).toMatch(/^ {2}WARNING: dataset ds: the drafter makes decoding slower: [\d.]+ vs [\d.]+ tok\/s/m);
    expect(text).toMatch(/^ {2}FAILED: speed-up 0\.\d\dx .* is below eval\.minSpeedup 1$/m);
    expect(s.eval?.attempts.map((a) => [a.attempt, a.ok])).toEqual([
      ['0001', true],
      ['0002', true],
      ['0003', false],
    ]);
  }, 240_000);

  it('`tokenmill train` waits for the eval after its training, prints its table, and exits 3 below minSpeedup', async () => {
    const file = writeConfig(
      h.root,
      {
        run: 'r1',
        redis: { url: h.redis.url, prefix: h.redis.prefix },
        datasets: DATASETS,
        output: { dir: path.join(h.root, 'out') },
        postprocess: { target: path.join(h.root, 'dataset') },
        workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000 },
        train: { ...TRAIN, command: [...TRAIN.command], preflightPollMs: 300 },
        eval: evalWith(['--speculative-acceptance', '1.2', '--speculative-draft-overhead', '1'], { minSpeedup: 1 }),
      },
      'weak.yaml',
    );
    const cli = spawnCli(['train', '-c', file, '--from-scratch']);
    expect(await cli.exited, cli.output().slice(-3_000)).toBe(EVAL_CHECK_FAILED_EXIT);
    const out = cli.stdout();
    expect(out).toMatch(/^train: completed, attempt 0004 \(from-scratch\) on CPU$/m);
    expect(out).toMatch(/^eval: attempt 0004, drafter .*\/train\/0004\/checkpoints\/step-4$/m);
    expect(out).toContain('  compared with attempt 0003\n');
    // Beside the acceptance the simulator gave, the one it was configured with.
    expect(out).toMatch(/^ {2}SIMULATED: the acceptance is the simulator's configured one \(accept len 1\.20\)/m);
    expect(out).toMatch(/^ds +6 +1\.\d\d +1\.20 +0\.\d{3} +[\d.]+ +[\d.]+ +0\.\d\dx +[+-]\d\.\d\d +[+-]\d\.\d\d +0$/m);
    expect(out).toMatch(/^WARNING: dataset ds: the drafter makes decoding slower: /m);
    expect(out).toMatch(
      /^eval: failed — eval attempt 0004: speed-up 0\.\d\dx .* is below eval\.minSpeedup 1 \(report /m,
    );
    // Its progress on stderr: the training, then the eval step's servers and phases.
    expect(cli.output()).toMatch(/tokenmill: eval attempt 0004: ds: drafter, 6 prompts, 4 in flight/);
  }, 180_000);

  it('kills the servers a dead worker left behind on this machine before it measures again', async () => {
    // A server group the eval job recorded, as if its worker had been SIGKILLed while measuring.
    const leftover = spawn('sleep', ['600'], { detached: true, stdio: 'ignore' });
    leftover.unref();
    const pgid = leftover.pid ?? 0;
    const next = `r1-train-${Number(await h.redis.connection().get(new TrainKeys(h.keys).counter())) + 1}`;
    await writeEvalStatus(
      h.redis.connection(),
      h.keys,
      evalJobId(next),
      {
        state: 'running',
        host: hostname(),
        servers: `drafter http://127.0.0.1:${ports[0]} pid ${pgid}`,
        // Recorded with its identity, as the eval job records its servers: killed only when it still matches.
        serverGroups: recordedIdentity(pgid),
      },
      'in_progress',
      true,
    );
    expect(alive(pgid)).toBe(true);
    const { jobId, evaluated } = await trainAndEvaluate(strong);
    expect(jobId).toBe(next);
    expect(evaluated.status).toBe('completed');
    expect(alive(pgid)).toBe(false);
  }, 180_000);

  it('stops its servers when the worker is told to stop, and hands the job back', async () => {
    // A slow simulated GPU: the measurement is still running when the worker stops.
    const slow = h.config(strong.train as NonNullable<ConfigInput['train']>, {
      datasets: [{ name: 'ds', prompts: 'prompts.jsonl', tokenBudget: 1_000_000 }],
      eval: {
        ...(strong.eval as NonNullable<ConfigInput['eval']>),
        server: {
          ...(strong.eval?.server as NonNullable<NonNullable<ConfigInput['eval']>['server']>),
          command: simCommand(
            ...SIM.map((a) => (a === '20' ? '0.2' : a)),
            '--speculative-algorithm',
            'EAGLE3',
            '--speculative-draft-model-path',
            '{checkpoint}',
          ),
        },
      },
    });
    const jobId = await h.queue(slow, { mode: 'from-scratch' });
    expect(await h.wait(jobId, 60_000)).toMatchObject({ status: 'completed' });
    const servers = await (async () => {
      for (let i = 0; i < 600; i++) {
        const e = (await status(slow)).eval?.job;
        if (e?.jobId === evalJobId(jobId) && e.servers.length === 2) return e.servers;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error('the eval servers never came up');
    })();
    const pids = servers.map((x) => Number(/pid (\d+)$/.exec(x)?.[1]));
    expect(pids.every((p) => alive(p))).toBe(true);
    await evalWorker.stop();
    expect(pids.filter((p) => alive(p))).toEqual([]);
    const queue = new Queue(EVAL_QUEUE, { connection: h.redis.connection(), prefix: h.keys.bullPrefix });
    try {
      expect(await queue.getJobState(evalJobId(jobId))).toBe('delayed');
    } finally {
      await queue.close();
    }
    expect((await status(slow)).eval?.job).toMatchObject({ state: 'queued' });
  }, 240_000);
});
