// A Toxiproxy-style TCP proxy on loopback that a test controls: it stands between one process
// and a server (Redis, the SGLang simulator) and passes, drops, refuses, stalls or delays the
// traffic on command. Traffic stays on 127.0.0.1: the proxy listens there and only forwards there.
import net from 'node:net';

/**
 * What the proxy does with traffic:
 * - `pass`: forwards bytes both ways; connections held by `blackhole` are released (their held
 *   bytes delivered, as TCP retransmits them once a pulled cable is plugged back in).
 * - `drop`: resets every open connection now and every new one as it arrives (a host cut off
 *   mid-stream).
 * - `refuse`: stops listening (new connections get ECONNREFUSED); open ones are reset.
 * - `blackhole`: accepts connections but forwards nothing; open connections stall, their bytes
 *   held until `pass` (a cable pulled without RST: neither side notices).
 * - `{ latencyMs }`: forwards every chunk `latencyMs` late, in order (see {@link latency}).
 */
export type FaultMode = 'pass' | 'drop' | 'refuse' | 'blackhole' | { latencyMs: number };

/** The `{ latencyMs }` mode. */
export function latency(ms: number): FaultMode {
  if (!Number.isFinite(ms) || ms < 0)
    throw new Error(`fault proxy: latency must be a non-negative number of ms, got ${ms}`);
  return { latencyMs: ms };
}

export interface FaultProxyOptions {
  /** The server behind the proxy; only 127.0.0.1 is accepted. */
  target: { host: string; port: number };
  /** Initial mode (default `pass`). */
  mode?: FaultMode;
}

/** Counts since the proxy started. */
export interface FaultProxyStats {
  /** Connections accepted. */
  accepted: number;
  /** Connections reset by `drop` or `refuse` (open ones and new ones). */
  dropped: number;
  /** Connections open now (accepted and not yet closed). */
  open: number;
  /** Bytes delivered client → server and server → client. */
  bytesUp: number;
  bytesDown: number;
}

export interface FaultProxy {
  /** The port the proxy listens on (127.0.0.1); it stays the same across `refuse` and `pass`. */
  readonly port: number;
  /** `<scheme>://127.0.0.1:<port><path>`, e.g. `url('redis', '/0')` or `url('http')`. */
  url(scheme: string, path?: string): string;
  readonly mode: FaultMode;
  /** Switches the mode; resolves once it is in effect (listening again, connections reset). */
  setMode(mode: FaultMode): Promise<void>;
  stats(): FaultProxyStats;
  /** Resets every connection and stops listening. Safe to call twice. */
  close(): Promise<void>;
}

const LOOPBACK = '127.0.0.1';

type Item = { kind: 'data'; chunk: Buffer; dueMs: number } | { kind: 'end'; dueMs: number };

/** One direction of a connection: what `from` sent, waiting to be written to `to`. */
interface Lane {
  from: net.Socket | undefined;
  to: net.Socket | undefined;
  items: Item[];
  timer: NodeJS.Timeout | undefined;
  counter: 'bytesUp' | 'bytesDown';
}

/** A client connection and its upstream twin, with the bytes between them. */
class Connection {
  upstream: net.Socket | undefined;
  private readonly up: Lane;
  private readonly down: Lane;
  private closed = false;
  /** A side reset (or errored) while traffic was held: the other side learns it on release. */
  private resetPending = false;

  constructor(
    readonly client: net.Socket,
    private readonly proxy: FaultProxyImpl,
  ) {
    this.up = { from: client, to: undefined, items: [], timer: undefined, counter: 'bytesUp' };
    this.down = { from: undefined, to: client, items: [], timer: undefined, counter: 'bytesDown' };
    this.listen(this.up, client);
  }

  /** Connects to the target (once); the down lane then reads from it. */
  connectUpstream(): void {
    if (this.upstream !== undefined || this.closed) return;
    const upstream = net.connect({ host: LOOPBACK, port: this.proxy.targetPort, allowHalfOpen: true });
    this.upstream = upstream;
    this.up.to = upstream;
    this.down.from = upstream;
    this.listen(this.down, upstream);
    upstream.on('connect', () => this.pump(this.up));
  }

