// Probes of an embedded redis-server from outside: a raw PING, short-lived connections that ask
// it for its clients and identity, and the small timing helpers they use (embedded-redis.ts).
import { once } from 'node:events';
import { promises as fs } from 'node:fs';
import net from 'node:net';
import { Redis } from 'ioredis';
import { AppError } from '../errors.js';

/** The embedded server listens on loopback only. */
export const HOST = '127.0.0.1';

/**
 * Finds a TCP port that is free on 127.0.0.1 right now (listens on port 0, reads the port the
 * kernel chose, closes). Another process may take it before it is used: callers that bind it
 * later must handle "address in use".
 */
export async function findFreePort(): Promise<number> {
  const server = net.createServer();
  server.unref();
  server.listen(0, HOST);
  await once(server, 'listening');
  const address = server.address();
  await new Promise<void>((resolve, reject) => server.close((e) => (e ? reject(e) : resolve())));
  if (address === null || typeof address === 'string') {
    throw new AppError('could not determine a free TCP port');
  }
  return address.port;
}

/** One PING over a raw socket: `pong`, `loading` (replaying the AOF, or any error reply) or `down`. */
export async function pingOnce(port: number, timeoutMs: number): Promise<'pong' | 'loading' | 'down'> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: HOST, port });
    let buffered = '';
    const finish = (result: 'pong' | 'loading' | 'down'): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(result);
    };
    const timer = setTimeout(() => finish('down'), timeoutMs);
    socket.setEncoding('utf8');
    socket.on('connect', () => socket.write('*1\r\n$4\r\nPING\r\n'));
    socket.on('data', (chunk: string) => {
      buffered += chunk;
      const end = buffered.indexOf('\r\n');
      if (end < 0) return;
      finish(buffered.startsWith('+PONG') ? 'pong' : 'loading');
    });
    socket.on('error', () => finish('down'));
    socket.on('close', () => finish('down'));
  });
}

/**
 * Runs `ask` on a short-lived connection to the server on `port` that fails fast instead of
 * retrying; `fallback` when the server cannot be reached or the command fails.
 */
export async function askServer<T>(port: number, fallback: T, ask: (conn: Redis) => Promise<T>): Promise<T> {
  const conn = new Redis({
    host: HOST,
    port,
    lazyConnect: true,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 2_000,
  });
  conn.on('error', () => undefined);
  try {
    await conn.connect();
    return await ask(conn);
  } catch {
    return fallback;
  } finally {
    conn.disconnect();
  }
}

/** Clients connected to the server on `port`, besides the connection that asks (0 if it cannot tell). */
export function countOtherClients(port: number): Promise<number> {
  return askServer(port, 0, async (conn) => {
    const list = (await conn.client('LIST')) as string;
    return Math.max(0, list.split('\n').filter((l) => l.trim() !== '').length - 1);
  });
}

/** `INFO server` of the server on `port`: its pid and config file. Undefined if it cannot be read. */
export function readServerInfo(
  port: number,
): Promise<{ processId: number | undefined; configFile: string | undefined } | undefined> {
  return askServer(port, undefined, async (conn) => {
    const info = await conn.info('server');
    const processId = /^process_id:(\d+)\s*$/m.exec(info)?.[1];
    const configFile = /^config_file:(.*?)\s*$/m.exec(info)?.[1];
    return {
      processId: processId === undefined ? undefined : Number(processId),
      configFile: configFile === undefined || configFile === '' ? undefined : configFile,
    };
  });
}

/** On Linux, whether the process looks like a redis-server; elsewhere assume it may be one. */
export async function looksLikeRedisServer(pid: number): Promise<boolean> {
  try {
    const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8');
    return cmdline.includes('redis');
  } catch {
    return true;
  }
}
