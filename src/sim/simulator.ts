/**
 * The SGLang simulator (docs/simulator.md): SGLang's HTTP contract (docs/design.md, SGLang's HTTP
 * API as tokenmill uses it) on node:http, in front of a continuous-batching load model, with fault
 * injection and an admin API under /_sim/.
 *
 * This file holds the server: listener, routing, API key, outages and crashes. The routes live
 * in generation.ts (generation, abort), info-routes.ts (info, load, metrics, tokenize) and
 * admin-routes.ts (/_sim/*); their shared state in state.ts.
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

import { AppError, errorCode, type Logger, logger } from '../shared/index.js';
import { type AdminTarget, adminFaults, adminOutage, adminReset, adminStats } from './admin-routes.js';
import { dropConnection, replyStatus } from './fault-replies.js';
import type { FaultConfig } from './faults.js';
import { CHAT_ROUTE, GENERATE_ROUTE, GenerationRoutes } from './generation.js';
import { HttpReplyError, sendEmpty, sendJson } from './http-util.js';
import { InfoRoutes } from './info-routes.js';
import { resolveOptions } from './options.js';
import { WEIGHT_VERSION } from './responses.js';
import { SimState, loadSimTokenizer } from './state.js';
import type { SimStats, SimulatorHandle, SimulatorOptions } from './types.js';

type Handler = (req: IncomingMessage, res: ServerResponse, url: URL) => Promise<void> | void;

/** Routes SGLang's `--api-key` middleware lets through without a key. */
function isOpenRoute(pathname: string): boolean {
  return pathname.startsWith('/health') || pathname.startsWith('/metrics');
}

function isHealthRoute(pathname: string): boolean {
  return pathname.startsWith('/health') || pathname === '/ping';
}

export class Simulator implements AdminTarget {
  private readonly s: SimState;
  private readonly log: Logger;
  private readonly server: http.Server;
  private readonly sockets = new Set<Socket>();
  private readonly generation: GenerationRoutes;
  private readonly info: InfoRoutes;
  private readonly routes = new Map<string, Map<string, Handler>>();
  private ready: Promise<void> = Promise.resolve();
  private listening = false;
  private reopenTimer: ReturnType<typeof setTimeout> | undefined;
  private stopped = false;

