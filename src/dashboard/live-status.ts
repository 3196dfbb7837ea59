/**
 * The run's status, read every `pollMs` for the page's live updates (server-sent events), and
 * an hour of throughput samples for its chart, kept in memory by this dashboard process.
 */
import type { Redis } from 'ioredis';
import { errorMessage, readRunStatus, type Logger, type RunKeys, type RunStatus } from '../shared/index.js';

/** One throughput sample: committed output tokens per dataset at `t` (ms since epoch). */
export interface ThroughputSample {
  t: number;
  tokens: Record<string, number>;
}

/** What the page receives on each update. */
export type LiveUpdate =
  | { kind: 'status'; status: RunStatus; sample: ThroughputSample | null; readAtMs: number }
  | { kind: 'error'; message: string; sinceMs: number };

/** Options of {@link LiveStatus}. */
export interface LiveStatusOptions {
  redis: Redis;
  keys: RunKeys;
  config: Parameters<typeof readRunStatus>[2];
  /** How often the status is read (ms); default 2 000. */
  pollMs?: number;
  /** How often a throughput sample is kept (ms); default 10 000. */
  sampleMs?: number;
  /** How long samples are kept (ms); default an hour. */
  historyMs?: number;
  logger: Logger;
}

/** Reads the status on a timer, keeps the throughput history, and tells listeners. */
export class LiveStatus {
  private readonly samples: ThroughputSample[] = [];
  private readonly listeners = new Set<(u: LiveUpdate) => void>();
  private timer: NodeJS.Timeout | undefined;
  private last: LiveUpdate | undefined;
  private reading: Promise<void> = Promise.resolve();
  private failingSinceMs: number | undefined;
  private readonly pollMs: number;
  private readonly sampleMs: number;
  private readonly historyMs: number;

  constructor(private readonly options: LiveStatusOptions) {
    this.pollMs = options.pollMs ?? 2_000;
    this.sampleMs = options.sampleMs ?? 10_000;
    this.historyMs = options.historyMs ?? 3_600_000;
  }

  start(): void {
    this.reading = this.read();
    this.timer = setInterval(() => {
      this.reading = this.reading.then(() => this.read());
    }, this.pollMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.listeners.clear();
    await this.reading;
  }

  /** The throughput samples of the last hour, oldest first. */
  history(): ThroughputSample[] {
    return [...this.samples];
  }

  /** The latest update (status or error), if any yet. */
  latest(): LiveUpdate | undefined {
    return this.last;
  }

  /** Calls `listener` on every update until the returned function is called. */
  subscribe(listener: (u: LiveUpdate) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private async read(): Promise<void> {
    const now = Date.now();
    let update: LiveUpdate;
    try {
      const status = await readRunStatus(this.options.redis, this.options.keys, this.options.config, now);
      if (this.failingSinceMs !== undefined) this.options.logger.info('run status readable again');
      this.failingSinceMs = undefined;
      let sample: ThroughputSample | null = null;
      const newest = this.samples.at(-1);
      if (newest === undefined || now - newest.t >= this.sampleMs) {
        sample = { t: now, tokens: Object.fromEntries(status.datasets.map((d) => [d.name, d.outputTokens])) };
        this.samples.push(sample);
        while ((this.samples[0]?.t ?? now) < now - this.historyMs) this.samples.shift();
      }
      update = { kind: 'status', status, sample, readAtMs: now };
    } catch (e: unknown) {
      if (this.failingSinceMs === undefined)
        this.options.logger.warn({ err: e }, 'reading the run status failed; retrying');
      this.failingSinceMs ??= now;
      update = {
        kind: 'error',
        message: `reading the run status from Redis failed: ${errorMessage(e)}`,
        sinceMs: this.failingSinceMs,
      };
    }
    this.last = update;
    for (const l of this.listeners) l(update);
  }
}
