import { errorMessage } from '../../shared/index.js';

/** One reading of an SGLang server's own load. */
export interface ServerLoadSample {
  /** Wall time of the reading (ms since epoch). */
  atMs: number;
  /** Requests the server is running (`sglang:num_running_reqs`, or `/get_load`). */
  running: number;
  /** Requests waiting in the server's queue (`sglang:num_queue_reqs`, or `/get_load`'s `num_waiting_reqs`). */
  queued: number;
  /** `sglang:generation_tokens_total` (a counter); null without `--enable-metrics`. */
  generationTokensTotal: number | null;
}

/** Sums every sample of one Prometheus metric (all label sets: DP ranks, TP ranks). */
export function promSum(text: string, name: string): number | null {
  let sum = 0;
  let found = false;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== '{' && rest[0] !== ' ') continue;
    const afterLabels = rest[0] === '{' ? rest.slice(rest.lastIndexOf('}') + 1) : rest;
    const value = Number(afterLabels.trim().split(' ')[0]);
    if (!Number.isFinite(value)) continue;
    sum += value;
    found = true;
  }
  return found ? sum : null;
}

/** Where a server's request counts come from when `/metrics` has none: SGLang < 0.5.x, then 0.5.x. */
const LOAD_PATHS = ['/get_load', '/v1/loads'] as const;
/** The longest a server whose `/metrics` lacked the request gauges is read from its load route before `/metrics` is tried again (ms). */
export const METRICS_RETRY_MS = 30_000;
/**
 * The first such wait (ms); it doubles with each `/metrics` still without the gauges, up to
 * {@link METRICS_RETRY_MS}. A real SGLang 0.5.23 that has just (re)started answers without them
 * until it has scheduled a batch: a fixed 30 s left `auto` without a token rate for that long.
 */
export const METRICS_FIRST_RETRY_MS = 1_000;

/**
 * Reads an SGLang server's load: `GET /metrics` (needs `--enable-metrics`) for running and
 * queued requests and the decoded-token counter, else its load route (`/get_load`, or
 * `/v1/loads` where that answers 404: running and queued only). A server that has just started
 * answers `/metrics` without the gauges for a moment, so a `/metrics` without them is tried
 * again after {@link METRICS_FIRST_RETRY_MS}, then twice as long each time it still lacks them,
 * up to every {@link METRICS_RETRY_MS}: never given up for good. Throws with the endpoint and
 * the routes named when none answers.
 */
export class ServerLoadProbe {
  /** When `/metrics` last lacked the gauges (ms, the probe's clock); null while it has them. */
  private metricsMissingAtMs: number | null = null;
  /** How long after {@link metricsMissingAtMs} `/metrics` is tried again (doubles while the gauges stay missing). */
  private metricsRetryDelayMs: number;
  /** The load route that answered last. */
  private loadPath: (typeof LOAD_PATHS)[number] = LOAD_PATHS[0];
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly metricsRetryMs: number;
  private readonly now: () => number;

  constructor(
    readonly endpoint: string,
    options: { apiKey?: string; timeoutMs?: number; metricsRetryMs?: number; now?: () => number } = {},
  ) {
    this.headers = options.apiKey === undefined ? {} : { authorization: `Bearer ${options.apiKey}` };
    this.timeoutMs = options.timeoutMs ?? 5_000;
    this.metricsRetryMs = options.metricsRetryMs ?? METRICS_RETRY_MS;
    this.metricsRetryDelayMs = Math.min(METRICS_FIRST_RETRY_MS, this.metricsRetryMs);
    this.now = options.now ?? Date.now;
  }

  /** Whether the last reading came from `/metrics` (false: from the load route, without the token rate). */
  get readsMetrics(): boolean {
    return this.metricsMissingAtMs === null;
  }

  async read(): Promise<ServerLoadSample> {
    if (this.metricsMissingAtMs === null || this.now() - this.metricsMissingAtMs >= this.metricsRetryDelayMs) {
      const retried = this.metricsMissingAtMs !== null;
      const sample = await this.readMetrics();
      if (sample !== null) {
        this.metricsMissingAtMs = null;
        this.metricsRetryDelayMs = Math.min(METRICS_FIRST_RETRY_MS, this.metricsRetryMs);
        return sample;
      }
      if (retried) this.metricsRetryDelayMs = Math.min(this.metricsRetryDelayMs * 2, this.metricsRetryMs);
      this.metricsMissingAtMs = this.now();
    }
    return this.readLoad();
  }

  /** `/metrics` as a sample, or null when it has no request gauges (started without --enable-metrics, or just started). */
  private async readMetrics(): Promise<ServerLoadSample | null> {
    const res = await this.get('/metrics');
    if (res.status !== 200) {
      await res.body?.cancel();
      return null;
    }
    const text = await res.text();
    const running = promSum(text, 'sglang:num_running_reqs');
    const queued = promSum(text, 'sglang:num_queue_reqs');
    if (running === null || queued === null) return null;
    return {
      atMs: Date.now(),
      running,
      queued,
      generationTokensTotal: promSum(text, 'sglang:generation_tokens_total'),
    };
  }

  private async readLoad(): Promise<ServerLoadSample> {
    const first = this.loadPath;
    let res = await this.get(first);
    if (res.status === 404) {
      await res.body?.cancel();
      const other = LOAD_PATHS.find((p) => p !== first) ?? first;
      res = await this.get(other);
      if (res.status === 200) this.loadPath = other;
    }
    if (res.status !== 200) {
      await res.body?.cancel();
      throw new Error(
        `${this.endpoint}: no load reading (/metrics has no request gauges; ${LOAD_PATHS.join(' and ')} answered ${res.status})`,
      );
    }
    return { ...loadCounts((await res.json()) as unknown), atMs: Date.now(), generationTokensTotal: null };
  }

  private async get(path: string): Promise<Response> {
    try {
      return await fetch(`${this.endpoint}${path}`, {
        headers: this.headers,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e: unknown) {
      throw new Error(`cannot read ${this.endpoint}${path}: ${errorMessage(e)}`, { cause: e });
    }
  }
}

/** Running and queued requests summed over the ranks of a load body (a list, `{ loads: [...] }`, or one object). */
function loadCounts(body: unknown): { running: number; queued: number } {
  const ranks = Array.isArray(body)
    ? body
    : typeof body === 'object' && body !== null && Array.isArray((body as { loads?: unknown }).loads)
      ? (body as { loads: unknown[] }).loads
      : [body];
  let running = 0;
  let queued = 0;
  for (const r of ranks) {
    if (typeof r !== 'object' || r === null) continue;
    const rank = r as Record<string, unknown>;
    const waiting = Number(rank.num_waiting_reqs ?? 0);
    const total = Number(rank.num_reqs ?? rank.num_total_reqs ?? 0);
    queued += Number.isFinite(waiting) ? waiting : 0;
    running += typeof rank.num_running_reqs === 'number' ? rank.num_running_reqs : Math.max(0, total - waiting);
  }
  return { running, queued };
}
