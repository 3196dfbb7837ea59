// The Redis every integration test uses: a private redis-server in a fresh temp folder, on a
// free port (never 6379, never a server the test did not start), removed on stop().
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Redis } from 'ioredis';
import { pino } from 'pino';
import {
  EmbeddedRedis,
  closeRedisConnection,
  createRedisConnection,
  type Logger,
  type RedisRole,
} from '../../src/shared/index.js';

export interface TestRedis {
  url: string;
  port: number;
  /** A key prefix unique to this call (`t<hex>`): pass it as BullMQ's `prefix` and to our own keys. */
  prefix: string;
  /** The server's data folder (AOF, log). */
  dataDir: string;
  server: EmbeddedRedis;
  /**
   * A new connection, closed by stop(). Default role `worker` (what BullMQ workers require);
   * use `client` for a connection that fails fast when the server is gone.
   */
  connection(role?: RedisRole): Redis;
  /** Closes the connections, stops the server, removes its folder. Safe to call twice. */
  stop(): Promise<void>;
}

export interface StartTestRedisOptions {
  /** Extra redis-server arguments, e.g. `['--maxmemory-policy', 'allkeys-lru']`. */
  extraArgs?: string[];
}

// A test file that crashes before its afterAll must not leave servers behind.
const livePids = new Set<number>();
let exitHookInstalled = false;
function killOnExit(pid: number): void {
  livePids.add(pid);
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', () => {
    for (const p of livePids) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  });
}

/** A logger for tests: errors only unless TOKENMILL_TEST_LOG_LEVEL says otherwise; never the process root. */
export function quietLogger(): Logger {
  return pino({ level: process.env['TOKENMILL_TEST_LOG_LEVEL'] ?? 'error' }, pino.destination({ dest: 2, sync: true }));
}

/** Starts a private redis-server for one test file (or one test). */
export async function startTestRedis(options: StartTestRedisOptions = {}): Promise<TestRedis> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'tokenmill-redis-'));
  const server = new EmbeddedRedis({
    dataDir,
    logger: quietLogger().child({ component: 'test-redis' }),
    ...(options.extraArgs === undefined ? {} : { extraArgs: options.extraArgs }),
  });
  let started: { url: string; port: number };
  try {
    started = await server.start();
  } catch (e: unknown) {
    await fs.rm(dataDir, { recursive: true, force: true });
    throw e;
  }
  if (!server.ownsProcess || started.port === 6379) {
    await server.stop();
    throw new Error(`test redis at ${dataDir} is not a fresh private server (port ${started.port})`);
  }
  const pid = server.pid;
  if (pid !== undefined) killOnExit(pid);

  const connections = new Set<Redis>();
  let stopped = false;
  return {
    url: started.url,
    port: started.port,
    prefix: `t${randomBytes(6).toString('hex')}`,
    dataDir,
    server,
    connection(role: RedisRole = 'worker'): Redis {
      if (stopped) throw new Error('test redis is stopped');
      const conn = createRedisConnection(started.url, {
        role,
        name: 'tokenmill:test',
        logger: quietLogger().child({ component: 'test-redis' }),
      });
      connections.add(conn);
      return conn;
    },
    async stop(): Promise<void> {
      if (stopped) return;
      stopped = true;
      await Promise.all([...connections].map((c) => closeRedisConnection(c)));
      connections.clear();
      await server.stop();
      if (pid !== undefined) livePids.delete(pid);
      await fs.rm(dataDir, { recursive: true, force: true });
    },
  };
}
