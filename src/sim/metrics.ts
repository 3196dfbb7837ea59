/** Prometheus text for the simulator's /metrics, with SGLang's metric names. */

const LATENCY_BUCKETS_S = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600, 1200];

export class LatencyHistogram {
  private readonly counts = new Array<number>(LATENCY_BUCKETS_S.length).fill(0);
  private sum = 0;
  private count = 0;

  observe(seconds: number): void {
    this.sum += seconds;
    this.count++;
    for (let i = 0; i < LATENCY_BUCKETS_S.length; i++) {
      if (seconds <= (LATENCY_BUCKETS_S[i] ?? Infinity)) this.counts[i] = (this.counts[i] ?? 0) + 1;
    }
  }

  render(name: string, help: string, labels: string): string {
    const lines = [`# HELP ${name} ${help}`, `# TYPE ${name} histogram`];
    LATENCY_BUCKETS_S.forEach((le, i) => {
      lines.push(`${name}_bucket{${labels},le="${le}"} ${this.counts[i] ?? 0}`);
    });
    lines.push(`${name}_bucket{${labels},le="+Inf"} ${this.count}`);
    lines.push(`${name}_sum{${labels}} ${this.sum}`);
    lines.push(`${name}_count{${labels}} ${this.count}`);
    return lines.join('\n');
  }
}

export interface MetricsSnapshot {
  modelName: string;
  numRunningReqs: number;
  numQueueReqs: number;
  tokenUsage: number;
  genThroughput: number;
  cacheHitRate: number;
  promptTokensTotal: number;
  generationTokensTotal: number;
  cachedTokensTotal: number;
  requestsTotal: number;
  e2eLatency: LatencyHistogram;
  queueTime: LatencyHistogram;
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

export function renderMetrics(m: MetricsSnapshot): string {
  const labels = `model_name="${escapeLabel(m.modelName)}"`;
  const gauge = (name: string, help: string, value: number): string =>
    `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name}{${labels}} ${value}`;
  const counter = (name: string, help: string, value: number): string =>
    `# HELP ${name} ${help}\n# TYPE ${name} counter\n${name}{${labels}} ${value}`;
  return (
    [
      gauge('sglang:num_running_reqs', 'The number of running requests.', m.numRunningReqs),
      gauge('sglang:num_queue_reqs', 'The number of requests in the waiting queue.', m.numQueueReqs),
      gauge('sglang:token_usage', 'The token usage.', m.tokenUsage),
      gauge('sglang:gen_throughput', 'The generation throughput (token/s).', m.genThroughput),
      gauge('sglang:cache_hit_rate', 'The prefix cache hit rate.', m.cacheHitRate),
      counter('sglang:prompt_tokens_total', 'Number of prefill tokens processed.', m.promptTokensTotal),
      counter('sglang:generation_tokens_total', 'Number of generation tokens processed.', m.generationTokensTotal),
      counter('sglang:cached_tokens_total', 'Number of cached prompt tokens.', m.cachedTokensTotal),
      counter('sglang:num_requests_total', 'Number of requests processed.', m.requestsTotal),
      m.e2eLatency.render(
        'sglang:e2e_request_latency_seconds',
        'Histogram of End-to-end request latency in seconds',
        labels,
      ),
      m.queueTime.render('sglang:queue_time_seconds', 'Histogram of queueing time in seconds.', labels),
    ].join('\n') + '\n'
  );
}
