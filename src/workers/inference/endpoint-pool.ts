import { SglangClient, logger as rootChild, type Logger } from '../../shared/index.js';

/** One SGLang endpoint as the dispatcher sees it. */
export interface Endpoint {
  readonly url: string;
  readonly client: SglangClient;
  /** Taken out of rotation after a connection failure or a failed health check. */
  up: boolean;
  /** Requests this process has in flight on it. */
  inFlight: number;
}

export interface EndpointPoolOptions {
  endpoints: readonly string[];
  /** Requests in flight per endpoint (the client's connection pool is sized for it). */
  concurrency: number;
  requestTimeoutMs: number;
  /** First and longest wait between probes of a down endpoint. */
  probeInitialMs?: number;
  probeMaxMs?: number;
  /** How often endpoints in rotation are checked with `GET /health` (0 = never). */
  healthCheckIntervalMs?: number;
  /** Called whenever an endpoint goes up or down. */
  onChange?: () => void;
  logger?: Logger;
}

/**
 * The SGLang endpoints of a worker process, with their health (DESIGN invariant 7): an
 * endpoint that refuses connections or fails its health check leaves the rotation and is
 * probed with exponential backoff until `/health_generate` answers 200 again.
 */
export class EndpointPool {
  private readonly endpoints: Endpoint[];
  private readonly probing = new Map<Endpoint, NodeJS.Timeout>();
  private readonly log: Logger;
  private readonly probeInitialMs: number;
  private readonly probeMaxMs: number;
  private stopped = false;
  private healthTimer: NodeJS.Timeout | undefined;

  constructor(private readonly options: EndpointPoolOptions) {
    this.log = options.logger ?? rootChild('endpoint-pool');
    this.probeInitialMs = options.probeInitialMs ?? 250;
    this.probeMaxMs = options.probeMaxMs ?? 5_000;
    this.endpoints = options.endpoints.map((url) => ({
      url,
      client: new SglangClient({ endpoint: url, concurrency: options.concurrency, requestTimeoutMs: options.requestTimeoutMs, logger: this.log }),
      up: true,
      inFlight: 0,
    }));
  }

  get all(): readonly Endpoint[] {
    return this.endpoints;
  }

  /** Endpoints in rotation, least loaded (by this process's requests) first. */
  healthy(): Endpoint[] {
    return this.endpoints.filter((e) => e.up).sort((a, b) => a.inFlight - b.inFlight);
  }

  /**
   * Checks every endpoint once (those that fail start being probed), then checks the ones in
   * rotation every `healthCheckIntervalMs` with the cheap `GET /health`, so a server that turns
   * unhealthy leaves the rotation before requests fail on it.
   */
  async start(): Promise<void> {
    await Promise.all(
      this.endpoints.map(async (e) => {
        const h = await e.client.healthGenerate();
        if (!h.ok) this.markDown(e, h.error ?? `health check answered ${h.status ?? 'nothing'}`);
      }),
    );
    const every = this.options.healthCheckIntervalMs ?? 0;
    if (every > 0) {
      this.healthTimer = setInterval(() => {
        for (const e of this.endpoints) {
          if (!e.up) continue;
          void e.client.health().then((h) => {
            if (!h.ok) this.markDown(e, h.error ?? `GET /health answered ${h.status ?? 'nothing'}`);
          });
        }
      }, every);
      this.healthTimer.unref();
    }
  }

  /** Takes an endpoint out of rotation and probes it until it is healthy again. */
  markDown(endpoint: Endpoint, reason: string): void {
    if (this.stopped) return;
    if (endpoint.up) {
      endpoint.up = false;
      this.log.warn({ endpoint: endpoint.url, reason }, 'endpoint out of rotation; probing it');
      this.options.onChange?.();
    }
    if (!this.probing.has(endpoint)) this.scheduleProbe(endpoint, this.probeInitialMs);
  }

  private scheduleProbe(endpoint: Endpoint, delayMs: number): void {
    const timer = setTimeout(() => {
      void this.probe(endpoint, delayMs);
    }, delayMs);
    timer.unref();
    this.probing.set(endpoint, timer);
  }

  private async probe(endpoint: Endpoint, lastDelayMs: number): Promise<void> {
    if (this.stopped) return;
    const h = await endpoint.client.healthGenerate();
    if (this.stopped) return;
    if (h.ok) {
      this.probing.delete(endpoint);
      endpoint.up = true;
      this.log.info({ endpoint: endpoint.url }, 'endpoint healthy again; back in rotation');
      this.options.onChange?.();
      return;
    }
    this.scheduleProbe(endpoint, Math.min(lastDelayMs * 2, this.probeMaxMs));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.healthTimer);
    for (const t of this.probing.values()) clearTimeout(t);
    this.probing.clear();
    await Promise.all(this.endpoints.map((e) => e.client.close()));
  }
}
