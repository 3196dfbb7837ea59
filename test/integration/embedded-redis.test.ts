import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, promises as fs } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import {
  EmbeddedRedis,
  EnvironmentError,
  REDIS_SERVER_NOT_FOUND_MESSAGE,
  findFreePort,
  type EmbeddedRedisOptions,
} from '../../src/shared/index.js';
import { quietLogger, startTestRedis } from '../helpers/redis.js';
import { useTempDir } from '../helpers/temp.js';

// Every server and folder a test creates is released here, even when the test fails.
const servers: EmbeddedRedis[] = [];
const conns: Redis[] = [];
const listeners: net.Server[] = [];

afterEach(async () => {
  for (const c of conns.splice(0)) c.disconnect();
  for (const s of listeners.splice(0)) await new Promise((r) => s.close(r));
  // Attached instances first, owners last.
  const all = servers.splice(0).reverse();
  for (const s of all) await s.stop();
});

/** A temp folder removed after the test, once the afterEach above has stopped its servers. */
const tempDir = (): string => useTempDir('tokenmill-embedded-');

function embedded(options: EmbeddedRedisOptions): EmbeddedRedis {
  const server = new EmbeddedRedis({ logger: quietLogger(), ...options });
  servers.push(server);
  return server;
}

function connect(url: string): Redis {
  const c = new Redis(url, { maxRetriesPerRequest: 1, lazyConnect: false });
  c.on('error', () => undefined);
  conns.push(c);
  return c;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function waitFor(condition: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Pids of live redis-server processes running in `dataDir` (Linux /proc: the server runs with
 * its data folder as working directory; it rewrites its own command line, so that is no help).
 */
async function redisProcessesFor(dataDir: string): Promise<number[]> {
  const real = await fs.realpath(dataDir);
  const pids: number[] = [];
  for (const entry of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cwd = await fs.readlink(`/proc/${entry}/cwd`);
      const stat = await fs.readFile(`/proc/${entry}/stat`, 'utf8');
      if (cwd === real && stat.includes('(redis-server)') && !/\) Z /.test(stat)) pids.push(Number(entry));
    } catch {
      // not ours to read, or it ended while we looked
    }
  }
  return pids;
}

async function configGet(c: Redis, name: string): Promise<string | undefined> {
  const reply = (await c.config('GET', name)) as string[];
  return reply[1];
}

