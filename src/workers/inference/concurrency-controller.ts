import { randomBytes } from 'node:crypto';
import {
  endpointConcurrencyKey,
  endpointConcurrencyLeaseKey,
  errorMessage,
  withScripts,
  type Logger,
  type RunKeys,
  type ScriptedRedis,
} from '../../shared/index.js';
import type { Redis } from 'ioredis';
import {
  decideConcurrency,
  INITIAL_POLICY_STATE,
  type ConcurrencyBounds,
  type PolicyState,
  type WindowObservation,
} from './concurrency-policy.js';
import type { ServerLoadSample } from './concurrency-probe.js';

/** Where the controller reads the server's load; {@link ServerLoadProbe} in production. */
export interface LoadReader {
  read(): Promise<ServerLoadSample>;
}

export interface ConcurrencyControllerOptions {
  redis: Redis;
  keys: RunKeys;
  endpoint: string;
  /** This worker's id (`host:pid`), written as the controller. */
  workerId: string;
  bounds: ConcurrencyBounds;
  /** The cap on an endpoint without a stored one. */
  start: number;
  /** Length of one measurement window (ms). */
  intervalMs: number;
  reader: LoadReader;
  /** How often the server is read and the steering lease renewed (default: a tenth of the window, within 100–1000 ms). */
  sampleMs?: number;
  /** The steering lease lapses this long after its holder stops renewing it (default 5 samples, at least 2 s). */
  leaseTtlMs?: number;
  /** How often the workers read the cap: a change is measured only after they all can have seen it. */
  refreshMs?: number;
  /** Called with each cap this controller writes (its own process uses it at once). */
  onCap?: (cap: number) => void;
  /** While the server's load cannot be read: a warning at once, then again this often (default 60 s). */
  loadFailureReportMs?: number;
  logger: Logger;
}

interface Sample extends ServerLoadSample {
  inFlight: number;
  overloads: number;
}

/**
 * Steers one endpoint's requests in flight (`sglang.concurrency: "auto"`). Every inference
 * worker runs one per endpoint; only the holder of the endpoint's short steering lease in Redis
 * measures and writes the cap, so exactly one steers at a time, and another takes over within
 * the lease's TTL when it dies. The cap lives in the endpoint's concurrency hash
 * (`endpointConcurrencyKey`), which every worker's pool reads.
 *
 * Each window reads the server's running and queued requests and its decoded-token counter
 * every `sampleMs`, plus the endpoint's leases and the 503s the workers counted; after a change
 * it first waits a quarter of a window for the new requests to reach the server.
 */
export class ConcurrencyController {
  private readonly redis: ScriptedRedis;
  private readonly sampleMs: number;
  private readonly leaseTtlMs: number;
  private readonly settleMs: number;
  private readonly token: string;
  private timer: NodeJS.Timeout | undefined;
  private ticking = false;
  private stopped = false;
  private holding = false;
  private cap = 0;
  private state: PolicyState = INITIAL_POLICY_STATE;
  private samples: Sample[] = [];
  private settleUntilMs = 0;
  private readFailing = false;
  /** Since when the server's load cannot be read (ms), and when that was last said; null while readable. */
  private readFailingSinceMs: number | null = null;
  private readFailingReportedMs = 0;

  constructor(private readonly o: ConcurrencyControllerOptions) {
    this.redis = withScripts(o.redis);
    this.sampleMs = o.sampleMs ?? Math.min(1_000, Math.max(100, Math.floor(o.intervalMs / 10)));
    this.leaseTtlMs = o.leaseTtlMs ?? Math.max(2_000, 5 * this.sampleMs);
    this.settleMs = Math.max(Math.floor(o.intervalMs / 4), Math.ceil(1.5 * (o.refreshMs ?? 1_000)));
    this.token = `${o.workerId}:${randomBytes(4).toString('hex')}`;
  }

  /** Whether this worker steers the endpoint now. */
  get steering(): boolean {
    return this.holding;
  }

