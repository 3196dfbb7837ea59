import { Queue, Worker } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import {
  EnvironmentError,
  UnavailableError,
  checkRedisServer,
  closeRedisConnection,
  createRedisConnection,
  findFreePort,
  isSupportedRedisVersion,
  openRedis,
  redactRedisUrl,
  type OpenedRedis,
} from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger, startTestRedis } from '../helpers/redis.js';
import { useTempDir } from '../helpers/temp.js';

const { redis } = useHarness({ redis: true });

describe('checkRedisServer', () => {
  it('accepts the embedded server without warnings', async () => {
    const result = await checkRedisServer(redis.connection('client'), redis.url);
    expect(isSupportedRedisVersion(result.version)).toBe(true);
    expect(result.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(result.maxmemoryPolicy).toBe('noeviction');
    expect(result.warnings).toEqual([]);
  });

  it('warns when the server may evict keys', async () => {
    const evicting = await startTestRedis({ extraArgs: ['--maxmemory-policy', 'allkeys-lru'] });
    try {
      const result = await checkRedisServer(evicting.connection('client'));
      expect(result.maxmemoryPolicy).toBe('allkeys-lru');
      expect(result.warnings).toEqual([
        'maxmemory-policy is allkeys-lru: Redis may evict queued jobs and counters; set it to noeviction',
      ]);
    } finally {
      await evicting.stop();
    }
  });

  it('tolerates a server where CONFIG is disabled (as on managed Redis) and says so', async () => {
    const managed = await startTestRedis({ extraArgs: ['--rename-command', 'CONFIG', '""'] });
    try {
      const result = await checkRedisServer(managed.connection('client'), managed.url);
      expect(result.maxmemoryPolicy).toBe('unknown');
      expect(result.warnings).toHaveLength(1);
      expect(result.warnings[0]).toMatch(/could not read maxmemory-policy .*CONFIG GET failed.*noeviction/);
    } finally {
      await managed.stop();
    }
  });

  it('knows which versions are supported', () => {
    expect(isSupportedRedisVersion('6.0.16')).toBe(false);
    expect(isSupportedRedisVersion('5.0.7')).toBe(false);
    expect(isSupportedRedisVersion('6.2.0')).toBe(true);
    expect(isSupportedRedisVersion('6.10.1')).toBe(true);
    expect(isSupportedRedisVersion('7.0.15')).toBe(true);
  });
});

describe('createRedisConnection', () => {
  it('gives workers connections BullMQ accepts, and refuses client ones for workers', async () => {
    const queueName = 'conn-check';
    const queue = new Queue(queueName, { connection: redis.connection('client'), prefix: redis.prefix });
    await queue.add('job', { n: 21 });
    const processed = new Promise<number>((resolve) => {
      const worker = new Worker(
        queueName,
        async (job) => {
          const n = (job.data as { n: number }).n * 2;
          resolve(n);
          return n;
        },
        { connection: redis.connection('worker'), prefix: redis.prefix },
      );
      afterEachCleanups.push(() => worker.close());
    });
    expect(await processed).toBe(42);
    afterEachCleanups.push(() => queue.close());

    expect(
      () =>
        new Worker(queueName, async () => undefined, {
          connection: redis.connection('client'),
          prefix: redis.prefix,
          autorun: false,
        }),
    ).toThrow(/maxRetriesPerRequest must be null/);
    // Everything BullMQ wrote is under the test's prefix.
    const keys = await redis.connection('client').keys('*');
    expect(keys.length).toBeGreaterThan(0);
    expect(keys.every((k) => k.startsWith(`${redis.prefix}:`))).toBe(true);
  });

  it('client connections fail fast when Redis is down', async () => {
    const port = await findFreePort();
    const conn = createRedisConnection(`redis://127.0.0.1:${port}`, { role: 'client', logger: quietLogger() });
    const started = Date.now();
    try {
      await expect(conn.ping()).rejects.toThrow();
      expect(Date.now() - started).toBeLessThan(5_000);
    } finally {
      await closeRedisConnection(conn);
    }
  });

  it('names the connection', async () => {
    const conn = createRedisConnection(redis.url, { role: 'client', name: 'tokenmill:probe', logger: quietLogger() });
    try {
      expect(await conn.client('GETNAME')).toBe('tokenmill:probe');
    } finally {
      await closeRedisConnection(conn);
    }
  });
});

const afterEachCleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of afterEachCleanups.splice(0).reverse()) await c();
});

describe('openRedis', () => {
  it('starts the embedded server when no URL is given, and later opens attach to it', async () => {
    const dataDir = useTempDir('tokenmill-open-');
    const opened: OpenedRedis[] = [];
    try {
      const first = await openRedis({ dataDir, logger: quietLogger() });
      opened.push(first);
      expect(first.embedded?.ownsProcess).toBe(true);
      expect(first.server.warnings).toEqual([]);

      const second = await openRedis({ dataDir, logger: quietLogger() });
      opened.push(second);
      expect(second.url).toBe(first.url);
      expect(second.embedded?.ownsProcess).toBe(false);

      // The first process is still using the server: the second one's close leaves it up.
      const conn = createRedisConnection(first.url, { role: 'client', logger: quietLogger() });
      expect(await conn.ping()).toBe('PONG');
      await second.close();
      expect(await conn.ping()).toBe('PONG');
      await closeRedisConnection(conn);

      const pid = first.embedded?.pid ?? -1;
      await first.close();
      expect(() => process.kill(pid, 0)).toThrow();
    } finally {
      for (const o of opened.reverse()) await o.close();
    }
  });

  it('uses a given URL as is', async () => {
    const opened = await openRedis({ url: redis.url, dataDir: '/nonexistent/unused', logger: quietLogger() });
    expect(opened.url).toBe(redis.url);
    expect(opened.embedded).toBeUndefined();
    expect(opened.server.maxmemoryPolicy).toBe('noeviction');
    await opened.close();
    expect(await redis.connection('client').ping()).toBe('PONG');
  });

  it('reports an unreachable URL quickly, without its password', async () => {
    const port = await findFreePort();
    const err = await openRedis({
      url: `redis://:hunter2@127.0.0.1:${port}/0`,
      dataDir: '/nonexistent/unused',
      logger: quietLogger(),
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(UnavailableError);
    const message = (err as Error).message;
    expect(message).toContain(`redis://:***@127.0.0.1:${port}/0`);
    expect(message).toMatch(/ECONNREFUSED/);
    expect(message).not.toContain('hunter2');
  });

  it('passes on EnvironmentError when redis-server is missing', async () => {
    const dataDir = useTempDir('tokenmill-open-');
    await expect(
      openRedis({ dataDir, redisServerPath: '/nonexistent/redis-server', logger: quietLogger() }),
    ).rejects.toBeInstanceOf(EnvironmentError);
  });
});

describe('redactRedisUrl', () => {
  it('hides passwords and keeps the rest', () => {
    expect(redactRedisUrl('redis://:s3cret@redis.internal:6379/0')).toBe('redis://:***@redis.internal:6379/0');
    expect(redactRedisUrl('rediss://default:s3cret@host:6380')).toBe('rediss://default:***@host:6380');
    expect(redactRedisUrl('redis://127.0.0.1:6379/2')).toBe('redis://127.0.0.1:6379/2');
    expect(redactRedisUrl('redis://host:6379/0?password=s3cret')).not.toContain('s3cret');
    expect(redactRedisUrl('not a url //user:s3cret@host')).not.toContain('s3cret');
  });
});
