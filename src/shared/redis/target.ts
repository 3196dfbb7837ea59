/**
 * Where a run's Redis is, as one string that every process passes around (`redisUrl`): a server's
 * URL (`redis://…`, `rediss://…`), or a Sentinel-managed primary written as
 *
 *   redis-sentinel://[:<password>@]<host:port>[,<host:port>…]/<master name>[?db=N&sentinelPassword=…&tls=true]
 *
 * built from the config's `redis.sentinels` by {@link configuredRedisUrl}. ioredis asks the
 * Sentinels for the primary on every (re)connect, so a connection follows a failover.
 */
import { Redis, type RedisOptions } from 'ioredis';

const SENTINEL_SCHEME = 'redis-sentinel://';

/** A Sentinel-managed primary (the config's `redis.sentinels`, `redis.name`, …). */
export interface RedisSentinelTarget {
  sentinels: Array<{ host: string; port: number }>;
  name: string;
  password?: string;
  sentinelPassword?: string;
  tls?: boolean;
  db?: number;
}

/** The parts of the config's `redis` section that say where Redis is. */
export interface RedisLocation {
  url?: string | undefined;
  sentinels?: readonly string[] | undefined;
  name?: string | undefined;
  password?: string | undefined;
  sentinelPassword?: string | undefined;
  tls?: boolean | undefined;
  db?: number | undefined;
}

/** `host:port` → its parts; IPv6 hosts in brackets. */
function parseAddress(address: string): { host: string; port: number } {
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(address);
  if (m === null) throw new Error(`expected a Sentinel address "host:port", got ${JSON.stringify(address)}`);
  return { host: (m[1] ?? '').replace(/^\[(.*)\]$/, '$1'), port: Number(m[2]) };
}

function formatAddress(a: { host: string; port: number }): string {
  return `${a.host.includes(':') ? `[${a.host}]` : a.host}:${a.port}`;
}

/**
 * The Redis a config names, as the string processes pass around: `redis.url` as it is, a
 * `redis-sentinel://` string for `redis.sentinels`, or `undefined` (the embedded server).
 */
export function configuredRedisUrl(redis: RedisLocation): string | undefined {
  if (redis.sentinels === undefined) return redis.url;
  return sentinelUrl({
    sentinels: redis.sentinels.map(parseAddress),
    name: redis.name ?? '',
    ...(redis.password === undefined ? {} : { password: redis.password }),
    ...(redis.sentinelPassword === undefined ? {} : { sentinelPassword: redis.sentinelPassword }),
    ...(redis.tls === undefined ? {} : { tls: redis.tls }),
    ...(redis.db === undefined ? {} : { db: redis.db }),
  });
}

/** A {@link RedisSentinelTarget} as a `redis-sentinel://` string. */
export function sentinelUrl(t: RedisSentinelTarget): string {
  const auth = t.password === undefined ? '' : `:${encodeURIComponent(t.password)}@`;
  const query = new URLSearchParams();
  if (t.db !== undefined && t.db !== 0) query.set('db', String(t.db));
  if (t.sentinelPassword !== undefined) query.set('sentinelPassword', t.sentinelPassword);
  if (t.tls === true) query.set('tls', 'true');
  const q = query.toString();
  return `${SENTINEL_SCHEME}${auth}${t.sentinels.map(formatAddress).join(',')}/${encodeURIComponent(t.name)}${q === '' ? '' : `?${q}`}`;
}

/** Whether `url` names a Sentinel-managed primary. */
export function isSentinelUrl(url: string): boolean {
  return url.startsWith(SENTINEL_SCHEME);
}

