// The fault proxy the fault suite puts between a worker and its servers: an echo server on
// 127.0.0.1 behind it, real sockets, each mode doing what it says.
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { latency, loopbackPort, startFaultProxy, type FaultProxy } from '../helpers/fault-proxy.js';
import { waitFor } from '../helpers/pipeline.js';

let echo: net.Server;
let echoPort: number;
/** Connections the echo server has accepted (what got through the proxy). */
let echoAccepted = 0;
const echoSockets = new Set<net.Socket>();
const proxies: FaultProxy[] = [];
const clients = new Set<net.Socket>();

beforeAll(async () => {
  echo = net.createServer((s) => {
    echoAccepted += 1;
    echoSockets.add(s);
    s.on('close', () => echoSockets.delete(s));
    s.on('error', () => undefined);
    s.pipe(s);
  });
  await new Promise<void>((resolve) => echo.listen({ host: '127.0.0.1', port: 0 }, resolve));
  echoPort = (echo.address() as net.AddressInfo).port;
});

afterEach(async () => {
  for (const c of clients) c.destroy();
  clients.clear();
  for (const p of proxies.splice(0)) await p.close();
});

afterAll(async () => {
  for (const s of echoSockets) s.destroy();
  await new Promise<void>((resolve) => echo.close(() => resolve()));
});

async function proxy(): Promise<FaultProxy> {
  const p = await startFaultProxy({ target: { host: '127.0.0.1', port: echoPort } });
  proxies.push(p);
  return p;
}

/** A client socket with everything it received and how it ended. */
interface Client {
  socket: net.Socket;
  received(): string;
  /** The error code it closed with (`ECONNRESET`, `ECONNREFUSED`), `end` for a clean close, or undefined while open. */
  ended(): string | undefined;
}

function connect(port: number): Client {
  const socket = net.connect({ host: '127.0.0.1', port });
  clients.add(socket);
  let got = '';
  let how: string | undefined;
  socket.on('data', (d: Buffer) => (got += d.toString()));
  socket.on('error', (e: NodeJS.ErrnoException) => (how ??= e.code ?? e.message));
  socket.on('close', () => (how ??= 'end'));
  return { socket, received: () => got, ended: () => how };
}

async function connected(c: Client): Promise<void> {
  await waitFor(() => !c.socket.connecting || c.ended() !== undefined, 'the client connected');
  if (c.ended() !== undefined) throw new Error(`the client closed while connecting: ${c.ended()}`);
}

/** Waits a bounded while and says whether `cond` ever held (for "nothing arrives" checks). */
async function happensWithin(cond: () => boolean, ms: number): Promise<boolean> {
  try {
    await waitFor(cond, 'it', ms, 20);
    return true;
  } catch {
    return false;
  }
}

