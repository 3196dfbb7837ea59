/**
 * Redis connections, server checks and the run's key namespace. Every process of a run opens
 * Redis the same way: {@link openRedis} (a given `redis.url`, or the run's embedded server), then
 * {@link createRedisConnection} per use.
 */
import type { Redis, RedisOptions } from 'ioredis';
import { AppError, EnvironmentError, UnavailableError, errorMessage } from '../errors.js';
import { logger as componentLogger, type Logger } from '../logger.js';
import { withTimeout } from '../util/index.js';
import { EmbeddedRedis } from './embedded-redis.js';
import { openAnswering, FIRST_ANSWER_TIMEOUT_MS, reportSilentServer } from './first-answer.js';
import { newIoredis, redactRedisUrl } from './target.js';

/**
 * What a connection is for, which decides how it behaves when Redis is down (BullMQ's rules):
 * - `worker`: BullMQ workers, blocking commands, long-lived loops. Commands wait for Redis to come
 *   back (`maxRetriesPerRequest: null`); BullMQ refuses a worker connection without it.
 * - `client`: producers, the CLI, checks. Commands fail after a couple of reconnect attempts, so a
 *   down Redis is reported in about a second instead of hanging.
 */
export type RedisRole = 'worker' | 'client';

/** Options of {@link createRedisConnection}. */
export interface RedisConnectionOptions {
  role: RedisRole;
  /** Shown by `CLIENT LIST` (e.g. `tokenmill:inference-worker`). */
  name?: string;
  logger?: Logger;
  /** Connection errors at debug only: the caller reports them (the server check). */
  quiet?: boolean;
  /** ioredis's ready check (default true); off for the server check, which sends its own PING first. */
  readyCheck?: boolean;
}

/** Reconnect attempts a `client` command survives before it fails. */
const CLIENT_MAX_RETRIES_PER_REQUEST = 2;
const CLIENT_CONNECT_TIMEOUT_MS = 5_000;
/** Connection errors are logged at warn at most this often per connection; the rest at debug. */
const ERROR_LOG_INTERVAL_MS = 10_000;

/**
 * Opens an ioredis connection to `url` (`redis://[:password@]host:port[/db]`, `rediss://…`, or
 * a Sentinel-managed primary as `redis-sentinel://…`, see `target.ts`) configured for its role.
 * Connection errors are logged (with the URL's password redacted) instead of being unhandled
 * `error` events; a server that accepts the connection but stays silent is reported too. Close
 * it with {@link closeRedisConnection}.
 */
export function createRedisConnection(url: string, options: RedisConnectionOptions): Redis {
  const log = (options.logger ?? componentLogger('redis')).child({ redis: redactRedisUrl(url), role: options.role });
  const common: RedisOptions = {
    enableReadyCheck: options.readyCheck ?? true,
    // TCP keepalive after 10 s idle: a peer that vanished without a reset (a host cut off, a
    // NAT that forgot the flow) is noticed and reconnected, instead of after the OS's 2 hours.
    keepAlive: 10_000,
    ...(options.name === undefined ? {} : { connectionName: options.name }),
  };
  const roleOptions: RedisOptions =
    options.role === 'worker'
      ? { maxRetriesPerRequest: null }
      : {
          maxRetriesPerRequest: CLIENT_MAX_RETRIES_PER_REQUEST,
          connectTimeout: CLIENT_CONNECT_TIMEOUT_MS,
          retryStrategy: (times: number) => Math.min(times * 100, 2_000),
        };
  const conn = newIoredis(url, { ...common, ...roleOptions });
  if (options.quiet !== true) reportSilentServer(conn, url, log);

  let lastWarnAt = 0;
  conn.on('error', (err: unknown) => {
    const now = Date.now();
    if (options.quiet !== true && now - lastWarnAt >= ERROR_LOG_INTERVAL_MS) {
      lastWarnAt = now;
      log.warn({ err }, 'redis connection error');
    } else {
      log.debug({ err }, 'redis connection error');
    }
  });
  conn.on('ready', () => {
    if (lastWarnAt !== 0) log.info('redis connection ready again');
    lastWarnAt = 0;
  });
  return conn;
}

