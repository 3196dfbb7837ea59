import type { Logger, RunKeys, ScriptedRedis } from '../../shared/index.js';
import type { Running } from './failure-handling.js';
import { renewLeases } from './lease-renewal.js';

export interface LeaseKeeperOptions {
  redis: ScriptedRedis;
  keys: RunKeys;
  /** A request's leases lapse this long after Redis last renewed them. */
  ttlMs: number;
  /** The per-endpoint cap a lapsed lease is taken again under. */
  capOf(r: Running): number;
  /** The requests of this process, live or settling. */
  running(): Iterable<Running>;
  /** Whether `r` is still the request running under its rid (not ended meanwhile). */
  isCurrent(r: Running): boolean;
  log: Logger;
}

/**
 * How a lease is kept (docs/design.md, invariant 6: the per-endpoint cap holds across every worker,
 * after any stall). Every request's two leases (its endpoint slot and its dataset's budget
 * reservation) are renewed every third of the TTL. Each renewal is stamped, on this process's
 * monotonic clock (`performance.now()`, which a wall-clock step leaves alone), with the moment it
 * was sent: Redis ran it later, so the lease holds at least until that moment plus the TTL.
 *
 * The fence: a request whose lease Redis has not confirmed for most of the TTL (Redis frozen,
 * unreachable, or this process stalled) is aborted here before the lease can lapse. Otherwise
 * a worker whose next acquire sweeps the lapsed lease would start a request on a slot whose
 * old request still runs at the server, over the cap; an answer to the renewal that says
 * "lost" would come too late. The aborted sample is sent again; no attempt is spent.
 */
export class LeaseKeeper {
  /** How often the fence is checked (ms). */
  readonly checkMs: number;
  /** A request is aborted once its lease was last confirmed longer ago than this (ms). */
  readonly fenceMs: number;
  private renewTimer: NodeJS.Timeout | undefined;
  private fenceTimer: NodeJS.Timeout | undefined;
  private renewing = false;

  constructor(private readonly o: LeaseKeeperOptions) {
    this.checkMs = Math.min(1_000, Math.max(20, Math.floor(o.ttlMs / 10)));
    this.fenceMs = o.ttlMs - Math.max(2 * this.checkMs, Math.floor(o.ttlMs / 5));
  }

  start(): void {
    this.renewTimer = setInterval(() => void this.renew(), Math.max(50, Math.floor(this.o.ttlMs / 3)));
    this.renewTimer.unref();
    this.fenceTimer = setInterval(() => this.fence(), this.checkMs);
    this.fenceTimer.unref();
  }

  stop(): void {
    clearInterval(this.renewTimer);
    clearInterval(this.fenceTimer);
  }

  /** Whether a lease confirmed by a call sent at `sentMs` (`performance.now()`) is past the fence now. */
  expired(sentMs: number, now = performance.now()): boolean {
    return now - sentMs > this.fenceMs;
  }

  /** Aborts the live requests whose leases are past the fence; returns how many. */
  fence(now = performance.now()): number {
    let aborted = 0;
    let oldest = now;
    for (const r of this.o.running()) {
      if (r.settling || r.leaseLost || !this.expired(r.leaseSentMs, now)) continue;
      oldest = Math.min(oldest, r.leaseSentMs);
      r.leaseLost = true;
      r.abort.abort();
      aborted += 1;
    }
    if (aborted > 0) {
      this.o.log.warn(
        { aborted, unconfirmedMs: now - oldest, leaseTtlMs: this.o.ttlMs },
        "Redis has not confirmed these requests' endpoint slots for most of the lease TTL (Redis frozen or unreachable, or this process stalled): aborting them before the slots lapse, so that no endpoint runs more than its cap; they are sent again",
      );
    }
    return aborted;
  }

  /**
   * Renews the leases of what runs here; a request whose slot was lost in a stall is aborted.
   * Requests already ending are left out (their outcome releases the leases), and a lease
   * renewed just as its request ended is released again, so no phantom slot or reservation stays.
   */
  async renew(): Promise<void> {
    if (this.renewing) return;
    const live = [...this.o.running()].filter((r) => !r.settling && !r.leaseLost);
    if (live.length === 0) return;
    this.renewing = true;
    const { redis, keys, log } = this.o;
    const sentMs = performance.now();
    try {
      let lost: Running[] = [];
      let retaken = 0;
      // One renewal per cap: a lapsed lease is taken again only below its own endpoint's cap.
      for (const [cap, group] of groupBy(live, (r) => this.o.capOf(r))) {
        const renewed = await renewLeases(redis, keys, group, this.o.ttlMs, cap);
        const gone = new Set(renewed.lost);
        for (const r of group) if (!gone.has(r)) r.leaseSentMs = Math.max(r.leaseSentMs, sentMs);
        lost = [...lost, ...renewed.lost];
        retaken += renewed.retaken;
      }
      const ended = live.filter((r) => r.settling || r.leaseLost || !this.o.isCurrent(r));
      if (ended.length > 0) {
        const m = redis.multi();
        for (const r of ended) m.zrem(keys.inflight(r.dataset), r.rid).zrem(r.leaseKey, r.rid);
        await m.exec();
      }
      if (retaken > 0) log.warn({ retaken }, 'leases had lapsed (a stall of this process or of Redis); taken again');
      let aborted = 0;
      for (const r of lost) {
        if (!this.o.isCurrent(r) || r.settling || r.leaseLost) continue;
        r.leaseLost = true;
        r.abort.abort();
        aborted += 1;
      }
      if (aborted > 0)
        log.warn(
          { aborted },
          'endpoint slots were taken by other workers during a stall; aborting those requests to keep the cap',
        );
    } catch (e: unknown) {
      log.warn({ err: e }, 'lease renewal failed');
    } finally {
      this.renewing = false;
    }
  }
}

function groupBy<T, K>(items: readonly T[], key: (item: T) => K): Map<K, T[]> {
  const groups = new Map<K, T[]>();
  for (const item of items) groups.set(key(item), [...(groups.get(key(item)) ?? []), item]);
  return groups;
}
