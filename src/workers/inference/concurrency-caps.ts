import type { Redis } from 'ioredis';
import {
  endpointConcurrencyKey,
  readEndpointConcurrency,
  type AutoConcurrency,
  type Logger,
  type RunKeys,
} from '../../shared/index.js';
import { ConcurrencyController } from './concurrency-controller.js';
import { ServerLoadProbe } from './concurrency-probe.js';

/** Requests in flight allowed per endpoint, summed over every worker process. */
export interface ConcurrencyCaps {
  /** The cap of one endpoint now. */
  capOf(endpoint: string): number;
  start(): Promise<void>;
  stop(): Promise<void>;
  /** Counts a 503 of the endpoint (the server's queue is full): `"auto"` steps back. */
  noteOverload(endpoint: string): void;
}

/** `sglang.concurrency: <n>`: the same cap for every endpoint, always. */
export class FixedConcurrencyCaps implements ConcurrencyCaps {
  constructor(private readonly cap: number) {}
  capOf(): number {
    return this.cap;
  }
  async start(): Promise<void> {}
  async stop(): Promise<void> {}
  noteOverload(): void {}
}

export interface AutoConcurrencyCapsOptions {
  redis: Redis;
  keys: RunKeys;
  endpoints: readonly string[];
  settings: AutoConcurrency;
  workerId: string;
  apiKey?: string;
  /** How often the caps are read from Redis (default 1 s). */
  refreshMs?: number;
  /** Passed to each endpoint's controller (tests shorten them). */
  sampleMs?: number;
  leaseTtlMs?: number;
  logger: Logger;
}

/**
 * `sglang.concurrency: "auto"`: each endpoint's cap as its controller last wrote it to Redis,
 * read every `refreshMs` (until a value is there: the stored one or `start`). This process also
 * runs a {@link ConcurrencyController} per endpoint; the one holding an endpoint's steering
 * lease (in whichever worker) steers it.
 */
export class AutoConcurrencyCaps implements ConcurrencyCaps {
  private readonly caps = new Map<string, number>();
  private readonly controllers: ConcurrencyController[];
  private timer: NodeJS.Timeout | undefined;
  private refreshFailing = false;

  constructor(private readonly o: AutoConcurrencyCapsOptions) {
    for (const url of o.endpoints) this.caps.set(url, o.settings.start);
    this.controllers = o.endpoints.map(
      (endpoint) =>
        new ConcurrencyController({
          redis: o.redis,
          keys: o.keys,
          endpoint,
          workerId: o.workerId,
          bounds: o.settings,
          start: o.settings.start,
          intervalMs: o.settings.intervalMs,
          reader: new ServerLoadProbe(endpoint, o.apiKey === undefined ? {} : { apiKey: o.apiKey }),
          ...(o.sampleMs === undefined ? {} : { sampleMs: o.sampleMs }),
          ...(o.leaseTtlMs === undefined ? {} : { leaseTtlMs: o.leaseTtlMs }),
          refreshMs: o.refreshMs ?? 1_000,
          onCap: (cap) => this.caps.set(endpoint, cap),
          logger: o.logger,
        }),
    );
  }

  capOf(endpoint: string): number {
    return this.caps.get(endpoint) ?? this.o.settings.start;
  }

  /** Whether this process steers the endpoint now (for tests and logs). */
  steers(endpoint: string): boolean {
    const i = this.o.endpoints.indexOf(endpoint);
    return i >= 0 && (this.controllers[i]?.steering ?? false);
  }

  async start(): Promise<void> {
    await this.refresh();
    this.timer = setInterval(() => void this.refresh(), this.o.refreshMs ?? 1_000);
    this.timer.unref();
    for (const c of this.controllers) c.start();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await Promise.all(this.controllers.map((c) => c.stop()));
  }

  noteOverload(endpoint: string): void {
    this.o.redis.hincrby(endpointConcurrencyKey(this.o.keys, endpoint), 'overloads', 1).catch((e: unknown) => {
      this.o.logger.warn({ err: e, endpoint }, 'could not count a 503 for sglang.concurrency: auto');
    });
  }

  private async refresh(): Promise<void> {
    try {
      const { min, max } = this.o.settings;
      const values = await readEndpointConcurrency(this.o.redis, this.o.keys, this.o.endpoints);
      this.o.endpoints.forEach((url, i) => {
        const v = values[i];
        if (v !== undefined) this.caps.set(url, Math.min(max, Math.max(min, v.cap)));
      });
      if (this.refreshFailing) this.o.logger.info('endpoint concurrency readable again');
      this.refreshFailing = false;
    } catch (e: unknown) {
      if (!this.refreshFailing)
        this.o.logger.warn({ err: e }, "cannot read the endpoints' concurrency; keeping the last values");
      this.refreshFailing = true;
    }
  }
}