  private listen(lane: Lane, from: net.Socket): void {
    from.on('data', (chunk: Buffer) => {
      lane.items.push({ kind: 'data', chunk, dueMs: Date.now() + this.proxy.latencyMs() });
      this.pump(lane);
    });
    from.on('end', () => {
      lane.items.push({ kind: 'end', dueMs: Date.now() + this.proxy.latencyMs() });
      this.pump(lane);
    });
    from.on('error', () => undefined);
    from.on('close', (hadError: boolean) => {
      if (hadError || !from.readableEnded) {
        // A reset (or a failed connect): the other side is reset too — once traffic flows.
        this.resetPending = true;
        if (!this.proxy.holding()) this.destroy(true);
        return;
      }
      // Both sides closed cleanly (each ended, each end forwarded): nothing left to do.
      if (this.client.destroyed && (this.upstream === undefined || this.upstream.destroyed)) this.destroy(false);
    });
  }

  /** Writes what is due on a lane, in order, unless the proxy holds traffic. */
  private pump(lane: Lane): void {
    if (this.closed || this.proxy.holding()) return;
    const to = lane.to;
    if (to === undefined || to.connecting) return;
    clearTimeout(lane.timer);
    lane.timer = undefined;
    const now = Date.now();
    for (let item = lane.items[0]; item !== undefined; item = lane.items[0]) {
      if (item.dueMs > now) {
        lane.timer = setTimeout(() => this.pump(lane), item.dueMs - now);
        return;
      }
      lane.items.shift();
      if (item.kind === 'end') {
        to.end();
        continue;
      }
      this.proxy.counters[lane.counter] += item.chunk.length;
      if (!to.write(item.chunk)) {
        // Backpressure: stop reading the sender until the receiver drains.
        const from = lane.from;
        from?.pause();
        to.once('drain', () => {
          if (!this.proxy.holding()) from?.resume();
          this.pump(lane);
        });
        return;
      }
    }
  }

  /** Resumes forwarding after a hold (connecting upstream first if the hold came before it). */
  release(): void {
    if (this.closed) return;
    if (this.resetPending) {
      this.destroy(true);
      return;
    }
    this.connectUpstream();
    this.client.resume();
    this.upstream?.resume();
    this.pump(this.up);
    this.pump(this.down);
  }

  /** Stops reading both sides: bytes in flight wait in the kernel's buffers, as on a stalled link. */
  hold(): void {
    this.client.pause();
    this.upstream?.pause();
  }

  /** Closes both sides, with a TCP reset when `reset`. */
  destroy(reset: boolean): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.up.timer);
    clearTimeout(this.down.timer);
    for (const s of [this.client, this.upstream]) {
      if (s === undefined || s.destroyed) continue;
      if (reset) resetSocket(s);
      else s.destroy();
    }
    this.proxy.forget(this);
  }
}

/** Closes a socket with a TCP RST (the peer sees ECONNRESET), or plainly when it has no TCP handle. */
function resetSocket(s: net.Socket): void {
  try {
    s.resetAndDestroy();
  } catch {
    s.destroy();
  }
}

class FaultProxyImpl implements FaultProxy {
  private server: net.Server;
  private readonly connections = new Set<Connection>();
  private current: FaultMode;
  private listening = false;
  private closedForGood = false;
  readonly counters = { accepted: 0, dropped: 0, bytesUp: 0, bytesDown: 0 };
  port = 0;

  constructor(
    readonly targetPort: number,
    mode: FaultMode,
  ) {
    this.current = mode;
    this.server = this.newServer();
  }

  get mode(): FaultMode {
    return this.current;
  }

  url(scheme: string, path = ''): string {
    return `${scheme}://${LOOPBACK}:${this.port}${path}`;
  }

  latencyMs(): number {
    return typeof this.current === 'object' ? this.current.latencyMs : 0;
  }

