// A redis.url whose port is not a working Redis: one that accepts TCP and never answers, and one
// where an HTTP server answers. `status` and `run` (real CLI children) end within a bound, non-zero,
// with one line that names the URL (password masked) and what to check, and no stack trace.
import { spawn } from 'node:child_process';
import net from 'node:net';
import { createServer, type Server } from 'node:http';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  UnavailableError,
  closeRedisConnection,
  createRedisConnection,
  findFreePort,
  openRedis,
} from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';
import { spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const { tmp } = useHarness({ tmp: true, cli: true });

let silent: net.Server;
let http: Server;
const sockets = new Set<net.Socket>();

function listen(server: net.Server | Server): Promise<number> {
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)),
  );
}

let silentPort: number;
let httpPort: number;

beforeAll(async () => {
  // Accepts every connection, reads what comes, never writes a byte.
  silent = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
    s.on('close', () => sockets.delete(s));
  });
  http = createServer((_req, res) => res.writeHead(404, { 'content-type': 'text/html' }).end('<html>not found</html>'));
  silentPort = await listen(silent);
  httpPort = await listen(http);
  writePrompts(tmp.dir, 'a', 3);
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await new Promise((r) => silent.close(r));
  http.closeAllConnections();
  await new Promise((r) => http.close(r));
});

function config(port: number, name: string): string {
  return writeTestConfig(
    tmp.dir,
    {
      run: 'silent',
      redis: { url: `redis://:s3cret-pass@127.0.0.1:${port}/0` },
      sim: 'http://127.0.0.1:9',
      sglang: { concurrency: 1, contextLength: 4096 },
      datasets: [{ name: 'a', prompts: 'a.jsonl', tokenBudget: 1000, maxNewTokens: 8 }],
    },
    name,
  );
}

async function runBounded(
  args: string[],
  boundMs: number,
): Promise<{ code: number | string; output: string; ms: number }> {
  const started = Date.now();
  const p = spawnCli(args);
  const timer = setTimeout(() => p.child.kill('SIGKILL'), boundMs);
  const code = await p.exited;
  clearTimeout(timer);
  return { code, output: p.output(), ms: Date.now() - started };
}

