import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { describeEndpointHealth, readEndpointHealth, type EndpointHealthSummary } from './endpoint-health.js';
import { logger as componentLogger, type Logger } from '../logger.js';
import { generateQueueName } from '../queues/index.js';
import type { RunKeys } from '../queues/index.js';

/**
 * A dataset found stalled, as published in `keys.stalls()`: prompts pending, nothing in flight,
 * an endpoint healthy (with a free slot), for longer than the threshold.
 */
export interface StallRecord {
  dataset: string;
  /** Since when (ms since epoch) the dataset has been in this state. */
  sinceMs: number;
  /** What was seen, in words: the counts and the endpoints. */
  reason: string;
  waiting: number;
  active: number;
  delayed: number;
  inFlight: number;
  healthyEndpoints: number;
  totalEndpoints: number;
  updatedMs: number;
  /** After this the record is stale (its watchdog stopped refreshing it) and ignored. */
  expiresMs: number;
}

/** What the watchdog saw of one dataset on its last check. */
export type StallCondition =
  /** Completed, paused, nothing pending, something in flight, or progress since the last check. */
  | 'ok'
  /** Work pending, nothing in flight, and every healthy endpoint's slots taken (by other datasets). */
  | 'busy'
  /** Work pending, nothing in flight, no endpoint healthy (or no inference worker reporting). */
  | 'waiting'
  /** Work pending, nothing in flight, an endpoint healthy: a bug once it lasts `stallAfterMs`. */
  | 'stuck';

export interface DatasetWatch {
  dataset: string;
  condition: StallCondition;
  /** Since when the condition has held (ms since epoch). */
  sinceMs: number;
  waiting: number;
  active: number;
  delayed: number;
  inFlight: number;
  health: EndpointHealthSummary;
  /** Set once `stuck` has lasted `stallAfterMs`. */
  stalled: StallRecord | null;
}

export interface StallWatchdogOptions {
  redis: Redis;
  keys: RunKeys;
  /** Generation datasets to watch. */
  datasets: readonly string[];
  /** The configured SGLang endpoints (`sglang.endpoints`). */
  endpoints: readonly string[];
  /** A dataset stuck this long is reported stalled (`workers.stallAfterMs`). */
  stallAfterMs?: number;
  /** How often to look (default: a quarter of `stallAfterMs`, at most 5 s). */
  checkIntervalMs?: number;
  /**
   * Requests per endpoint (`sglang.concurrency`). When given, a healthy endpoint whose slots
   * are all leased (to other datasets) does not make a dataset stuck.
   */
  concurrencyPerEndpoint?: number;
  /** While a dataset stays stalled or waiting, its log line repeats this often. */
  repeatLogMs?: number;
  logger?: Logger;
}

interface Track {
  condition: StallCondition;
  sinceMs: number;
  records: string | undefined;
  loggedMs: number | undefined;
}

/**
 * Detects a run that silently sits (issue 7, defect 10): a dataset with batch jobs queued or
 * active, no request in flight and an endpoint healthy for longer than `stallAfterMs` is a bug
 * somewhere. It logs an error naming the dataset and the counts, and publishes the finding in
 * `keys.stalls()`, which `status` shows. A dataset waiting for a healthy endpoint is not
 * stalled; that is logged as a warning once it lasts as long.
 */
export class StallWatchdog {
  private readonly log: Logger;
  private readonly stallAfterMs: number;
  private readonly checkIntervalMs: number;
  private readonly repeatLogMs: number;
  private readonly tracks = new Map<string, Track>();
  private readonly queues = new Map<string, Queue>();
  private timer: NodeJS.Timeout | undefined;
  private checking: Promise<unknown> | undefined;
  private stopped = false;

  constructor(private readonly options: StallWatchdogOptions) {
    this.log = options.logger ?? componentLogger('stall-watchdog');
    this.stallAfterMs = options.stallAfterMs ?? 60_000;
    this.checkIntervalMs = options.checkIntervalMs ?? Math.max(50, Math.min(5_000, Math.floor(this.stallAfterMs / 4)));
    this.repeatLogMs = options.repeatLogMs ?? Math.max(5 * 60_000, this.stallAfterMs);
  }

  start(): void {
    if (this.timer !== undefined || this.stopped) return;
    this.timer = setInterval(() => {
      if (this.checking !== undefined) return;
      this.checking = this.check()
        .catch((e: unknown) => this.log.warn({ err: e }, 'stall check failed; trying again'))
        .finally(() => (this.checking = undefined));
    }, this.checkIntervalMs);
    this.timer.unref();
  }