  start(): void {
    this.timer = setInterval(() => void this.tick(), this.sampleMs);
    this.timer.unref();
    void this.tick();
  }

  /** Stops steering and hands the lease back, so another worker takes over at once. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    if (!this.holding) return;
    this.holding = false;
    try {
      await this.redis.lockRelease(endpointConcurrencyLeaseKey(this.o.keys, this.o.endpoint), this.token);
    } catch (e: unknown) {
      this.o.logger.warn(
        { err: e, endpoint: this.o.endpoint },
        'could not hand back the concurrency steering lease; it lapses on its own',
      );
    }
  }

  private async tick(): Promise<void> {
    if (this.ticking || this.stopped) return;
    this.ticking = true;
    try {
      if (!(await this.holdLease())) return;
      await this.sample();
    } catch (e: unknown) {
      this.o.logger.warn({ err: e, endpoint: this.o.endpoint }, 'concurrency steering step failed');
    } finally {
      this.ticking = false;
    }
  }

  /** Takes or renews the steering lease; false while another worker holds it. */
  private async holdLease(): Promise<boolean> {
    const leaseKey = endpointConcurrencyLeaseKey(this.o.keys, this.o.endpoint);
    if (this.holding) {
      if ((await this.redis.lockRenew(leaseKey, this.token, this.leaseTtlMs)) === 1) return true;
      this.holding = false;
      this.o.logger.info(
        { endpoint: this.o.endpoint },
        'concurrency steering lease lapsed; another worker steers this endpoint now',
      );
      return false;
    }
    if ((await this.redis.set(leaseKey, this.token, 'PX', this.leaseTtlMs, 'NX')) !== 'OK') return false;
    if (this.stopped) {
      await this.redis.lockRelease(leaseKey, this.token);
      return false;
    }
    this.holding = true;
    const key = endpointConcurrencyKey(this.o.keys, this.o.endpoint);
    const stored = Number(await this.redis.hget(key, 'cap'));
    const { min, max } = this.o.bounds;
    this.cap = Number.isInteger(stored) && stored >= 1 ? Math.min(max, Math.max(min, stored)) : this.o.start;
    this.state = INITIAL_POLICY_STATE;
    this.samples = [];
    this.settleUntilMs = Date.now() + this.settleMs;
    await this.redis.hset(key, {
      cap: this.cap,
      controller: this.o.workerId,
      updatedMs: Date.now(),
      reason: Number.isInteger(stored) && stored >= 1 ? 'resumed from the last value chosen' : 'starting value',
    });
    this.o.onCap?.(this.cap);
    this.o.logger.info(
      { endpoint: this.o.endpoint, cap: this.cap },
      "steering this endpoint's requests in flight (sglang.concurrency: auto)",
    );
    return true;
  }

  private async sample(): Promise<void> {
    let load: ServerLoadSample;
    try {
      load = await this.o.reader.read();
      if (this.readFailing) {
        this.o.logger.warn(
          {
            endpoint: this.o.endpoint,
            unreadableForSec: Math.round((Date.now() - (this.readFailingSinceMs ?? Date.now())) / 1000),
          },
          'server load readable again; steering goes on',
        );
        await this.redis.hset(endpointConcurrencyKey(this.o.keys, this.o.endpoint), {
          reason: 'server load readable again; measuring',
          updatedMs: Date.now(),
          loadUnreadableSinceMs: '',
        });
      }
      this.readFailing = false;
      this.readFailingSinceMs = null;
    } catch (e: unknown) {
      // Down or restarting: a window across it would measure nothing useful.
      await this.noteUnreadable(errorMessage(e));
      this.samples = [];
      return;
    }
    const key = endpointConcurrencyKey(this.o.keys, this.o.endpoint);
    const [leases, overloads] = await Promise.all([
      this.redis.zcard(this.o.keys.endpointLeases(this.o.endpoint)),
      this.redis.hget(key, 'overloads'),
    ]);
    if (load.atMs < this.settleUntilMs) return;
    this.samples.push({ ...load, inFlight: leases, overloads: Number(overloads ?? 0) });
    const first = this.samples[0];
    const last = this.samples[this.samples.length - 1];
    if (first === undefined || last === undefined || last.atMs - first.atMs < this.o.intervalMs) return;
    await this.decide(this.observe(this.samples, first, last), last);
  }