  constructor(options: SimulatorOptions = {}) {
    this.log = logger('sim');
    this.s = new SimState(resolveOptions(options), this.log);
    this.generation = new GenerationRoutes(this.s, {
      crash: (downMs) => {
        void this.outage(downMs);
      },
    });
    this.info = new InfoRoutes(this.s);
    this.server = http.createServer((req, res) => {
      this.dispatch(req, res).catch((e: unknown) => {
        this.log.error({ err: e, url: req.url }, 'simulator handler failed');
        if (!res.headersSent)
          sendJson(res, 500, {
            object: 'error',
            message: 'Internal Server Error',
            type: '500',
            param: null,
            code: 500,
          });
        else res.destroy();
      });
    });
    // uvicorn's keep-alive timeout.
    this.server.keepAliveTimeout = 5000;
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
    });
    this.registerRoutes();
  }

  get url(): string {
    const host = this.s.o.host.includes(':') ? `[${this.s.o.host}]` : this.s.o.host;
    return `http://${host}:${this.s.boundPort}`;
  }

  get port(): number {
    return this.s.boundPort;
  }

  /** Listens, then loads the tokenizer; health checks answer 503 until it is loaded. */
  async start(): Promise<void> {
    try {
      await this.listen(this.s.o.port);
    } catch (e: unknown) {
      const code = errorCode(e);
      if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
        const why =
          code === 'EADDRINUSE'
            ? 'is already in use'
            : code === 'EACCES'
              ? 'may not be used by this user'
              : 'is not an address of this machine';
        throw new AppError(
          `the simulator cannot listen on ${this.s.o.host}:${this.s.o.port}: the ${code === 'EADDRNOTAVAIL' ? 'host' : 'port'} ${why} (${code}); choose another with --port (0 picks a free one) or --host`,
          { cause: e },
        );
      }
      throw e;
    }
    this.ready = (async () => {
      const { tokenizer, pool } = await loadSimTokenizer(this.s.o.tokenizerPath);
      this.s.pool = pool;
      this.s.tokenizer = tokenizer;
      this.s.starting = false;
    })();
    try {
      await this.ready;
    } catch (e: unknown) {
      await this.stop();
      throw e;
    }
    this.log.info(
      {
        url: this.url,
        version: this.s.o.version,
        timeScale: this.s.o.timeScale,
        maxRunningRequests: this.s.o.maxRunningRequests,
      },
      'SGLang simulator ready',
    );
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    if (this.reopenTimer !== undefined) clearTimeout(this.reopenTimer);
    await this.closeListener();
    this.generation.cancelAll();
    this.s.load.stop();
  }

  /**
   * Sets faults. Turning `outage` on drops every open connection but `keepSocket` (the admin
   * request that asked for it), so requests in flight fail as they would in a real outage.
   */
  setFaults(partial: Partial<FaultConfig>, keepSocket?: Socket): void {
    const wasOut = this.s.faults.current().outage;
    this.s.faults.set(partial);
    this.log.debug({ faults: this.s.faults.current() }, 'faults set');
    if (!wasOut && this.s.faults.current().outage) {
      for (const socket of this.sockets) if (socket !== keepSocket) socket.destroy();
    }
  }

  clearFaults(): void {
    this.s.faults.clear();
    this.log.debug('faults cleared');
  }

  currentFaults(): FaultConfig {
    return this.s.faults.current();
  }

  async outage(durationMs: number): Promise<void> {
    if (!(durationMs >= 0)) throw new RangeError(`outage duration must be >= 0, got ${durationMs}`);
    if (this.stopped) return;
    this.log.info({ durationMs }, 'outage: going down');
    if (this.reopenTimer !== undefined) clearTimeout(this.reopenTimer);
    await this.closeListener();
    // A restarted server has no requests: whatever was in flight is gone with its socket.
    this.generation.cancelAll();
    this.reopenTimer = setTimeout(() => {
      this.reopenTimer = undefined;
      void this.reopen(0);
    }, durationMs);
  }

  stats(): SimStats {
    return this.s.stats();
  }

  resetStats(): void {
    this.s.resetStats();
  }

  // --- listener ---

  private listen(port: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const onError = (e: Error): void => {
        this.server.off('listening', onListening);
        reject(e);
      };
      const onListening = (): void => {
        this.server.off('error', onError);
        const address = this.server.address();
        if (address !== null && typeof address === 'object') this.s.boundPort = address.port;
        this.listening = true;
        resolve();
      };
      this.server.once('error', onError);
      this.server.once('listening', onListening);
      this.server.listen(port, this.s.o.host);
    });
  }

  private async reopen(attempt: number): Promise<void> {
    if (this.stopped) return;
    try {
      await this.listen(this.s.boundPort);
      this.log.info({ url: this.url }, 'outage over: listening again');
    } catch (e: unknown) {
      // The port may linger for a moment; try again shortly.
      this.log.warn({ err: e, attempt }, 'cannot listen again yet');
      if (attempt < 100) this.reopenTimer = setTimeout(() => void this.reopen(attempt + 1), 50);
    }
  }

  private closeListener(): Promise<void> {
    if (!this.listening) return Promise.resolve();
    this.listening = false;
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
      for (const socket of this.sockets) socket.destroy();
    });
  }

  // --- routing ---

  private route(methods: string[], paths: string[], handler: Handler): void {
    for (const path of paths) {
      const byMethod = this.routes.get(path) ?? new Map<string, Handler>();
      for (const method of methods) byMethod.set(method, handler);
      this.routes.set(path, byMethod);
    }
  }

  private registerRoutes(): void {
    const g = this.generation;
    const i = this.info;
    this.route(['GET'], ['/health', '/health_generate'], (_req, res) => this.health(res));
    this.route(['GET'], ['/ping'], (_req, res) => sendEmpty(res, 200));
    this.route(['POST', 'PUT'], [GENERATE_ROUTE], (req, res) => g.handleGenerate(req, res));
    this.route(['POST'], [CHAT_ROUTE], (req, res) => g.handleChat(req, res));
    this.route(['POST'], ['/abort_request'], (req, res) => g.handleAbort(req, res));
    this.route(['GET'], ['/v1/models'], (_req, res) =>
      sendJson(res, 200, { object: 'list', data: [i.modelCard(this.s.o.modelPath)] }),
    );
    this.route(['GET'], ['/model_info', '/get_model_info'], (_req, res) => sendJson(res, 200, i.modelInfo()));
    this.route(['GET'], ['/server_info', '/get_server_info'], (_req, res) => sendJson(res, 200, i.serverInfo()));
    this.route(['GET'], ['/get_load'], (_req, res) => sendJson(res, 200, i.getLoad()));
    this.route(['GET'], ['/v1/loads'], (_req, res) => sendJson(res, 200, i.v1Loads()));
    this.route(['GET', 'POST'], ['/flush_cache'], (_req, res) => i.flushCache(res));
    this.route(['POST'], ['/tokenize', '/v1/tokenize'], (req, res) => i.handleTokenize(req, res));
    this.route(['POST'], ['/detokenize', '/v1/detokenize'], (req, res) => i.handleDetokenize(req, res));
    this.route(['GET'], ['/metrics'], (_req, res) => i.handleMetrics(res));
    this.route(['GET'], ['/get_weight_version'], (_req, res) => sendJson(res, 200, { weight_version: WEIGHT_VERSION }));
    // Admin API, for simulators running as a child process.
    this.route(['GET'], ['/_sim/stats'], (_req, res) => adminStats(this, res));
    this.route(['POST'], ['/_sim/faults'], (req, res, url) => adminFaults(this, req, res, url));
    this.route(['POST'], ['/_sim/outage'], (req, res) => adminOutage(this, req, res));
    this.route(['POST'], ['/_sim/reset'], (_req, res) => adminReset(this, res));
  }

  /**
   * What answers before any route: an outage drops the connection, a missing or wrong API key
   * gets SGLang's 401, `statusAll` (or, for a POST, `statusPost`) answers its status. Returns
   * true when it answered.
   */
  private gate(req: IncomingMessage, res: ServerResponse, pathname: string): boolean {
    if (pathname.startsWith('/_sim/')) return false;
    const faults = this.s.faults.current();
    if (faults.outage) {
      req.resume();
      dropConnection(req);
      return true;
    }
    const key = this.s.o.apiKey;
    if (
      key !== undefined &&
      req.method !== 'OPTIONS' &&
      !isOpenRoute(pathname) &&
      req.headers.authorization !== `Bearer ${key}`
    ) {
      // SGLang's add_api_key_middleware.
      req.resume();
      this.countRefused(pathname);
      sendJson(res, 401, { error: 'Unauthorized' });
      return true;
    }
    if (faults.statusAll !== null && (!isHealthRoute(pathname) || faults.statusAllHealth)) {
      req.resume();
      this.countRefused(pathname);
      replyStatus(res, faults.statusAll);
      return true;
    }
    if (faults.statusPost !== null && req.method === 'POST') {
      req.resume();
      this.countRefused(pathname);
      replyStatus(res, faults.statusPost);
      return true;
    }
    return false;
  }

  /** A generation request refused before it was read counts as received and failed. */
  private countRefused(pathname: string): void {
    if (pathname === GENERATE_ROUTE || pathname === CHAT_ROUTE) {
      this.s.counters.requestsReceived++;
      this.s.counters.failed++;
    }
  }

  private async dispatch(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://sim.invalid');
    const method = req.method ?? 'GET';
    if (this.gate(req, res, url.pathname)) return;
    let byMethod = this.routes.get(url.pathname);
    if (byMethod === undefined && url.pathname.startsWith('/v1/models/')) {
      byMethod = new Map([
        [
          'GET',
          (_r: IncomingMessage, s: ServerResponse) =>
            this.info.retrieveModel(s, decodeURIComponent(url.pathname.slice('/v1/models/'.length))),
        ],
      ]);
    }
    if (byMethod === undefined) {
      req.resume();
      sendJson(res, 404, { detail: 'Not Found' });
      return;
    }
    const handler = byMethod.get(method) ?? (method === 'HEAD' ? byMethod.get('GET') : undefined);
    if (handler === undefined) {
      req.resume();
      sendJson(res, 405, { detail: 'Method Not Allowed' });
      return;
    }
    const isAdminOrHealth = url.pathname.startsWith('/_sim/') || isHealthRoute(url.pathname);
    if (!isAdminOrHealth) await this.ready;
    try {
      await handler(req, res, url);
    } catch (e: unknown) {
      if (e instanceof HttpReplyError) {
        sendJson(res, e.status, e.body);
        return;
      }
      throw e;
    }
  }

  private health(res: ServerResponse): void {
    if (this.s.starting || this.s.faults.unhealthy) sendEmpty(res, 503);
    else sendEmpty(res, 200);
  }
}

/** Starts a simulator; resolves once it listens and its tokenizer is loaded. */
export async function startSimulator(options: SimulatorOptions = {}): Promise<SimulatorHandle> {
  const sim = new Simulator(options);
  await sim.start();
  return {
    get url() {
      return sim.url;
    },
    get port() {
      return sim.port;
    },
    setFaults: (f) => sim.setFaults(f),
    clearFaults: () => sim.clearFaults(),
    outage: (durationMs) => sim.outage(durationMs),
    stats: () => sim.stats(),
    resetStats: () => sim.resetStats(),
    stop: () => sim.stop(),
  };
}