/** Closes a connection: QUIT (pending replies first), or a hard disconnect after `timeoutMs`. */
export async function closeRedisConnection(conn: Redis, timeoutMs = 2_000): Promise<void> {
  if (conn.status === 'end') return;
  if (conn.status !== 'ready') {
    conn.disconnect();
    return;
  }
  try {
    await withTimeout(
      conn.quit().catch(() => undefined),
      timeoutMs,
    );
  } finally {
    conn.disconnect();
  }
}

/** What {@link checkRedisServer} found. */
export interface RedisServerCheck {
  /** `redis_version` from INFO, e.g. `7.0.15`. */
  version: string;
  /** `maxmemory-policy`, or `unknown` when CONFIG is not allowed (managed Redis). */
  maxmemoryPolicy: string;
  /** Problems that do not stop tokenmill but that the user should fix. */
  warnings: string[];
}

/** Oldest Redis tokenmill runs on (BullMQ 5+ needs 6.2 commands such as `GETDEL`/`ZRANGE … BYSCORE`). */
export const MIN_REDIS_VERSION = '6.2.0';

/**
 * Checks that the server is usable: Redis ≥ 6.2 (else throws {@link EnvironmentError}) and
 * `maxmemory-policy noeviction` (else a warning: an evicting Redis may drop queued jobs and
 * counters). CONFIG may be disabled on managed Redis; that is tolerated with a warning.
 *
 * Use a `client` connection: a `worker` connection waits forever for a Redis that is down.
 * `url` only names the server in messages (its password is redacted); by default it is built
 * from the connection's host, port and db.
 */
export async function checkRedisServer(conn: Redis, url?: string): Promise<RedisServerCheck> {
  const where = redactRedisUrl(
    url ?? `redis://${conn.options.host ?? '127.0.0.1'}:${conn.options.port ?? 6379}/${conn.options.db ?? 0}`,
  );
  const warnings: string[] = [];

  const info = await conn.info('server');
  const version = /^redis_version:(\S+)/m.exec(info)?.[1];
  if (version === undefined) {
    warnings.push(`could not read the Redis version at ${where}: tokenmill needs Redis ≥ 6.2`);
  } else if (!isSupportedRedisVersion(version)) {
    throw new EnvironmentError(`Redis ${version} at ${where}: tokenmill needs Redis ≥ 6.2`);
  }

  let maxmemoryPolicy = 'unknown';
  try {
    const reply = (await conn.config('GET', 'maxmemory-policy')) as unknown;
    const value = Array.isArray(reply) ? (reply[1] as unknown) : undefined;
    if (typeof value === 'string') maxmemoryPolicy = value;
  } catch (e: unknown) {
    warnings.push(
      `could not read maxmemory-policy at ${where} (CONFIG GET failed: ${errorMessage(e)}): make sure it is noeviction, or Redis may evict queued jobs and counters`,
    );
  }
  if (maxmemoryPolicy !== 'unknown' && maxmemoryPolicy !== 'noeviction') {
    warnings.push(
      `maxmemory-policy is ${maxmemoryPolicy}: Redis may evict queued jobs and counters; set it to noeviction`,
    );
  }
  return { version: version ?? 'unknown', maxmemoryPolicy, warnings };
}

/** Whether a `redis_version` is one tokenmill runs on (≥ {@link MIN_REDIS_VERSION}). */
export function isSupportedRedisVersion(version: string): boolean {
  return compareVersions(version, MIN_REDIS_VERSION) >= 0;
}

