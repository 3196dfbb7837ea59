import type { Redis } from 'ioredis';
import { endpointKey, type RunKeys } from '../queues/index.js';

/**
 * One worker's view of one SGLang endpoint, as published in `keys.endpointHealth()`.
 * Every report carries its own expiry, so a dead worker's view stops counting on its own.
 */
export interface EndpointHealthReport {
  url: string;
  /** In this worker's rotation. */
  up: boolean;
  /** Why it is out of rotation; null while up. */
  reason: string | null;
  /** Since when (ms since epoch) it has been in this state. */
  sinceMs: number;
  /** The reporting worker's id (`host:pid`). */
  worker: string;
  updatedMs: number;
  /** After this (ms since epoch) the report is stale and ignored. */
  expiresMs: number;
}

/** One endpoint's health over every live worker's report. */
export interface EndpointHealthView {
  url: string;
  /** In the rotation of at least one live worker; null when no live worker reports it. */
  up: boolean | null;
  /** Why it is down (the latest report's reason); null while up or unknown. */
  reason: string | null;
  /** Since when it has been in its current state, by the earliest such report; null while unknown. */
  sinceMs: number | null;
  /** Live workers reporting on it. */
  workers: number;
  /** With `sglang.concurrency: "auto"`: the requests in flight chosen for it and why; absent otherwise. */
  concurrency?: EndpointConcurrency;
}

/**
 * The requests in flight `sglang.concurrency: "auto"` chose for one endpoint, kept in Redis
 * (`endpointConcurrencyKey`): every inference worker reads `cap` from it, the one worker
 * holding the endpoint's steering lease writes it.
 */
export interface EndpointConcurrency {
  /** Requests in flight allowed on the endpoint, summed over every worker. */
  cap: number;
  /** The worker steering it (`host:pid`), or null before any did. */
  controller: string | null;
  /** When the cap was last written (ms since epoch). */
  updatedMs: number;
  /** Why the last step went the way it did. */
  reason: string;
  /** What the last measurement saw: output tokens/s (null when the server has no /metrics), running and queued requests. */
  tokensPerSec: number | null;
  running: number;
  queued: number;
  /** 503 answers of the endpoint counted by the workers (a counter; only its increase matters). */
  overloads: number;
}

/** Hash of one endpoint's {@link EndpointConcurrency} (fields as named there). */
export function endpointConcurrencyKey(keys: RunKeys, endpoint: string): string {
  return `${keys.base}:ep:${endpointKey(endpoint)}:concurrency`;
}

/** The short lease (a string with a TTL) held by the one worker that steers an endpoint's concurrency. */
export function endpointConcurrencyLeaseKey(keys: RunKeys, endpoint: string): string {
  return `${endpointConcurrencyKey(keys, endpoint)}:lease`;
}

/** Parses the hash of {@link endpointConcurrencyKey}; undefined when it holds no valid cap. */
export function parseEndpointConcurrency(h: Record<string, string>): EndpointConcurrency | undefined {
  const cap = Number(h.cap);
  if (!Number.isInteger(cap) || cap < 1) return undefined;
  const num = (v: string | undefined): number => (v === undefined || !Number.isFinite(Number(v)) ? 0 : Number(v));
  return {
    cap,
    controller: h.controller ?? null,
    updatedMs: num(h.updatedMs),
    reason: h.reason ?? '',
    tokensPerSec: h.tokensPerSec === undefined || h.tokensPerSec === '' ? null : num(h.tokensPerSec),
    running: num(h.running),
    queued: num(h.queued),
    overloads: num(h.overloads),
  };
}

/** Each endpoint's chosen concurrency (undefined where `"auto"` has not written one), in one round trip. */
export async function readEndpointConcurrency(
  redis: Redis,
  keys: RunKeys,
  endpoints: readonly string[],
): Promise<(EndpointConcurrency | undefined)[]> {
  if (endpoints.length === 0) return [];
  const m = redis.multi();
  for (const url of endpoints) m.hgetall(endpointConcurrencyKey(keys, url));
  const replies = (await m.exec()) ?? [];
  return endpoints.map((_, i) => {
    const [err, value] = replies[i] ?? [null, null];
    return err === null && value !== null && typeof value === 'object'
      ? parseEndpointConcurrency(value as Record<string, string>)
      : undefined;
  });
}

/** Endpoint health for a run, as `status` and the progress line show it. */
export interface EndpointHealthSummary {
  /** Endpoints in the config. */
  total: number;
  /** Endpoints in at least one live worker's rotation. */
  healthy: number;
  /** Endpoints some live worker reports on (0: no inference worker is running, or none reports). */
  reported: number;
  endpoints: EndpointHealthView[];
}