  /** Stops checking and withdraws this watchdog's stall records. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.timer);
    await this.checking;
    try {
      if (this.options.datasets.length > 0)
        await this.options.redis.hdel(this.options.keys.stalls(), ...this.options.datasets);
    } catch (e: unknown) {
      this.log.warn({ err: e }, 'could not withdraw stall records');
    }
    for (const q of this.queues.values()) await q.close();
    this.queues.clear();
  }

  /** Looks at every dataset once; exported for tests and for callers that poll themselves. */
  async check(nowMs = Date.now()): Promise<DatasetWatch[]> {
    const { redis, keys } = this.options;
    const health = await readEndpointHealth(redis, keys, this.options.endpoints, nowMs);
    const freeSlots = await this.freeSlots(health, nowMs);
    const out: DatasetWatch[] = [];
    for (const dataset of this.options.datasets) {
      const queue = this.queue(dataset);
      const [stats, counts, paused, inFlight] = await Promise.all([
        redis.hgetall(keys.stats(dataset)),
        queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized'),
        queue.isPaused(),
        redis.zcount(keys.inflight(dataset), nowMs, '+inf'),
      ]);
      const waiting = (counts.waiting ?? 0) + (counts.prioritized ?? 0);
      const active = counts.active ?? 0;
      const delayed = counts.delayed ?? 0;
      const prev = this.tracks.get(dataset);
      const progressed = prev !== undefined && prev.records !== stats.records;
      let condition: StallCondition;
      if (stats.status === 'completed' || paused || waiting + active === 0 || inFlight > 0 || progressed)
        condition = 'ok';
      else if (health.healthy === 0) condition = 'waiting';
      else if (freeSlots === 0) condition = 'busy';
      else condition = 'stuck';
      const track: Track =
        prev !== undefined && prev.condition === condition && !progressed
          ? { ...prev, records: stats.records }
          : { condition, sinceMs: nowMs, records: stats.records, loggedMs: undefined };
      this.tracks.set(dataset, track);
      if (prev?.condition === 'stuck' && prev.loggedMs !== undefined && condition !== 'stuck') {
        this.log.warn(
          { dataset, condition, stalledForMs: nowMs - prev.sinceMs },
          `dataset ${dataset} is no longer stalled`,
        );
      }
      const watch: DatasetWatch = {
        dataset,
        condition,
        sinceMs: track.sinceMs,
        waiting,
        active,
        delayed,
        inFlight,
        health,
        stalled: null,
      };
      const lasted = nowMs - track.sinceMs >= this.stallAfterMs;
      if (condition === 'stuck' && lasted) watch.stalled = this.stallRecord(watch, nowMs);
      await this.report(watch, track, lasted, nowMs);
      out.push(watch);
    }
    return out;
  }

  /** Logs (at most every `repeatLogMs`) and publishes or withdraws the dataset's stall record. */
  private async report(watch: DatasetWatch, track: Track, lasted: boolean, nowMs: number): Promise<void> {
    const { redis, keys } = this.options;
    const due = track.loggedMs === undefined || nowMs - track.loggedMs >= this.repeatLogMs;
    const fields = {
      dataset: watch.dataset,
      waiting: watch.waiting,
      active: watch.active,
      delayed: watch.delayed,
      inFlight: watch.inFlight,
      healthyEndpoints: watch.health.healthy,
      totalEndpoints: watch.health.total,
    };
    if (watch.stalled !== null) {
      await redis.hset(keys.stalls(), watch.dataset, JSON.stringify(watch.stalled));
      if (due) {
        track.loggedMs = nowMs;
        this.log.error(
          { ...fields, stalledForMs: nowMs - watch.sinceMs },
          `dataset ${watch.dataset} stalled for ${Math.round((nowMs - watch.sinceMs) / 1000)}s: ${watch.stalled.reason}`,
        );
      }
      return;
    }
    await redis.hdel(keys.stalls(), watch.dataset);
    if (watch.condition === 'waiting' && lasted && due) {
      track.loggedMs = nowMs;
      this.log.warn(
        { ...fields, waitingForMs: nowMs - watch.sinceMs },
        `dataset ${watch.dataset} is waiting: ${describeEndpointHealth(watch.health)}; ${watch.waiting + watch.active} batch job(s) pending`,
      );
    }
  }

  private stallRecord(w: DatasetWatch, nowMs: number): StallRecord {
    const reason =
      `${w.waiting + w.active} batch job(s) pending (${w.waiting} waiting, ${w.active} active), 0 requests in flight, ` +
      `${w.health.healthy}/${w.health.total} endpoints healthy`;
    return {
      dataset: w.dataset,
      sinceMs: w.sinceMs,
      reason,
      waiting: w.waiting,
      active: w.active,
      delayed: w.delayed,
      inFlight: w.inFlight,
      healthyEndpoints: w.health.healthy,
      totalEndpoints: w.health.total,
      updatedMs: nowMs,
      expiresMs: nowMs + Math.max(3 * this.checkIntervalMs, 15_000),
    };
  }

  /** Free request slots over the healthy endpoints; Infinity when the concurrency is not known. */
  private async freeSlots(health: EndpointHealthSummary, nowMs: number): Promise<number> {
    const per = this.options.concurrencyPerEndpoint;
    if (per === undefined) return Infinity;
    let free = 0;
    for (const e of health.endpoints) {
      if (e.up !== true) continue;
      const leased = await this.options.redis.zcount(this.options.keys.endpointLeases(e.url), nowMs, '+inf');
      free += Math.max(0, per - leased);
    }
    return free;
  }

  private queue(dataset: string): Queue {
    let q = this.queues.get(dataset);
    if (q === undefined) {
      q = new Queue(generateQueueName(dataset), {
        connection: this.options.redis,
        prefix: this.options.keys.bullPrefix,
      });
      this.queues.set(dataset, q);
    }
    return q;
  }
}

/** Reads the live stall records of a run (stale ones, of a watchdog that stopped refreshing, are ignored). */
export async function readStalls(redis: Redis, keys: RunKeys, nowMs = Date.now()): Promise<Map<string, StallRecord>> {
  const out = new Map<string, StallRecord>();
  for (const [dataset, raw] of Object.entries(await redis.hgetall(keys.stalls()))) {
    try {
      const r = JSON.parse(raw) as StallRecord;
      if (typeof r.expiresMs === 'number' && r.expiresMs >= nowMs && typeof r.sinceMs === 'number') out.set(dataset, r);
    } catch {
      // a malformed record is ignored; the watchdog overwrites it on its next check
    }
  }
  return out;
}
