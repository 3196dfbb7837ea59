/**
 * The live processes of a run, by role: every worker (and the producer) publishes a heartbeat
 * — host, pid, uptime, requests in flight and, for inference workers, its per-endpoint request
 * stats — into one hash of the run. Each entry carries its own expiry, so a killed process
 * drops out of `status` and the dashboard on its own; a clean stop withdraws it at once.
 */
import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import { logger as componentLogger, type Logger } from '../logger.js';
import { requestStatsSnapshot, type EndpointRequestStats } from '../sglang/index.js';
import type { RunKeys } from '../queues/index.js';

/** What a process does in the run. */
export type WorkerRole = 'producer' | 'inference' | 'postprocess';

/** One live process as its heartbeat describes it. */
export interface WorkerInfo {
  role: WorkerRole;
  /** `host:pid`. */
  id: string;
  host: string;
  pid: number;
  startedMs: number;
  updatedMs: number;
  /** After this (ms since epoch) the entry is stale and ignored. */
  expiresMs: number;
  /** Generation requests in flight from this process (0 for roles that send none). */
  inFlight: number;
  /** Per-endpoint request stats of this process (inference workers). */
  endpoints: EndpointRequestStats[];
}

/** Hash of the run's heartbeats: field `<role> <host:pid>` -> JSON {@link WorkerInfo}. */
export function workersKey(keys: RunKeys): string {
  return `${keys.base}:workers`;
}

/** Entries this long past their expiry are deleted by readers. */
const PRUNE_AFTER_EXPIRY_MS = 10 * 60_000;

/** Options of {@link WorkerHeartbeat}. */
export interface WorkerHeartbeatOptions {
  redis: Redis;
  keys: RunKeys;
  role: WorkerRole;
  /** Requests in flight now; default none. */
  inFlight?: () => number;
  /** Default 5 000; an entry lives three intervals. */
  intervalMs?: number;
  /** Default `host:pid`. */
  id?: string;
  logger?: Logger;
}

/** Publishes one process's heartbeat every `intervalMs` until {@link stop}. */
export class WorkerHeartbeat {
  private timer: NodeJS.Timeout | undefined;
  private readonly startedMs = Date.now();
  private readonly intervalMs: number;
  private readonly host = hostname();
  private readonly id: string;
  private readonly log: Logger;
  private beating: Promise<void> = Promise.resolve();
  private failing = false;

  constructor(private readonly options: WorkerHeartbeatOptions) {
    this.intervalMs = options.intervalMs ?? 5_000;
    this.id = options.id ?? `${this.host}:${process.pid}`;
    this.log = options.logger ?? componentLogger('worker-registry', { role: options.role });
  }

  private field(): string {
    return `${this.options.role} ${this.id}`;
  }

  /** The entry this process publishes now. */
  info(nowMs = Date.now()): WorkerInfo {
    return {
      role: this.options.role,
      id: this.id,
      host: this.host,
      pid: process.pid,
      startedMs: this.startedMs,
      updatedMs: nowMs,
      expiresMs: nowMs + 3 * this.intervalMs,
      inFlight: this.options.inFlight?.() ?? 0,
      endpoints: this.options.role === 'inference' ? requestStatsSnapshot(nowMs) : [],
    };
  }

  /** Publishes at once, then every interval. */
  async start(): Promise<void> {
    await this.beat();
    this.timer = setInterval(() => {
      this.beating = this.beating.then(() => this.beat());
    }, this.intervalMs);
    this.timer.unref();
  }

  /** One publication; never throws (a Redis blip only delays the next one). */
  private async beat(): Promise<void> {
    try {
      await this.options.redis.hset(workersKey(this.options.keys), this.field(), JSON.stringify(this.info()));
      if (this.failing) this.log.info('worker heartbeat published again');
      this.failing = false;
    } catch (e: unknown) {
      if (!this.failing) this.log.warn({ err: e }, 'could not publish the worker heartbeat; retrying');
      this.failing = true;
    }
  }