  /**
   * The server's load cannot be read (a restart, a server without the routes): said once at
   * once, then every `loadFailureReportMs`, and written as the reason `status` shows, so the
   * value from before the outage never looks current.
   */
  private async noteUnreadable(error: string): Promise<void> {
    const now = Date.now();
    const first = this.readFailingSinceMs === null;
    if (first) this.readFailingSinceMs = now;
    this.readFailing = true;
    const since = this.readFailingSinceMs ?? now;
    if (!first && now - this.readFailingReportedMs < (this.o.loadFailureReportMs ?? 60_000)) return;
    this.readFailingReportedMs = now;
    const forSec = Math.round((now - since) / 1000);
    this.o.logger.warn(
      { endpoint: this.o.endpoint, err: error, unreadableForSec: forSec, cap: this.cap },
      first
        ? "cannot read the server's load; the requests in flight stay as they are"
        : `still cannot read the server's load (for ${forSec} s); the requests in flight stay as they are`,
    );
    await this.redis.hset(endpointConcurrencyKey(this.o.keys, this.o.endpoint), {
      reason: `cannot read the server's load since ${new Date(since).toISOString()} (${error}); kept at ${this.cap}`,
      updatedMs: now,
      loadUnreadableSinceMs: since,
    });
  }

  private observe(samples: readonly Sample[], first: Sample, last: Sample): WindowObservation {
    const mean = (f: (s: Sample) => number): number => samples.reduce((a, s) => a + f(s), 0) / samples.length;
    const dt = (last.atMs - first.atMs) / 1000;
    const tokens =
      first.generationTokensTotal !== null &&
      last.generationTokensTotal !== null &&
      last.generationTokensTotal >= first.generationTokensTotal
        ? last.generationTokensTotal - first.generationTokensTotal
        : null;
    return {
      cap: this.cap,
      inFlight: mean((s) => s.inFlight),
      running: mean((s) => s.running),
      runningPeak: Math.max(...samples.map((s) => s.running)),
      queued: mean((s) => s.queued),
      tokensPerSec: tokens === null || dt <= 0 ? null : tokens / dt,
      overloads: Math.max(0, last.overloads - first.overloads),
    };
  }

  private async decide(obs: WindowObservation, last: Sample): Promise<void> {
    const d = decideConcurrency(obs, this.state, this.o.bounds);
    this.state = d.state;
    const changed = d.cap !== this.cap;
    const leaseKey = endpointConcurrencyLeaseKey(this.o.keys, this.o.endpoint);
    // Written only while still the holder: a worker that stalled past its lease steers no more.
    if ((await this.redis.lockRenew(leaseKey, this.token, this.leaseTtlMs)) !== 1) {
      this.holding = false;
      return;
    }
    await this.redis.hset(endpointConcurrencyKey(this.o.keys, this.o.endpoint), {
      cap: d.cap,
      controller: this.o.workerId,
      updatedMs: Date.now(),
      reason: d.reason,
      tokensPerSec: obs.tokensPerSec === null ? '' : Math.round(obs.tokensPerSec),
      running: Math.round(obs.running),
      queued: Math.round(obs.queued * 10) / 10,
    });
    if (changed) {
      this.o.logger.info(
        { endpoint: this.o.endpoint, from: this.cap, to: d.cap, reason: d.reason },
        'requests in flight changed (sglang.concurrency: auto)',
      );
      this.cap = d.cap;
      this.o.onCap?.(d.cap);
      this.samples = [];
      this.settleUntilMs = Date.now() + this.settleMs;
    } else {
      // Back to back: the next window starts where this one ended.
      this.samples = [last];
    }
  }
}