/** The parts of a `redis-sentinel://` string; throws on anything else. */
export function parseSentinelUrl(url: string): RedisSentinelTarget {
  if (!isSentinelUrl(url)) throw new Error(`not a ${SENTINEL_SCHEME} URL`);
  const rest = url.slice(SENTINEL_SCHEME.length);
  const at = rest.lastIndexOf('@', rest.indexOf('/') === -1 ? rest.length : rest.indexOf('/'));
  const auth = at === -1 ? '' : rest.slice(0, at);
  const afterAuth = rest.slice(at + 1);
  const slash = afterAuth.indexOf('/');
  if (slash === -1) throw new Error(`${SENTINEL_SCHEME} URL without a master name`);
  const hosts = afterAuth.slice(0, slash);
  const [path = '', q = ''] = afterAuth.slice(slash + 1).split('?', 2);
  const query = new URLSearchParams(q);
  const password = auth === '' ? undefined : decodeURIComponent(auth.replace(/^[^:]*:/, ''));
  const sentinelPassword = query.get('sentinelPassword') ?? undefined;
  const db = query.get('db');
  return {
    sentinels: hosts.split(',').map(parseAddress),
    name: decodeURIComponent(path),
    ...(password === undefined ? {} : { password }),
    ...(sentinelPassword === undefined ? {} : { sentinelPassword }),
    ...(query.get('tls') === 'true' ? { tls: true } : {}),
    ...(db === null ? {} : { db: Number(db) }),
  };
}

/**
 * ioredis options for a Sentinel-managed primary: every (re)connect asks the Sentinels for the
 * primary. A primary that died closes its connections; one that is demoted alive is told by the
 * Sentinels to drop its clients (`CLIENT KILL TYPE normal`). Should a command still reach a
 * replica, `READONLY` (a write) or `UNBLOCKED` (a blocking read ended by the switch) reconnects
 * through the Sentinels and sends it again. (ioredis's `failoverDetector` is not used: its
 * disconnect on `+switch-master` can land in the middle of a reconnect and fail it for good.)
 */
export function sentinelRedisOptions(t: RedisSentinelTarget): RedisOptions {
  return {
    sentinels: t.sentinels,
    name: t.name,
    ...(t.password === undefined ? {} : { password: t.password }),
    ...(t.sentinelPassword === undefined ? {} : { sentinelPassword: t.sentinelPassword }),
    ...(t.db === undefined ? {} : { db: t.db }),
    ...(t.tls === true ? { tls: {}, sentinelTLS: {}, enableTLSForSentinelMode: true } : {}),
    // The Sentinels themselves may all be restarting: try them again every second or two.
    sentinelRetryStrategy: (times: number) => Math.min(times * 200, 2_000),
    reconnectOnError: (err: Error) => (/^(READONLY|UNBLOCKED)/.test(err.message) ? 2 : false),
  };
}

/** A plain ioredis connection to `url`, a server's URL or a `redis-sentinel://` string, with `options`. */
export function newIoredis(url: string, options: RedisOptions): Redis {
  return isSentinelUrl(url)
    ? new Redis({ ...sentinelRedisOptions(parseSentinelUrl(url)), ...options })
    : new Redis(url, options);
}

/**
 * The string with its passwords replaced by `***`, for logs and messages:
 * `redis://:s3cret@host:6379/0` → `redis://:***@host:6379/0`; a `redis-sentinel://` string
 * keeps its Sentinels and master name.
 */
export function redactRedisUrl(url: string): string {
  if (isSentinelUrl(url)) {
    try {
      const t = parseSentinelUrl(url);
      return sentinelUrl({
        ...t,
        ...(t.password === undefined ? {} : { password: '***' }),
        ...(t.sentinelPassword === undefined ? {} : { sentinelPassword: '***' }),
      }).replace(/%2A%2A%2A/g, '***');
    } catch {
      return url.replace(/\/\/[^/@]*@/, '//***@').replace(/sentinelPassword=[^&]*/, 'sentinelPassword=***');
    }
  }
  try {
    const parsed = new URL(url);
    if (parsed.password !== '') parsed.password = '***';
    if (parsed.searchParams.has('password')) parsed.searchParams.set('password', '***');
    return parsed.toString();
  } catch {
    // Not a URL: hide whatever sits between `//` and `@`.
    return url.replace(/\/\/[^/@]*@/, '//***@');
  }
}
