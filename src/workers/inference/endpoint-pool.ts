import type { Redis } from 'ioredis';
import {
  AppError,
  SglangClient,
  errorMessage,
  logger as rootChild,
  removeEndpointHealth,
  writeEndpointHealth,
  type InferenceStageOptions,
  type EndpointHealthReport,
  type Logger,
  type RunKeys,
} from '../../shared/index.js';
import { AutoConcurrencyCaps, FixedConcurrencyCaps, type ConcurrencyCaps } from './concurrency-caps.js';

/** One SGLang endpoint as the dispatcher sees it. */
export interface Endpoint {
  readonly url: string;
  readonly client: SglangClient;
  /** Taken out of rotation after a connection failure or a failed health check. */
  up: boolean;
  /** Requests this process has in flight on it. */
  inFlight: number;
  /** Why it is out of rotation; null while up. */
  downReason: string | null;
  /** Since when (ms since epoch) it has been up, or down. */
  sinceMs: number;
}

/** First wait before a misconfigured endpoint (an endpoint-level 4xx to POST /generate) is tried again. */
export const MISCONFIGURED_PROBE_INITIAL_MS = 1_000;
/** Longest wait between those tries. */
export const MISCONFIGURED_PROBE_MAX_MS = 60_000;
/** An endpoint back for this long without another endpoint-level 4xx starts its backoff afresh. */
const MISCONFIGURED_FORGET_MS = 5 * 60_000;

/** Where the pool publishes its endpoints' health, so that other processes (status, the stall watchdog) see it. */
export interface EndpointHealthPublishing {
  redis: Redis;
  keys: RunKeys;
  /** This worker's id (`host:pid`), named in each report. */
  workerId: string;
  /** How often the reports are refreshed (default 5 s); each expires after three such periods. */
  intervalMs?: number;
}

/**
 * Requests in flight per endpoint, summed over every worker process: a fixed number, or `"auto"`
 * steered per endpoint within `auto`'s bounds and pace, defaults applied
 * (`inferenceOptions(config)` resolves the config's setting into this).
 */
export type PoolConcurrency = InferenceStageOptions['concurrency'];

export interface EndpointPoolOptions {
  endpoints: readonly string[];
  /** Fixed or `"auto"` (which needs `publish` for its Redis). */
  concurrency: PoolConcurrency;
  /** Shorter steering samples and lease (tests); see {@link ConcurrencyController}. */
  autoConcurrencyTiming?: { sampleMs?: number; leaseTtlMs?: number; refreshMs?: number };
  requestTimeoutMs: number;
  /** Bearer token for servers started with `--api-key` (never logged). */
  apiKey?: string;
  /** First and longest wait between probes of a down endpoint. */
  probeInitialMs?: number;
  probeMaxMs?: number;
  /** How often endpoints in rotation are checked with `GET /health` (0 = never). */
  healthCheckIntervalMs?: number;
  /** Called whenever an endpoint goes up or down. */
  onChange?: () => void;
  /** Publish each endpoint's health to Redis on every change and every `intervalMs`. */
  publish?: EndpointHealthPublishing;
  logger?: Logger;
}

/**
 * The SGLang endpoints of a worker process, with their health (docs/design.md, invariant 7): an
 * endpoint that refuses connections or fails its health check leaves the rotation and is
 * probed with exponential backoff until `/health_generate` answers 200 again.
 */
export class EndpointPool {
  private readonly endpoints: Endpoint[];
  private readonly probing = new Map<Endpoint, NodeJS.Timeout>();
  /**
   * Endpoints out of rotation for an endpoint-level 4xx, with the last wait between tries: they
   * come back only when a tiny `POST /generate` works (a gateway may allow GET only, so a
   * health check proves nothing), after a wait that doubles each time, also across episodes.
   */
  private readonly misconfigured = new Map<Endpoint, { delayMs: number; lastMs: number; active: boolean }>();
  private readonly log: Logger;
  private readonly probeInitialMs: number;
  private readonly probeMaxMs: number;
  private stopped = false;
  private healthTimer: NodeJS.Timeout | undefined;
  private publishTimer: NodeJS.Timeout | undefined;
  /** Publications run one after another, so a later state never lands before an earlier one. */
  private publishing: Promise<void> = Promise.resolve();
  /** A publication waits behind the running one; it reads the state when it runs, so one is enough. */
  private publishQueued = false;
  private publishFailing = false;
  /** Requests in flight allowed per endpoint: fixed, or as `"auto"` chose. */
  readonly caps: ConcurrencyCaps;

  constructor(private readonly options: EndpointPoolOptions) {
    this.log = options.logger ?? rootChild('endpoint-pool');
    this.probeInitialMs = options.probeInitialMs ?? 250;
    this.probeMaxMs = options.probeMaxMs ?? 5_000;
    this.caps = poolCaps(options, this.log);
    const connections = typeof options.concurrency === 'number' ? options.concurrency : options.concurrency.auto.max;
    this.endpoints = options.endpoints.map((url) => ({
      url,
      client: new SglangClient({
        endpoint: url,
        concurrency: connections,
        requestTimeoutMs: options.requestTimeoutMs,
        ...(options.apiKey === undefined ? {} : { apiKey: options.apiKey }),
        logger: this.log,
      }),
      up: true,
      inFlight: 0,
      downReason: null,
      sinceMs: Date.now(),
    }));
  }

