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

/**
 * Reads an SGLang server's load: `GET /metrics` (needs `--enable-metrics`) for running and
 * queued requests and the decoded-token counter, else `GET /get_load` (running and queued
 * only). Throws with the endpoint named when neither answers.
 */
export class ServerLoadProbe {
  private metricsMissing = false;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;

  constructor(
    readonly endpoint: string,
    options: { apiKey?: string; timeoutMs?: number } = {},
  ) {
    this.headers = options.apiKey === undefined ? {} : { authorization: `Bearer ${options.apiKey}` };
    this.timeoutMs = options.timeoutMs ?? 5_000;
  }

  async read(): Promise<ServerLoadSample> {
    if (!this.metricsMissing) {
      const res = await this.get('/metrics');
      if (res.status === 200) {
        const text = await res.text();
        const running = promSum(text, 'sglang:num_running_reqs');
        const queued = promSum(text, 'sglang:num_queue_reqs');
        if (running !== null && queued !== null) {
          return { atMs: Date.now(), running, queued, generationTokensTotal: promSum(text, 'sglang:generation_tokens_total') };
        }
      } else {
        await res.body?.cancel();
      }
      // Started without --enable-metrics: /get_load has the counts, not the token rate.
      this.metricsMissing = true;
    }
    const res = await this.get('/get_load');
    if (res.status !== 200) {
      await res.body?.cancel();
      throw new Error(`${this.endpoint}/get_load answered ${res.status}`);
    }
    const body = (await res.json()) as unknown;
    const ranks = Array.isArray(body) ? body : typeof body === 'object' && body !== null && Array.isArray((body as { loads?: unknown }).loads) ? (body as { loads: unknown[] }).loads : [body];
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
    return { atMs: Date.now(), running, queued, generationTokensTotal: null };
  }

  private async get(path: string): Promise<Response> {
    try {
      return await fetch(`${this.endpoint}${path}`, { headers: this.headers, signal: AbortSignal.timeout(this.timeoutMs) });
    } catch (e: unknown) {
      throw new Error(`cannot read ${this.endpoint}${path}: ${errorMessage(e)}`, { cause: e });
    }
  }
}
