import { join } from 'node:path';
import type { Redis } from 'ioredis';
import {
  RunKeys,
  SglangClient,
  closeRedisConnection,
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
  const opened: OpenedRedis = await openRedis({
    ...(config.redis.url === undefined ? {} : { url: config.redis.url }),
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
    } catch {
      // try the next endpoint; without it, SGLang itself rejects prompts that are too long
    } finally {
      await client.close();
    }
  }
  return undefined;
}

/** Resolves on the first SIGINT or SIGTERM. */
export function onceSignalled(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const handler = (sig: NodeJS.Signals): void => {
      process.off('SIGINT', handler);
      process.off('SIGTERM', handler);
      resolve(sig);
    };
    process.on('SIGINT', handler);
    process.on('SIGTERM', handler);
  });
}