/** Field of one worker's report on one endpoint. */
function field(worker: string, url: string): string {
  return `${worker} ${url}`;
}

/** Publishes one worker's reports (HSET, one round trip). */
export async function writeEndpointHealth(
  redis: Redis,
  keys: RunKeys,
  reports: readonly EndpointHealthReport[],
): Promise<void> {
  if (reports.length === 0) return;
  const args: string[] = [];
  for (const r of reports) args.push(field(r.worker, r.url), JSON.stringify(r));
  await redis.hset(keys.endpointHealth(), ...args);
}

/** Withdraws one worker's reports, e.g. when it stops cleanly. */
export async function removeEndpointHealth(
  redis: Redis,
  keys: RunKeys,
  worker: string,
  urls: readonly string[],
): Promise<void> {
  if (urls.length === 0) return;
  await redis.hdel(keys.endpointHealth(), ...urls.map((u) => field(worker, u)));
}

function parseReport(raw: string): EndpointHealthReport | undefined {
  try {
    const v = JSON.parse(raw) as Partial<EndpointHealthReport>;
    if (
      typeof v.url !== 'string' ||
      typeof v.up !== 'boolean' ||
      typeof v.expiresMs !== 'number' ||
      typeof v.sinceMs !== 'number'
    )
      return undefined;
    return {
      url: v.url,
      up: v.up,
      reason: typeof v.reason === 'string' ? v.reason : null,
      sinceMs: v.sinceMs,
      worker: String(v.worker ?? '?'),
      updatedMs: Number(v.updatedMs ?? 0),
      expiresMs: v.expiresMs,
    };
  } catch {
    return undefined;
  }
}

/** Reports older than this past their expiry are deleted by readers (dead workers' leftovers). */
const PRUNE_AFTER_EXPIRY_MS = 10 * 60_000;

/**
 * Reads every live worker's reports and sums them up per configured endpoint: an endpoint is
 * healthy when at least one live worker has it in rotation. Long-expired reports (of workers
 * that died without withdrawing them) are deleted on the way.
 */
export async function readEndpointHealth(
  redis: Redis,
  keys: RunKeys,
  endpoints: readonly string[],
  nowMs = Date.now(),
): Promise<EndpointHealthSummary> {
  const [all, caps] = await Promise.all([
    redis.hgetall(keys.endpointHealth()),
    readEndpointConcurrency(redis, keys, endpoints),
  ]);
  const live = new Map<string, EndpointHealthReport[]>();
  const dead: string[] = [];
  for (const [f, raw] of Object.entries(all)) {
    const r = parseReport(raw);
    if (r === undefined || r.expiresMs + PRUNE_AFTER_EXPIRY_MS < nowMs) dead.push(f);
    if (r === undefined || r.expiresMs < nowMs) continue;
    const key = normalizeUrl(r.url);
    live.set(key, [...(live.get(key) ?? []), r]);
  }
  if (dead.length > 0) await redis.hdel(keys.endpointHealth(), ...dead);
  const views = endpoints.map((url, i): EndpointHealthView => {
    const view = healthView(url, live.get(normalizeUrl(url)) ?? []);
    const cap = caps[i];
    return cap === undefined ? view : { ...view, concurrency: cap };
  });
  return {
    total: views.length,
    healthy: views.filter((v) => v.up === true).length,
    reported: views.filter((v) => v.up !== null).length,
    endpoints: views,
  };
}

function healthView(url: string, reports: readonly EndpointHealthReport[]): EndpointHealthView {
  if (reports.length === 0) return { url, up: null, reason: null, sinceMs: null, workers: 0 };
  const up = reports.filter((r) => r.up);
  if (up.length > 0)
    return { url, up: true, reason: null, sinceMs: Math.min(...up.map((r) => r.sinceMs)), workers: reports.length };
  const latest = reports.reduce((a, b) => (b.updatedMs > a.updatedMs ? b : a));
  return {
    url,
    up: false,
    reason: latest.reason,
    sinceMs: Math.min(...reports.map((r) => r.sinceMs)),
    workers: reports.length,
  };
}

function normalizeUrl(url: string): string {
  return url.replace(/\/+$/, '');
}

/** "1/2 endpoints healthy", with the first down endpoint's reason, or why health is unknown. */
export function describeEndpointHealth(h: EndpointHealthSummary): string {
  if (h.reported === 0) return `0/${h.total} endpoints healthy (no inference worker reporting)`;
  const down = h.endpoints.find((e) => e.up === false);
  if (h.healthy === h.total || down === undefined) return `${h.healthy}/${h.total} endpoints healthy`;
  const reason = down.reason ?? 'down';
  return `${h.healthy}/${h.total} endpoints healthy (${reason.includes(down.url) ? reason : `${down.url}: ${reason}`})`;
}