describe('EmbeddedRedis', () => {
  it('starts a private redis-server on a free loopback port with AOF and noeviction', async () => {
    const dir = tempDir();
    const server = embedded({ dataDir: dir });
    const { url, port } = await server.start();

    expect(url).toBe(`redis://127.0.0.1:${port}`);
    expect(server.url).toBe(url);
    expect(port).not.toBe(6379);
    expect(server.ownsProcess).toBe(true);
    expect(await fs.readFile(path.join(dir, 'redis.port'), 'utf8')).toBe(`${port}\n`);
    expect(await fs.readFile(path.join(dir, 'redis.pid'), 'utf8')).toBe(`${server.pid}\n`);

    const c = connect(url);
    expect(await c.ping()).toBe('PONG');
    expect(await configGet(c, 'appendonly')).toBe('yes');
    expect(await configGet(c, 'appendfsync')).toBe('everysec');
    expect(await configGet(c, 'maxmemory-policy')).toBe('noeviction');
    expect(await configGet(c, 'save')).toBe('');
    expect(await configGet(c, 'bind')).toBe('127.0.0.1');
    expect(await configGet(c, 'dir')).toBe(await fs.realpath(dir));
    expect(await fs.readFile(path.join(dir, 'redis.log'), 'utf8')).toMatch(/Ready to accept connections/);
  });

  it('keeps its data across stop and start on the same dataDir (AOF replay)', async () => {
    const dir = tempDir();
    const first = embedded({ dataDir: dir });
    const { url } = await first.start();
    const firstPid = first.pid;
    const c = connect(url);
    await c.set('tm:test:counter', '42');
    await c.hset('tm:test:hash', { a: '1', b: '2' });
    c.disconnect();
    await first.stop();
    expect(isAlive(firstPid ?? -1)).toBe(false);

    const second = embedded({ dataDir: dir });
    const again = await second.start();
    expect(second.ownsProcess).toBe(true);
    expect(second.pid).not.toBe(firstPid);
    const c2 = connect(again.url);
    expect(await c2.get('tm:test:counter')).toBe('42');
    expect(await c2.hgetall('tm:test:hash')).toEqual({ a: '1', b: '2' });
  });

  it('attaches to the server already running on a dataDir; only the owner stops it', async () => {
    const dir = tempDir();
    const owner = embedded({ dataDir: dir });
    const started = await owner.start();
    const pid = owner.pid ?? -1;

    const attached = embedded({ dataDir: dir });
    const again = await attached.start();
    expect(again).toEqual(started);
    expect(attached.ownsProcess).toBe(false);
    expect(attached.pid).toBe(pid);
    expect(await redisProcessesFor(dir)).toEqual([pid]);

    await attached.stop();
    expect(isAlive(pid)).toBe(true);
    const probe = connect(started.url);
    expect(await probe.ping()).toBe('PONG');
    await probe.quit();

    await owner.stop();
    expect(isAlive(pid)).toBe(false);
    expect(existsSync(path.join(dir, 'redis.pid'))).toBe(false);
    expect(existsSync(path.join(dir, 'redis.port'))).toBe(false);
    expect(await redisProcessesFor(dir)).toEqual([]);
  });

  it('with keepWhileInUse, the owner leaves the server running while another process still uses it', async () => {
    const dir = tempDir();
    const owner = embedded({ dataDir: dir, keepWhileInUse: true });
    const started = await owner.start();
    const pid = owner.pid ?? -1;
    // Another process's connection (a worker attached to the same run).
    const other = connect(started.url);
    await other.set('k', 'v');
    await owner.stop();
    expect(isAlive(pid)).toBe(true);
    expect(await other.get('k')).toBe('v');
    // The next command on the run attaches to it; as the last user, it stops it.
    const next = embedded({ dataDir: dir, keepWhileInUse: true });
    expect(await next.start()).toEqual(started);
    expect(next.ownsProcess).toBe(false);
    await next.stop();
    expect(isAlive(pid)).toBe(true); // `other` is still connected
    await other.quit();
    const last = embedded({ dataDir: dir, keepWhileInUse: true });
    await last.start();
    await last.stop();
    const deadline = Date.now() + 10_000;
    while (isAlive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(isAlive(pid)).toBe(false);
    expect(existsSync(path.join(dir, 'redis.pid'))).toBe(false);
  });

  it('runs one server when two starts on the same dataDir race', async () => {
    const dir = tempDir();
    const a = embedded({ dataDir: dir });
    const b = embedded({ dataDir: dir });
    const [ra, rb] = await Promise.all([a.start(), b.start()]);
    expect(ra).toEqual(rb);
    expect([a.ownsProcess, b.ownsProcess].sort()).toEqual([false, true]);
    expect(await redisProcessesFor(dir)).toEqual([a.pid]);
    expect(existsSync(path.join(dir, 'redis.start.lock'))).toBe(false);
  });

  it('attaches to a server left running by a process that exited without stop()', async () => {
    const dir = tempDir();
    // A separate process starts the server and exits, as a killed `tokenmill run` would.
    const script = [
      "import { pino } from 'pino';",
      "import { EmbeddedRedis } from './src/shared/redis/embedded-redis.ts';",
      `const s = new EmbeddedRedis({ dataDir: ${JSON.stringify(dir)}, logger: pino({ level: 'silent' }) });`,
      'const r = await s.start();',
      'process.stdout.write(JSON.stringify({ port: r.port, pid: s.pid }));',
      'process.exit(0);',
    ].join('\n');
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: path.resolve(import.meta.dirname, '../..'),
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const [code] = (await once(child, 'exit')) as [number];
    expect(code).toBe(0);
    const orphan = JSON.parse(out) as { port: number; pid: number };
    try {
      expect(isAlive(orphan.pid)).toBe(true);
      const attached = embedded({ dataDir: dir });
      const r = await attached.start();
      expect(r.port).toBe(orphan.port);
      expect(attached.pid).toBe(orphan.pid);
      expect(attached.ownsProcess).toBe(false);
    } finally {
      process.kill(orphan.pid, 'SIGTERM');
      await waitFor(() => !isAlive(orphan.pid), 10_000);
    }
  });

  it('starts a new server when the pid file names a dead process', async () => {
    const dir = tempDir();
    const first = embedded({ dataDir: dir });
    await first.start();
    const deadPid = first.pid ?? -1;
    // Kill it hard, as a machine crash would: the pid and port files stay behind.
    process.kill(deadPid, 'SIGKILL');
    await waitFor(() => !isAlive(deadPid), 10_000);
    expect(existsSync(path.join(dir, 'redis.pid'))).toBe(true);

    const second = embedded({ dataDir: dir });
    await second.start();
    expect(second.ownsProcess).toBe(true);
    expect(second.pid).not.toBe(deadPid);
    expect(await fs.readFile(path.join(dir, 'redis.pid'), 'utf8')).toBe(`${second.pid}\n`);
    expect(await connect(second.url).ping()).toBe('PONG');
  });

  it('throws a one-line EnvironmentError when redis-server is not installed', async () => {
    const dir = tempDir();
    const server = embedded({ dataDir: dir, redisServerPath: '/nonexistent/redis-server' });
    const err = await server.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(EnvironmentError);
    const message = (err as Error).message;
    expect(message).not.toContain('\n');
    expect(message).toBe(
      "redis-server not found at /nonexistent/redis-server: install Redis ≥ 6.2 (e.g. 'apt-get install redis-server' or 'brew install redis') or set redis.url in the config",
    );
    expect(existsSync(path.join(dir, 'redis.pid'))).toBe(false);
  });

  it('names PATH in the message when the default redis-server is missing', async () => {
    const dir = tempDir();
    const emptyBin = tempDir();
    const savedPath = process.env['PATH'];
    process.env['PATH'] = emptyBin;
    try {
      const err = await embedded({ dataDir: dir })
        .start()
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(err).toBeInstanceOf(EnvironmentError);
      expect((err as Error).message).toBe(REDIS_SERVER_NOT_FOUND_MESSAGE);
    } finally {
      process.env['PATH'] = savedPath;
    }
  });

  it('reports the log tail when the server exits before it is ready (bad flag)', async () => {
    const dir = tempDir();
    const server = embedded({ dataDir: dir, extraArgs: ['--no-such-directive', 'yes'] });
    const err = await server.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(EnvironmentError);
    const message = (err as Error).message;
    expect(message).toMatch(/redis-server exited with code \d+ before it was ready/);
    expect(message).toMatch(/Bad directive|wrong number of arguments/);
    expect(message).toContain('no-such-directive');
    expect(existsSync(path.join(dir, 'redis.pid'))).toBe(false);
    expect(existsSync(path.join(dir, 'redis.port'))).toBe(false);
  });

  it('reports the log tail when the requested port is taken', async () => {
    const dir = tempDir();
    // Accepts and drops connections, so nothing it accepted keeps close() waiting.
    const blocker = net.createServer((socket) => socket.destroy());
    listeners.push(blocker);
    blocker.listen(0, '127.0.0.1');
    await once(blocker, 'listening');
    const port = (blocker.address() as net.AddressInfo).port;

    const err = await embedded({ dataDir: dir, port })
      .start()
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(EnvironmentError);
    expect((err as Error).message).toMatch(/Address already in use/i);
    expect((err as Error).message).toContain(`port ${port}`);

    // The folder stays usable: a start on a free port works.
    const retry = embedded({ dataDir: dir });
    expect((await retry.start()).port).not.toBe(port);
  });

  it('findFreePort returns a port that can be bound', async () => {
    const port = await findFreePort();
    expect(port).toBeGreaterThan(0);
    const s = net.createServer();
    listeners.push(s);
    s.listen(port, '127.0.0.1');
    await once(s, 'listening');
    expect((s.address() as net.AddressInfo).port).toBe(port);
  });
});

describe('startTestRedis', () => {
  it('gives each call its own server, prefix and folder, and removes them on stop', async () => {
    const a = await startTestRedis();
    const b = await startTestRedis();
    try {
      expect(a.port).not.toBe(b.port);
      expect(a.port).not.toBe(6379);
      expect(a.prefix).toMatch(/^t[0-9a-f]+$/);
      expect(a.prefix).not.toBe(b.prefix);
      const conn = a.connection();
      expect(await conn.ping()).toBe('PONG');
      const pid = a.server.pid ?? -1;
      await a.stop();
      expect(conn.status).toBe('end');
      expect(isAlive(pid)).toBe(false);
      expect(existsSync(a.dataDir)).toBe(false);
      expect(() => a.connection()).toThrow(/stopped/);
      expect(await b.connection().ping()).toBe('PONG');
    } finally {
      await a.stop();
      await b.stop();
    }
  });
});