  /** Stops publishing and withdraws the entry. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.beating;
    try {
      await this.options.redis.hdel(workersKey(this.options.keys), this.field());
    } catch (e: unknown) {
      this.log.warn({ err: e }, 'could not withdraw the worker heartbeat; it expires on its own');
    }
  }
}

function parseInfo(raw: string): WorkerInfo | undefined {
  try {
    const v = JSON.parse(raw) as Partial<WorkerInfo>;
    if (typeof v.id !== 'string' || typeof v.role !== 'string' || typeof v.expiresMs !== 'number') return undefined;
    return {
      role: v.role,
      id: v.id,
      host: String(v.host ?? '?'),
      pid: Number(v.pid ?? 0),
      startedMs: Number(v.startedMs ?? 0),
      updatedMs: Number(v.updatedMs ?? 0),
      expiresMs: v.expiresMs,
      inFlight: Number(v.inFlight ?? 0),
      endpoints: Array.isArray(v.endpoints) ? v.endpoints : [],
    };
  } catch {
    return undefined;
  }
}

/** The live processes of a run, by role then host and pid; long-expired entries are deleted on the way. */
export async function readWorkers(redis: Redis, keys: RunKeys, nowMs = Date.now()): Promise<WorkerInfo[]> {
  const all = await redis.hgetall(workersKey(keys));
  const live: WorkerInfo[] = [];
  const dead: string[] = [];
  for (const [field, raw] of Object.entries(all)) {
    const w = parseInfo(raw);
    if (w === undefined || w.expiresMs + PRUNE_AFTER_EXPIRY_MS < nowMs) dead.push(field);
    if (w !== undefined && w.expiresMs >= nowMs) live.push(w);
  }
  if (dead.length > 0) await redis.hdel(workersKey(keys), ...dead);
  const order: Record<string, number> = { producer: 0, inference: 1, postprocess: 2 };
  return live.sort(
    (a, b) => (order[a.role] ?? 9) - (order[b.role] ?? 9) || a.host.localeCompare(b.host) || a.pid - b.pid,
  );
}

/**
 * One endpoint's requests over every live process: in-flight, counts and histograms summed;
 * the recent latency is the worst process's (a conservative figure, not a true percentile).
 * A process with several inference roles is counted once.
 */
export function sumEndpointRequests(workers: readonly WorkerInfo[]): Map<string, EndpointRequestStats> {
  const seen = new Set<string>();
  const out = new Map<string, EndpointRequestStats>();
  for (const w of workers) {
    if (w.role !== 'inference' || seen.has(w.id)) continue;
    seen.add(w.id);
    for (const e of w.endpoints) {
      const url = e.url.replace(/\/+$/, '');
      const acc = out.get(url);
      if (acc === undefined) {
        out.set(url, { ...e, url, latencyBuckets: [...e.latencyBuckets], errors: { ...e.errors } });
        continue;
      }
      acc.inFlight += e.inFlight;
      acc.requests += e.requests;
      acc.latencyBuckets = acc.latencyBuckets.map((n, i) => n + (e.latencyBuckets[i] ?? 0));
      acc.latencySumSeconds += e.latencySumSeconds;
      acc.latencyCount += e.latencyCount;
      for (const [k, n] of Object.entries(e.errors)) acc.errors[k] = (acc.errors[k] ?? 0) + n;
      if (
        e.recentLatencyMs !== null &&
        (acc.recentLatencyMs === null || e.recentLatencyMs.p95 > acc.recentLatencyMs.p95)
      ) {
        acc.recentLatencyMs = {
          ...e.recentLatencyMs,
          count: e.recentLatencyMs.count + (acc.recentLatencyMs?.count ?? 0),
        };
      } else if (e.recentLatencyMs !== null && acc.recentLatencyMs !== null) {
        acc.recentLatencyMs = { ...acc.recentLatencyMs, count: acc.recentLatencyMs.count + e.recentLatencyMs.count };
      }
    }
  }
  return out;
}