describe('fault proxy', () => {
  it('pass: forwards bytes both ways and counts them', async () => {
    const p = await proxy();
    expect(p.url('redis', '/0')).toBe(`redis://127.0.0.1:${p.port}/0`);
    const c = connect(p.port);
    c.socket.write('hello ');
    c.socket.write('world');
    await waitFor(() => c.received() === 'hello world', 'the echo');
    expect(p.stats()).toMatchObject({ accepted: 1, open: 1, bytesUp: 11, bytesDown: 11, dropped: 0 });
    // A clean close from the client ends both sides.
    c.socket.end();
    await waitFor(() => c.ended() === 'end' && p.stats().open === 0, 'a clean close on both sides');
  });

  it('latency: every chunk arrives late, in order', async () => {
    const p = await proxy();
    const c = connect(p.port);
    await connected(c);
    await p.setMode(latency(150));
    const t0 = Date.now();
    for (const part of ['a', 'b', 'c', 'd']) c.socket.write(part);
    await waitFor(() => c.received() === 'abcd', 'the delayed echo', 5_000, 5);
    // Up and down: at least twice the latency.
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    await p.setMode('pass');
    const t1 = Date.now();
    c.socket.write('e');
    await waitFor(() => c.received() === 'abcde', 'the prompt echo', 5_000, 5);
    expect(Date.now() - t1).toBeLessThan(150);
    expect(() => latency(-1)).toThrow(/non-negative/);
  });

  it('drop: resets open connections now and new ones as they arrive; pass restores', async () => {
    const p = await proxy();
    const open = connect(p.port);
    open.socket.write('x');
    await waitFor(() => open.received() === 'x', 'the echo');
    await p.setMode('drop');
    await waitFor(() => open.ended() !== undefined, 'the open connection cut');
    expect(open.ended()).toBe('ECONNRESET');
    const accepted = echoAccepted;
    const fresh = connect(p.port);
    fresh.socket.on('connect', () => fresh.socket.write('y'));
    await waitFor(() => fresh.ended() !== undefined, 'the new connection cut');
    expect(fresh.ended()).toBe('ECONNRESET');
    expect(fresh.received()).toBe('');
    expect(echoAccepted).toBe(accepted);
    expect(p.stats().dropped).toBe(2);
    // The server side of the open connection was cut too.
    await waitFor(() => echoSockets.size === 0, 'the server side closed');
    await p.setMode('pass');
    const again = connect(p.port);
    again.socket.write('z');
    await waitFor(() => again.received() === 'z', 'the echo after restore');
  });

  it('refuse: stops listening (ECONNREFUSED), resets open connections; pass listens again on the same port', async () => {
    const p = await proxy();
    const port = p.port;
    const open = connect(port);
    open.socket.write('x');
    await waitFor(() => open.received() === 'x', 'the echo');
    await p.setMode('refuse');
    await waitFor(() => open.ended() !== undefined, 'the open connection cut');
    expect(open.ended()).toBe('ECONNRESET');
    const refused = connect(port);
    await waitFor(() => refused.ended() !== undefined, 'the connection refused');
    expect(refused.ended()).toBe('ECONNREFUSED');
    await p.setMode('pass');
    expect(p.port).toBe(port);
    const again = connect(port);
    again.socket.write('z');
    await waitFor(() => again.received() === 'z', 'the echo after restore');
  });

  it('blackhole: open connections stall and new ones are accepted but go nowhere; pass delivers what was held', async () => {
    const p = await proxy();
    const open = connect(p.port);
    open.socket.write('before;');
    await waitFor(() => open.received() === 'before;', 'the echo');
    await p.setMode('blackhole');
    const accepted = echoAccepted;
    open.socket.write('during;');
    const fresh = connect(p.port);
    await connected(fresh); // the TCP handshake completes: the client cannot tell
    fresh.socket.write('held');
    expect(await happensWithin(() => open.received() !== 'before;' || fresh.received() !== '', 600)).toBe(false);
    expect(open.ended()).toBeUndefined();
    expect(fresh.ended()).toBeUndefined();
    expect(echoAccepted).toBe(accepted); // the new one never reached the server
    expect(p.stats().open).toBe(2);
    await p.setMode('pass');
    await waitFor(
      () => open.received() === 'before;during;' && fresh.received() === 'held',
      'the held bytes delivered',
    );
    expect(echoAccepted).toBe(accepted + 1);
  });

  it('blackhole then drop: stalled connections are reset', async () => {
    const p = await proxy();
    const open = connect(p.port);
    await connected(open);
    await p.setMode('blackhole');
    open.socket.write('lost');
    await p.setMode('drop');
    await waitFor(() => open.ended() !== undefined, 'the stalled connection cut');
    expect(open.ended()).toBe('ECONNRESET');
    expect(open.received()).toBe('');
  });

  it('a target that is down: the client connection is reset', async () => {
    const spare = net.createServer();
    await new Promise<void>((resolve) => spare.listen({ host: '127.0.0.1', port: 0 }, resolve));
    const downPort = (spare.address() as net.AddressInfo).port;
    await new Promise<void>((resolve) => spare.close(() => resolve()));
    const p = await startFaultProxy({ target: { host: '127.0.0.1', port: downPort } });
    proxies.push(p);
    const c = connect(p.port);
    await waitFor(() => c.ended() !== undefined, 'the connection cut');
    expect(c.ended()).toBe('ECONNRESET');
  });

  it('close: every connection is reset and the port refuses', async () => {
    const p = await proxy();
    const open = connect(p.port);
    await connected(open);
    await p.close();
    await p.close(); // twice is fine
    await waitFor(() => open.ended() !== undefined, 'the connection cut');
    const refused = connect(p.port);
    await waitFor(() => refused.ended() !== undefined, 'the connection refused');
    expect(refused.ended()).toBe('ECONNREFUSED');
    await expect(p.setMode('pass')).rejects.toThrow(/closed/);
  });

  it('only loopback: another target host is refused with a message', async () => {
    await expect(startFaultProxy({ target: { host: '10.0.0.1', port: 6379 } })).rejects.toThrow(
      /must be 127\.0\.0\.1.*10\.0\.0\.1/,
    );
    await expect(startFaultProxy({ target: { host: 'localhost', port: 6379 } })).rejects.toThrow(/loopback only/);
    expect(loopbackPort('redis://127.0.0.1:6390')).toBe(6390);
    expect(() => loopbackPort('http://example.com:80')).toThrow(/not on 127\.0\.0\.1/);
  });
});
