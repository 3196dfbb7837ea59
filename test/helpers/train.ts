// The train-stage tests' harness: a private Redis, a run folder, configs whose train command is
// the fake trainer (test/fixtures/train/fake-trainer.mjs) or the reference trainer, the stand-in
// nvidia-smi on the PATH, and in-process train workers.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  RunKeys,
  loadConfig,
  readTrainStatus,
  runDir,
  type Config,
  type ConfigInput,
  type TrainMode,
  type TrainStatus,
} from '../../src/shared/index.js';
import {
  queueTrainJob,
  trainPayloadOf,
  waitForTrainJob,
  type TrainOutcomeSeen,
} from '../../src/workers/train/train-jobs.js';
import { TrainWorker } from '../../src/workers/train/worker.js';
import { repoRoot, waitFor } from './pipeline.js';
import { quietLogger, startTestRedis, type TestRedis } from './redis.js';

export const FAKE_TRAINER = path.join(repoRoot, 'test/fixtures/train/fake-trainer.mjs');
export const NVIDIA_SMI_DIR = path.join(repoRoot, 'test/fixtures/nvidia-smi');

/** What the stand-in nvidia-smi reports. */
export interface FakeGpus {
  driver: string;
  gpus: { name: string; totalMiB: number; freeMiB: number }[];
  fail?: string;
}

export interface TrainHarness {
  redis: TestRedis;
  root: string;
  keys: RunKeys;
  /** A loaded config with this harness' Redis, output folder and the given train section. */
  config(train: NonNullable<ConfigInput['train']>, extra?: Partial<ConfigInput>): Config;
  runDir(config: Config): string;
  /** Rewrites the stand-in nvidia-smi's answer (it is on this process' PATH). */
  setGpus(spec: FakeGpus): void;
  /** Queues a `tokenmill train` job for `config`. */
  queue(config: Config, choice?: { mode?: TrainMode; checkpoint?: string; allowEnvChange?: boolean }): Promise<string>;
  wait(jobId: string, timeoutMs?: number): Promise<TrainOutcomeSeen>;
  status(): Promise<TrainStatus | null>;
  /** Starts an in-process train worker (stopped by close()). */
  worker(opts?: { gpus?: number[] }): Promise<TrainWorker>;
  close(): Promise<void>;
}

/** Starts the harness; puts the stand-in nvidia-smi first on PATH for this test process. */
export async function startTrainHarness(): Promise<TrainHarness> {
  const redis = await startTestRedis();
  const root = mkdtempSync(path.join(tmpdir(), 'tm-train-'));
  const gpuFile = path.join(root, 'gpus.json');
  writeFileSync(gpuFile, JSON.stringify({ driver: '550.54.15', gpus: [] }));
  process.env.NVIDIA_SMI_FIXTURE = gpuFile;
  if (!(process.env.PATH ?? '').startsWith(NVIDIA_SMI_DIR))
    process.env.PATH = `${NVIDIA_SMI_DIR}:${process.env.PATH ?? ''}`;
  const keys = new RunKeys(redis.prefix, 'r1');
  const workers: TrainWorker[] = [];
  const h: TrainHarness = {
    redis,
    root,
    keys,
    config(train, extra = {}) {
      const input: ConfigInput = {
        run: 'r1',
        redis: { url: redis.url, prefix: redis.prefix },
        datasets: [{ name: 'd1', conversations: 'conv.jsonl' }],
        output: { dir: path.join(root, 'out') },
        postprocess: { target: path.join(root, 'dataset') },
        workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000 },
        train: { preflightPollMs: 300, cancelGraceMs: 1_000, ...train },
        ...extra,
      };
      return loadConfig({ object: input, baseDir: root });
    },
    runDir: (config) => runDir(config),
    setGpus(spec) {
      writeFileSync(gpuFile, JSON.stringify(spec));
    },
    async queue(config, choice = {}) {
      const conn = redis.connection();
      return queueTrainJob(conn, keys, trainPayloadOf(config, runDir(config), { ...choice, origin: 'cli' }));
    },
    async wait(jobId, timeoutMs = 45_000) {
      const conn = redis.connection();
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), timeoutMs);
      try {
        return await waitForTrainJob(conn, keys, jobId, { signal: ac.signal, pollMs: 100 });
      } finally {
        clearTimeout(timer);
      }
    },
    status: () => readTrainStatus(redis.connection(), keys),
    async worker(opts = {}) {
      const w = new TrainWorker({
        redisUrl: redis.url,
        keys,
        ...(opts.gpus === undefined ? {} : { gpus: opts.gpus }),
        lockDurationMs: 2_000,
        stalledIntervalMs: 1_000,
        logger: quietLogger(),
      });
      await w.start();
      workers.push(w);
      return w;
    },
    async close() {
      for (const w of workers) await w.stop();
      await redis.stop();
      rmSync(root, { recursive: true, force: true });
    },
  };
  return h;
}

/** Waits until the run's train status satisfies `cond`. */
export function waitForStatus(
  h: TrainHarness,
  cond: (s: TrainStatus) => boolean,
  what: string,
  timeoutMs = 30_000,
): Promise<TrainStatus> {
  return waitFor(
    async () => {
      const s = await h.status();
      return s !== null && cond(s) ? s : undefined;
    },
    what,
    timeoutMs,
    100,
  ) as Promise<TrainStatus>;
}

/** The fake trainer as a train command. */
export function fakeTrainer(...args: string[]): string[] {
  return [process.execPath, FAKE_TRAINER, '--output', '{output}', ...args];
}

/** Whether a process exists. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A killed process whose new parent has not reaped it yet (a zombie) still answers signal 0.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}