  get all(): readonly Endpoint[] {
    return this.endpoints;
  }

  /** Requests in flight allowed on one endpoint now, summed over every worker process. */
  capOf(endpoint: Endpoint): number {
    return this.caps.capOf(endpoint.url);
  }

  /** Requests in flight allowed over every endpoint now. */
  totalCap(): number {
    let total = 0;
    for (const e of this.endpoints) total += this.caps.capOf(e.url);
    return total;
  }

  /**
   * Endpoints grouped by their cap, the largest cap first: one acquire (which takes one cap for
   * all the endpoints it is given) per group.
   */
  byCap(endpoints: readonly Endpoint[]): { cap: number; endpoints: Endpoint[] }[] {
    const groups = new Map<number, Endpoint[]>();
    for (const e of endpoints) {
      const cap = this.capOf(e);
      groups.set(cap, [...(groups.get(cap) ?? []), e]);
    }
    return [...groups].sort((a, b) => b[0] - a[0]).map(([cap, members]) => ({ cap, endpoints: members }));
  }

  /** The endpoint answered 503 (its queue is full): with `"auto"`, its cap steps back. */
  noteOverload(endpoint: Endpoint): void {
    this.caps.noteOverload(endpoint.url);
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
    await this.caps.start();
    await Promise.all(
      this.endpoints.map(async (e) => {
        const h = await e.client.healthGenerate();
        const reason = h.error ?? `health check answered ${h.status ?? 'nothing'}`;
        if (h.ok) return;
        if (h.misconfigured === true) this.markMisconfigured(e, reason);
        else this.markDown(e, reason);
      }),
    );
    const publish = this.options.publish;
    if (publish !== undefined) {
      await this.publish();
      this.publishTimer = setInterval(() => void this.publish(), publish.intervalMs ?? 5_000);
      this.publishTimer.unref();
    }
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
      endpoint.downReason = reason;
      endpoint.sinceMs = Date.now();
      this.log.warn({ endpoint: endpoint.url, reason }, 'endpoint out of rotation; probing it');
      this.options.onChange?.();
      void this.publish();
    }
    if (!this.probing.has(endpoint)) this.scheduleProbe(endpoint, this.probeInitialMs);
  }

  /**
   * Takes an endpoint out of rotation for an endpoint-level 4xx (401/403/404/405…) that every
   * request would get: it is tried again with a real `POST /generate` of one token, after a
   * backoff from {@link MISCONFIGURED_PROBE_INITIAL_MS} doubling to
   * {@link MISCONFIGURED_PROBE_MAX_MS}, kept across episodes (an endpoint that failed again soon
   * after it came back waits longer). One log line when it leaves, one when it is back.
   */
  markMisconfigured(endpoint: Endpoint, reason: string): void {
    if (this.stopped) return;
    const now = Date.now();
    const last = this.misconfigured.get(endpoint);
    const wasUp = endpoint.up;
    if (wasUp) {
      const fresh = last === undefined || now - last.lastMs > MISCONFIGURED_FORGET_MS;
      const delayMs = fresh ? MISCONFIGURED_PROBE_INITIAL_MS : Math.min(last.delayMs * 2, MISCONFIGURED_PROBE_MAX_MS);
      this.misconfigured.set(endpoint, { delayMs, lastMs: now, active: true });
      endpoint.up = false;
      endpoint.downReason = reason;
      endpoint.sinceMs = now;
      this.log.warn(
        { endpoint: endpoint.url, reason, retryInMs: delayMs },
        'endpoint out of rotation (it refuses POST /generate); trying it again with growing waits',
      );
      this.options.onChange?.();
      void this.publish();
    } else if (last?.active !== true) {
      // Down for another reason already: from now on it must pass the generate probe too.
      this.misconfigured.set(endpoint, {
        delayMs: last?.delayMs ?? MISCONFIGURED_PROBE_INITIAL_MS,
        lastMs: now,
        active: true,
      });
      endpoint.downReason = reason;
    } else {
      last.lastMs = now;
    }
    const entry = this.misconfigured.get(endpoint);
    const pending = this.probing.get(endpoint);
    if (wasUp || pending === undefined) {
      if (pending !== undefined) clearTimeout(pending);
      this.scheduleProbe(endpoint, entry?.delayMs ?? MISCONFIGURED_PROBE_INITIAL_MS);
    }
  }

  /** A tiny `POST /generate` (one token): what a misconfigured endpoint must answer to come back. */
  private async generateProbe(endpoint: Endpoint): Promise<boolean> {
    try {
      await endpoint.client.generate({
        inputIds: [0],
        maxNewTokens: 1,
        rid: `tokenmill-probe-${process.pid}-${Date.now()}`,
      });
      return true;
    } catch (e: unknown) {
      const reason = errorMessage(e);
      if (endpoint.downReason !== reason) {
        // The reason changed (another status, a refused connection): a state change worth one line.
        endpoint.downReason = reason;
        this.log.warn({ endpoint: endpoint.url, reason }, 'endpoint still out of rotation, for another reason now');
        void this.publish();
      }
      return false;
    }
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
    const entry = this.misconfigured.get(endpoint);
    const misconfigured = entry?.active === true ? entry : undefined;
    if (misconfigured !== undefined) {
      const works = await this.generateProbe(endpoint);
      if (this.stopped) return;
      if (!works) {
        misconfigured.delayMs = Math.min(lastDelayMs * 2, MISCONFIGURED_PROBE_MAX_MS);
        misconfigured.lastMs = Date.now();
        this.scheduleProbe(endpoint, misconfigured.delayMs);
        return;
      }
      misconfigured.lastMs = Date.now();
      misconfigured.active = false;
    }
    const h = misconfigured !== undefined ? { ok: true } : await endpoint.client.healthGenerate();
    if (this.stopped) return;
    if (h.ok) {
      this.probing.delete(endpoint);
      endpoint.up = true;
      endpoint.downReason = null;
      endpoint.sinceMs = Date.now();
      // After a refused POST (a warning a person saw), its end is said at the same level.
      if (misconfigured !== undefined)
        this.log.warn({ endpoint: endpoint.url }, 'endpoint answers POST /generate again; back in rotation');
      else this.log.info({ endpoint: endpoint.url }, 'endpoint healthy again; back in rotation');
      this.options.onChange?.();
      void this.publish();
      return;
    }
    this.scheduleProbe(endpoint, Math.min(lastDelayMs * 2, this.probeMaxMs));
  }

  /**
   * Publishes every endpoint's state (queued behind earlier publications). Never throws: a
   * Redis hiccup only delays the next report, and the reports expire on their own.
   */
  private publish(): Promise<void> {
    const p = this.options.publish;
    if (p === undefined) return Promise.resolve();
    if (this.publishQueued) return this.publishing;
    this.publishQueued = true;
    this.publishing = this.publishing.then(async () => {
      this.publishQueued = false;
      if (this.stopped) return;
      const now = Date.now();
      const expiresMs = now + 3 * (p.intervalMs ?? 5_000);
      const reports: EndpointHealthReport[] = this.endpoints.map((e) => ({
        url: e.url,
        up: e.up,
        reason: e.downReason,
        sinceMs: e.sinceMs,
        worker: p.workerId,
        updatedMs: now,
        expiresMs,
      }));
      try {
        await writeEndpointHealth(p.redis, p.keys, reports);
        if (this.publishFailing) this.log.info('endpoint health published again');
        this.publishFailing = false;
      } catch (e: unknown) {
        if (!this.publishFailing)
          this.log.warn({ err: e }, 'could not publish endpoint health; retrying on the next change or refresh');
        this.publishFailing = true;
      }
    });
    return this.publishing;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.caps.stop();
    clearInterval(this.healthTimer);
    clearInterval(this.publishTimer);
    const p = this.options.publish;
    if (p !== undefined) {
      // Withdraw this worker's view: nobody should count on endpoints it no longer serves. With
      // Redis unreachable this would wait for it; the reports expire on their own instead.
      const withdrawn = this.publishing.then(() =>
        removeEndpointHealth(
          p.redis,
          p.keys,
          p.workerId,
          this.endpoints.map((e) => e.url),
        ),
      );
      const gaveUp = await settleWithin(withdrawn, 2_000).catch((e: unknown) => {
        this.log.warn({ err: e }, 'could not withdraw endpoint health; it expires on its own');
        return false;
      });
      if (gaveUp === 'timeout')
        this.log.warn('Redis did not answer; endpoint health not withdrawn, it expires on its own');
    }
    for (const t of this.probing.values()) clearTimeout(t);
    this.probing.clear();
    await Promise.all(this.endpoints.map((e) => e.client.close()));
  }
}

function poolCaps(o: EndpointPoolOptions, log: Logger): ConcurrencyCaps {
  if (typeof o.concurrency === 'number') return new FixedConcurrencyCaps(o.concurrency);
  const p = o.publish;
  if (p === undefined) throw new AppError('sglang.concurrency: "auto" needs Redis in the endpoint pool');
  const t = o.autoConcurrencyTiming ?? {};
  return new AutoConcurrencyCaps({
    redis: p.redis,
    keys: p.keys,
    endpoints: o.endpoints,
    settings: o.concurrency.auto,
    workerId: p.workerId,
    ...(o.apiKey === undefined ? {} : { apiKey: o.apiKey }),
    ...(t.refreshMs === undefined ? {} : { refreshMs: t.refreshMs }),
    ...(t.sampleMs === undefined ? {} : { sampleMs: t.sampleMs }),
    ...(t.leaseTtlMs === undefined ? {} : { leaseTtlMs: t.leaseTtlMs }),
    logger: log,
  });
}

/** Resolves with `'timeout'` if `p` has not settled within `ms`; rejects if `p` rejects first. */
async function settleWithin(p: Promise<unknown>, ms: number): Promise<true | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
    timer.unref();
  });
  try {
    return await Promise.race([p.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
