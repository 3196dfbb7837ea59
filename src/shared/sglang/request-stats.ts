/**
 * Generation requests to SGLang as this process saw them, per endpoint: in flight, a latency
 * histogram, errors by status and the recent latencies. The SGLang client records every
 * generation request here; a worker's heartbeat (worker-registry.ts) publishes the snapshot,
 * and the dashboard sums the snapshots of the live workers.
 */

/** Upper bounds (seconds) of the request-latency histogram buckets; `+Inf` is implied. */
export const REQUEST_LATENCY_BUCKETS_S: readonly number[] = [0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600];

/** How far back "recent latency" looks (ms). */
const RECENT_WINDOW_MS = 5 * 60_000;
/** Latencies kept for the recent figures, per endpoint. */
const RECENT_KEPT = 256;

/** How a generation request ended, for {@link recordGenerationRequest}. */
export type RequestOutcome =
  /** The server answered with this HTTP status (2xx counts as success). */
  | { status: number }
  /** No HTTP status: `timeout`, `connection` (refused, reset, unreachable) or `cancelled` (by this process). */
  | { failure: 'timeout' | 'connection' | 'cancelled' };

/** One endpoint's requests as one process saw them (cumulative since the process started). */
export interface EndpointRequestStats {
  url: string;
  inFlight: number;
  /** Requests that ended (any outcome but `cancelled`). */
  requests: number;
  /** Answered 2xx: counts per bucket of {@link REQUEST_LATENCY_BUCKETS_S} (not cumulative), then +Inf. */
  latencyBuckets: number[];
  latencySumSeconds: number;
  latencyCount: number;
  /** Errors by HTTP status (`"500"`) or by failure (`"timeout"`, `"connection"`). */
  errors: Record<string, number>;
  /** Median and 95th percentile of the successful requests of the last 5 minutes (ms); null when none. */
  recentLatencyMs: { p50: number; p95: number; count: number } | null;
}

interface EndpointRecord {
  inFlight: number;
  requests: number;
  buckets: number[];
  sum: number;
  count: number;
  errors: Map<string, number>;
  /** [endedAtMs, latencyMs] of recent successes, oldest first. */
  recent: [number, number][];
}

const records = new Map<string, EndpointRecord>();

function recordOf(endpoint: string): EndpointRecord {
  const url = endpoint.replace(/\/+$/, '');
  let r = records.get(url);
  if (r === undefined) {
    r = {
      inFlight: 0,
      requests: 0,
      buckets: new Array<number>(REQUEST_LATENCY_BUCKETS_S.length + 1).fill(0),
      sum: 0,
      count: 0,
      errors: new Map(),
      recent: [],
    };
    records.set(url, r);
  }
  return r;
}

/** Marks a generation request to `endpoint` as started; call {@link recordGenerationRequest} when it ends. */
export function recordRequestStarted(endpoint: string): void {
  recordOf(endpoint).inFlight += 1;
}

/** Records how a generation request to `endpoint`, started `latencyMs` ago, ended. */
export function recordGenerationRequest(
  endpoint: string,
  outcome: RequestOutcome,
  latencyMs: number,
  nowMs = Date.now(),
): void {
  const r = recordOf(endpoint);
  r.inFlight = Math.max(0, r.inFlight - 1);
  if ('failure' in outcome) {
    if (outcome.failure === 'cancelled') return;
    r.requests += 1;
    r.errors.set(outcome.failure, (r.errors.get(outcome.failure) ?? 0) + 1);
    return;
  }
  r.requests += 1;
  if (outcome.status < 200 || outcome.status >= 300) {
    const k = String(outcome.status);
    r.errors.set(k, (r.errors.get(k) ?? 0) + 1);
    return;
  }
  const seconds = latencyMs / 1000;
  let i = REQUEST_LATENCY_BUCKETS_S.findIndex((le) => seconds <= le);
  if (i < 0) i = REQUEST_LATENCY_BUCKETS_S.length;
  r.buckets[i] = (r.buckets[i] ?? 0) + 1;
  r.sum += seconds;
  r.count += 1;
  r.recent.push([nowMs, latencyMs]);
  if (r.recent.length > RECENT_KEPT) r.recent.splice(0, r.recent.length - RECENT_KEPT);
}

function percentile(sorted: readonly number[], p: number): number {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1));
  return sorted[i] ?? 0;
}

/** This process's request stats per endpoint it has sent to. */
export function requestStatsSnapshot(nowMs = Date.now()): EndpointRequestStats[] {
  return [...records.entries()].map(([url, r]) => {
    const recent = r.recent
      .filter(([at]) => at >= nowMs - RECENT_WINDOW_MS)
      .map(([, ms]) => ms)
      .sort((a, b) => a - b);
    return {
      url,
      inFlight: r.inFlight,
      requests: r.requests,
      latencyBuckets: [...r.buckets],
      latencySumSeconds: r.sum,
      latencyCount: r.count,
      errors: Object.fromEntries(r.errors),
      recentLatencyMs:
        recent.length === 0
          ? null
          : {
              p50: Math.round(percentile(recent, 0.5)),
              p95: Math.round(percentile(recent, 0.95)),
              count: recent.length,
            },
    };
  });
}
