import { join } from 'node:path';
import type { Redis } from 'ioredis';
import {
  RunKeys,
  SglangClient,
  closeRedisConnection,
  configuredRedisUrl,
  createRedisConnection,
  loadConfig,
  logger,
  openRedis,
  runDir,
  type Config,
  type OpenedRedis,
} from '../shared/index.js';

/** What every run-level verb opens: the config, the run's Redis, its keys and folder. */
export interface RunContext {
  config: Config;
  keys: RunKeys;
  runDir: string;
  redisUrl: string;
  /** A client-role connection for reads and small writes. */
  redis: Redis;
  close(): Promise<void>;
}

/** Loads the config and opens the run's Redis (the configured one, or the embedded server). */
export async function openRunContext(configPath: string): Promise<RunContext> {
  const config = loadConfig({ path: configPath });
  return openRunContextFor(config);
}

export async function openRunContextFor(config: Config): Promise<RunContext> {
  const dir = runDir(config);
  // `redis.url`, or the Sentinels' `redis-sentinel://` string; neither = the embedded server.
  const url = configuredRedisUrl(config.redis);
  const opened: OpenedRedis = await openRedis({
    ...(url === undefined ? {} : { url }),
    dataDir: join(dir, 'redis'),
    logger: logger('redis'),
  });
  const redis = createRedisConnection(opened.url, { role: 'worker', name: 'tokenmill:cli' });
  return {
    config,
    keys: new RunKeys(config.redis.prefix, config.run),
    runDir: dir,
    redisUrl: opened.url,
    redis,
    async close() {
      await closeRedisConnection(redis);
      await opened.close();
    },
  };
}

/** The model's context length: from the config, else asked from the first endpoint that answers. */
export async function resolveContextLength(config: Config): Promise<number | undefined> {
  if (config.sglang.contextLength !== undefined) return config.sglang.contextLength;
  for (const endpoint of config.sglang.endpoints) {
    const client = new SglangClient({
      endpoint,
      concurrency: 1,
      requestTimeoutMs: 5_000,
      ...(config.sglang.apiKey === undefined ? {} : { apiKey: config.sglang.apiKey }),
    });
    try {
      const info = await client.serverInfo();
      if (typeof info.context_length === 'number') return info.context_length;
      // Started without --context-length, SGLang 0.5.x answers context_length null; the scheduler's
      // max_req_input_len (the model's context less a few tokens) is the bound prompt + completion must keep.
      if (typeof info.max_req_input_len === 'number' && info.max_req_input_len > 0) return info.max_req_input_len;
    } catch {
      // try the next endpoint; without it, SGLang itself rejects prompts that are too long
    } finally {
      await client.close();
    }
  }
  return undefined;
}

/** Resolves on the first SIGINT or SIGTERM (remembered for {@link exitInterrupted}). */
export function onceSignalled(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const handler = (sig: NodeJS.Signals): void => {
      process.off('SIGINT', handler);
      process.off('SIGTERM', handler);
      lastSignal = sig;
      resolve(sig);
    };
    process.on('SIGINT', handler);
    process.on('SIGTERM', handler);
  });
}

let lastSignal: NodeJS.Signals | undefined;

/** The exit code of a command stopped by `signal` before its work was done: 130 (SIGINT), 143 (SIGTERM). */
export function signalExitCode(signal: NodeJS.Signals | undefined = lastSignal): number {
  return signal === 'SIGINT' ? 130 : 143;
}

/**
 * Marks the process as stopped before its work was done: exit code 130 after SIGINT, 143 after
 * SIGTERM (the last signal {@link onceSignalled} saw), so `tokenmill run && next` does not go on.
 */
export function exitInterrupted(): void {
  process.exitCode = signalExitCode();
}

/**
 * After a stop signal, the hard bound on the rest of the process's life: if it is still alive
 * `limitMs` later (a stop stuck on a Redis that is gone, say), it says so in one line and exits
 * non-zero (the code already set, else 1). The timer does not keep the process alive.
 */
export function armStopDeadline(limitMs: number): void {
  const timer = setTimeout(() => {
    process.stderr.write(
      `tokenmill: stop abandoned after ${Math.round(limitMs / 1000)} s; exiting (leases and locks lapse on their own)\n`,
    );
    // The code set so far when it says "unfinished" (143 / 130), else 1: an abandoned stop is never 0.
    const code = typeof process.exitCode === 'number' && process.exitCode !== 0 ? process.exitCode : 1;
    process.exit(code);
  }, limitMs);
  timer.unref();
}