  holding(): boolean {
    return this.current === 'blackhole';
  }

  stats(): FaultProxyStats {
    return { ...this.counters, open: this.connections.size };
  }

  forget(c: Connection): void {
    this.connections.delete(c);
  }

  private newServer(): net.Server {
    const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true }, (socket) => this.accept(socket));
    server.on('error', () => undefined);
    return server;
  }

  private accept(socket: net.Socket): void {
    this.counters.accepted += 1;
    socket.on('error', () => undefined);
    if (this.current === 'drop' || this.current === 'refuse' || this.closedForGood) {
      this.counters.dropped += 1;
      resetSocket(socket);
      return;
    }
    const c = new Connection(socket, this);
    this.connections.add(c);
    if (this.holding()) return; // accepted, paused, never forwarded until `pass`
    c.connectUpstream();
    socket.resume();
  }

  async listen(port: number): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const onError = (e: Error): void =>
        reject(new Error(`fault proxy: cannot listen on ${LOOPBACK}:${port}: ${e.message}`));
      this.server.once('error', onError);
      this.server.listen({ host: LOOPBACK, port, exclusive: true }, () => {
        this.server.off('error', onError);
        resolve();
      });
    });
    const address = this.server.address();
    if (address === null || typeof address === 'string') throw new Error('fault proxy: no TCP address');
    this.port = address.port;
    this.listening = true;
  }

  private async stopListening(): Promise<void> {
    if (!this.listening) return;
    this.listening = false;
    const server = this.server;
    // server.close() waits for every accepted socket: those are ours to end, so do not wait on it.
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      for (const c of [...this.connections]) c.destroy(true);
    });
    this.server = this.newServer();
  }

  private resetAll(): void {
    for (const c of [...this.connections]) {
      this.counters.dropped += 1;
      c.destroy(true);
    }
  }

  async setMode(mode: FaultMode): Promise<void> {
    if (this.closedForGood) throw new Error('fault proxy is closed');
    if (typeof mode === 'object') latency(mode.latencyMs);
    this.current = mode;
    switch (mode) {
      case 'drop':
        this.resetAll();
        if (!this.listening) await this.listen(this.port);
        return;
      case 'refuse':
        this.resetAll();
        await this.stopListening();
        return;
      case 'blackhole':
        for (const c of this.connections) c.hold();
        if (!this.listening) await this.listen(this.port);
        return;
      default:
        if (!this.listening) await this.listen(this.port);
        for (const c of [...this.connections]) c.release();
    }
  }

  async close(): Promise<void> {
    if (this.closedForGood) return;
    this.closedForGood = true;
    for (const c of [...this.connections]) c.destroy(true);
    await this.stopListening();
  }
}

/**
 * Starts a fault proxy on 127.0.0.1 (a free port) in front of `target` (which must be on
 * 127.0.0.1 too). Close it with `close()`.
 */
export async function startFaultProxy(options: FaultProxyOptions): Promise<FaultProxy> {
  const { host, port } = options.target;
  if (host !== LOOPBACK) throw new Error(`fault proxy: target host must be ${LOOPBACK} (loopback only), got ${host}`);
  if (!Number.isInteger(port) || port <= 0 || port > 65_535)
    throw new Error(`fault proxy: invalid target port ${port}`);
  const mode = options.mode ?? 'pass';
  if (typeof mode === 'object') latency(mode.latencyMs);
  const proxy = new FaultProxyImpl(port, mode);
  await proxy.listen(0);
  if (mode === 'refuse') await proxy.setMode('refuse');
  return proxy;
}

/** The port of a `scheme://127.0.0.1:<port>…` URL (the simulator's or a test Redis's), for `target`. */
export function loopbackPort(url: string): number {
  const parsed = new URL(url);
  if (parsed.hostname !== LOOPBACK) throw new Error(`fault proxy: ${url} is not on ${LOOPBACK}`);
  const port = Number(parsed.port);
  if (!Number.isInteger(port) || port <= 0) throw new Error(`fault proxy: ${url} names no port`);
  return port;
}