/** Compares dotted versions numerically (`6.2.0` < `6.10.1`); missing parts count as 0. */
function compareVersions(a: string, b: string): number {
  const pa = a.split('.').map((p) => Number.parseInt(p, 10) || 0);
  const pb = b.split('.').map((p) => Number.parseInt(p, 10) || 0);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** Options of {@link openRedis}. */
export interface OpenRedisOptions {
  /** `redis.url` from the config; when absent, the embedded server at `dataDir` is used. */
  url?: string;
  /** Where the embedded server keeps its state: `<output.dir>/<run>/redis`. */
  dataDir: string;
  /** `redis-server` executable for the embedded server (default: from PATH). */
  redisServerPath?: string;
  logger?: Logger;
}

/** An open Redis for a run: its URL, the embedded server if one is used, and how to release it. */
export interface OpenedRedis {
  url: string;
  /** Set when no URL was configured: the server this process started or attached to. */
  embedded?: EmbeddedRedis;
  server: RedisServerCheck;
  /** Stops the embedded server if this process started it; otherwise does nothing. */
  close(): Promise<void>;
}

/**
 * Opens the run's Redis: the configured `url` (checked with {@link checkRedisServer}, warnings
 * logged), or else the embedded server at `dataDir`, started or attached to. Throws
 * {@link UnavailableError} when a configured Redis cannot be reached.
 */
export async function openRedis(options: OpenRedisOptions): Promise<OpenedRedis> {
  const log = options.logger ?? componentLogger('redis');
  if (options.url !== undefined) {
    const url = options.url;
    const server = await checkServerAt(url, log);
    return { url, server, close: async () => undefined };
  }

  const embedded = new EmbeddedRedis({
    dataDir: options.dataDir,
    // Other commands on the same run (a worker, `status`) may attach to this server: it stays
    // up while they use it.
    keepWhileInUse: true,
    // A server that dies mid-run (OOM-killed) comes back on the same port and AOF.
    restartOnExit: true,
    ...(options.redisServerPath === undefined ? {} : { redisServerPath: options.redisServerPath }),
    logger: options.logger ?? componentLogger('embedded-redis'),
  });
  const { url } = await embedded.start();
  try {
    const server = await checkServerAt(url, log);
    return { url, embedded, server, close: () => embedded.stop() };
  } catch (e: unknown) {
    await embedded.stop();
    throw e;
  }
}

async function checkServerAt(url: string, log: Logger): Promise<RedisServerCheck> {
  // The command's own error only says that retries ran out; the connection error says why.
  let connectionError: unknown;
  const open = (): Redis => {
    const c = createRedisConnection(url, {
      role: 'client',
      name: 'tokenmill:check',
      logger: log,
      quiet: true,
      readyCheck: false,
    });
    c.on('error', (e: unknown) => {
      connectionError = e;
    });
    return c;
  };
  // A bounded first answer: a port that accepts TCP but never answers fails here, naming the URL.
  const conn = await openAnswering(open, url, log);
  try {
    let server: RedisServerCheck;
    try {
      server = await withDeadline(
        checkRedisServer(conn, url),
        FIRST_ANSWER_TIMEOUT_MS,
        () =>
          new UnavailableError(
            `Redis at ${redactRedisUrl(url)} answered PING but not INFO within ${FIRST_ANSWER_TIMEOUT_MS / 1000} s: check that it is not frozen or overloaded`,
          ),
      );
    } catch (e: unknown) {
      if (e instanceof AppError) throw e;
      const reason = errorMessage(connectionError ?? e);
      throw new UnavailableError(`cannot use Redis at ${redactRedisUrl(url)}: ${reason}`, { cause: e });
    }
    for (const warning of server.warnings) log.warn({ redis: redactRedisUrl(url) }, warning);
    return server;
  } finally {
    await closeRedisConnection(conn);
  }
}

/** `promise`, or the error `onTimeout` makes when it has not settled within `ms`. */
async function withDeadline<T>(promise: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  const result = await withTimeout(promise, ms);
  if (result === 'timeout') throw onTimeout();
  return result;
}