// The cases wait on bounds of 10 to 15 s, each on its own port or process: they run side by side.
describe.concurrent('Redis ports that do not work', () => {
  describe('a redis.url that is not a working Redis', () => {
    // The first answer is bounded at 10 s; the CLI's own start takes a few seconds on a busy machine.
    const BOUND_MS = 45_000;

    for (const verb of ['status', 'run']) {
      it(`${verb}: a port that accepts TCP and never answers ends with a line naming the URL`, async () => {
        const url = `redis://:***@127.0.0.1:${silentPort}/0`;
        const r = await runBounded([verb, '-c', config(silentPort, `silent-${verb}.yaml`)], BOUND_MS);
        expect(r.code, r.output).toBe(1);
        expect(r.ms).toBeLessThan(BOUND_MS);
        expect(r.output).toContain(`tokenmill: Redis at ${url} accepted the connection but did not answer within 10 s`);
        expect(r.output).toMatch(/check that this host and port is a Redis server/);
        expect(r.output).not.toContain('s3cret-pass');
        expect(r.output).not.toMatch(/\n\s+at /);
      });
    }

    it('status: an HTTP server on the Redis port is named as what it is, not "max retries"', async () => {
      const url = `redis://:***@127.0.0.1:${httpPort}/0`;
      const r = await runBounded(['status', '-c', config(httpPort, 'http.yaml')], BOUND_MS);
      expect(r.code, r.output).toBe(1);
      expect(r.output).toContain(
        `tokenmill: cannot use Redis at ${url}: Protocol error, got "H": is ${url} a Redis server?`,
      );
      expect(r.output).not.toMatch(/max retries per request/i);
      expect(r.output).not.toContain('s3cret-pass');
      expect(r.output).not.toMatch(/\n\s+at |"stack"/);
    });
  });

  describe('a port whose server resets connections before it answers', () => {
    it('is still tried until it answers, and then named as not Redis (not as the retry limit)', async () => {
      // The first five connections are reset as soon as they send anything (what a busy HTTP server
      // that closes with unread bytes looks like); later ones get an HTTP reply.
      let connections = 0;
      const server = net.createServer((s) => {
        connections += 1;
        const n = connections;
        s.on('error', () => undefined);
        s.once('data', () => {
          if (n <= 5) s.resetAndDestroy();
          else s.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
        });
      });
      const port = await listen(server);
      try {
        const url = `redis://127.0.0.1:${port}/0`;
        await expect(openRedis({ url, dataDir: tmp.dir, logger: quietLogger() })).rejects.toThrow(
          `cannot use Redis at ${url}: Protocol error, got "H": is ${url} a Redis server?`,
        );
        expect(connections).toBeGreaterThan(5);
      } finally {
        await new Promise((r) => server.close(r));
      }
    }, 30_000);
  });

  describe('a long-lived connection to a server that accepted it and stays silent', () => {
    it('logs one line naming the URL after 15 s, not a flood', async () => {
      const lines: Array<{ level: number; msg: string }> = [];
      const sink = new Writable({
        write(chunk: Buffer, _enc, done) {
          for (const l of chunk.toString().split('\n'))
            if (l.trim() !== '') lines.push(JSON.parse(l) as { level: number; msg: string });
          done();
        },
      });
      const conn = createRedisConnection(`redis://:s3cret-pass@127.0.0.1:${silentPort}/0`, {
        role: 'worker',
        name: 'tokenmill:test',
        logger: pino({ level: 'info' }, sink),
      });
      try {
        const silentReports = () => lines.filter((l) => l.msg.includes('accepted the connection but has not answered'));
        await waitFor(() => silentReports().length > 0, 'the line after 15 s of silence', 20_000, 100);
        // A window in which no second line may come (the point: one line, not a flood).
        await new Promise((r) => setTimeout(r, 1_500));
        const reports = silentReports();
        expect(reports).toHaveLength(1);
        expect(reports[0]?.level).toBe(40);
        expect(reports[0]?.msg).toContain(
          `Redis at redis://:***@127.0.0.1:${silentPort}/0 accepted the connection but has not answered for 15 s; waiting`,
        );
        expect(JSON.stringify(lines)).not.toContain('s3cret-pass');
      } finally {
        await closeRedisConnection(conn);
      }
    }, 40_000);
  });

  describe('a Redis that wants a password', () => {
    it('says it needs one, or that it refused the one given, naming the URL without the password', async () => {
      // Its own redis-server: the test helper's readiness PING has no password.
      const port = await findFreePort();
      const child = spawn(
        'redis-server',
        [
          '--port',
          String(port),
          '--bind',
          '127.0.0.1',
          '--save',
          '',
          '--appendonly',
          'no',
          '--maxmemory-policy',
          'noeviction',
          '--requirepass',
          'right-pass',
        ],
        { stdio: 'ignore' },
      );
      const server = { port };
      try {
        await waitFor(
          () =>
            new Promise<boolean>((resolve) => {
              const s = net.connect(port, '127.0.0.1', () => {
                s.destroy();
                resolve(true);
              });
              s.on('error', () => resolve(false));
            }),
          'redis-server with a password',
          20_000,
          100,
        );
        const open = (url: string) => openRedis({ url, dataDir: tmp.dir, logger: quietLogger() });
        await expect(open(`redis://127.0.0.1:${server.port}/0`)).rejects.toThrow(
          new UnavailableError(
            `Redis at redis://127.0.0.1:${server.port}/0 needs a password (NOAUTH Authentication required): put it in redis.url (redis://:<password>@host:6379/0), or in redis.password with redis.sentinels`,
          ),
        );
        await expect(open(`redis://:wrong-pass@127.0.0.1:${server.port}/0`)).rejects.toThrow(
          /^Redis at redis:\/\/:\*\*\*@127\.0\.0\.1:\d+\/0 refused the password \(WRONGPASS/,
        );
        const opened = await open(`redis://:right-pass@127.0.0.1:${server.port}/0`);
        expect(opened.server.maxmemoryPolicy).toBe('noeviction');
        await opened.close();
      } finally {
        child.kill('SIGKILL');
      }
    });
  });
});
