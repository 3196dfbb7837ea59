/**
 * `GET /metrics`: the run in Prometheus text, built with prom-client on a private registry per
 * scrape from the same Redis state as `status`: per dataset tokens, budget, records, failed,
 * skipped, in flight and queue depths by state; per endpoint health, in flight, a request
 * latency histogram and errors by status (summed over the live inference workers' heartbeats,
 * so those counters restart when a worker does — Prometheus' rate() treats that as a reset);
 * per train step that declares `hiddenStates`, the estimate of what it writes; per evaluated
 * attempt and dataset (and `overall`), the drafter's acceptance length, speed-up and both phases'
 * output tokens per second, and per attempt whether those figures are the simulator's.
 */
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { Counter, Gauge, Registry, type Metric } from 'prom-client';
import {
  JOB_STATES,
  MERGE_QUEUE,
  REQUEST_LATENCY_BUCKETS_S,
  TOKENIZE_QUEUE,
  generateQueueName,
  readRunStatus,
  type RunKeys,
  type RunStatus,
} from '../shared/index.js';

/** Renders the run's metrics; `status` may be passed in when already read. */
export async function renderMetrics(
  redis: Redis,
  keys: RunKeys,
  config: Parameters<typeof readRunStatus>[2],
  status?: RunStatus,
): Promise<{ contentType: string; body: string }> {
  const s = status ?? (await readRunStatus(redis, keys, config));
  const registry = new Registry();
  const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[]): Gauge<L> =>
    new Gauge({ name, help, labelNames, registers: [registry] });

  const run = { run: s.run };
  const dsTokens = gauge('tokenmill_dataset_output_tokens', 'Output tokens committed for the dataset.', [
    'run',
    'dataset',
  ]);
  const dsBudget = gauge('tokenmill_dataset_token_budget', 'Output-token budget of the dataset (absent without one).', [
    'run',
    'dataset',
  ]);
  const dsRecords = gauge('tokenmill_dataset_records', 'Samples committed for the dataset.', ['run', 'dataset']);
  const dsFailed = gauge(
    'tokenmill_dataset_failed_prompts',
    'Prompts of the dataset that ended failed (their attempts spent).',
    ['run', 'dataset'],
  );
  const dsSkipped = gauge(
    'tokenmill_dataset_skipped_prompts',
    'Prompts of the dataset skipped because its budget was met.',
    ['run', 'dataset'],
  );
  const dsRejected = gauge('tokenmill_dataset_rejected_prompts', 'Prompt lines of the dataset rejected when read.', [
    'run',
    'dataset',
  ]);
  const dsInFlight = gauge('tokenmill_dataset_in_flight_requests', 'Requests of the dataset in flight to SGLang.', [
    'run',
    'dataset',
  ]);
  const dsRate = gauge(
    'tokenmill_dataset_tokens_per_second',
    'Committed output tokens per second over the last minute.',
    ['run', 'dataset'],
  );
  const dsPaused = gauge('tokenmill_dataset_paused', '1 while the dataset is paused.', ['run', 'dataset']);
  const dsCompleted = gauge('tokenmill_dataset_completed', '1 once the dataset is completed.', ['run', 'dataset']);
  const dsConversations = gauge(
    'tokenmill_dataset_conversations',
    'Conversations of a dataset regenerated turn by turn (turns: all), by state: complete, partial (started, not finished), ended (ended early).',
    ['run', 'dataset', 'state'],
  );
  const dsEnded = gauge(
    'tokenmill_dataset_conversations_ended',
    'Conversations of a dataset (turns: all) ended early, by cause: context (a turn outgrew the context), failed (a turn failed at the server), error (the chat template, tokenizer or data), history-lost.',
    ['run', 'dataset', 'cause'],
  );
  const dsStopped = gauge(
    'tokenmill_dataset_stopped',
    '1 while the producer has stopped the dataset (status failed) after passes that made no progress; `status` says why.',
    ['run', 'dataset'],
  );
  const jobs = gauge('tokenmill_queue_jobs', 'Jobs of a queue of the run by state.', ['run', 'queue', 'state']);
  for (const d of s.datasets) {
    const l = { ...run, dataset: d.name };
    dsTokens.set(l, d.outputTokens);
    if (d.tokenBudget !== null) dsBudget.set(l, d.tokenBudget);
    dsRecords.set(l, d.records);
    dsFailed.set(l, d.failed);
    dsSkipped.set(l, d.skipped);
    dsRejected.set(l, d.rejected);
    dsInFlight.set(l, d.inFlight);
    dsRate.set(l, d.tokensPerSec);
    dsPaused.set(l, d.paused ? 1 : 0);
    dsCompleted.set(l, d.status === 'completed' ? 1 : 0);
    if (d.conversations !== undefined) {
      dsConversations.set({ ...l, state: 'complete' }, d.conversations.complete);
      dsConversations.set({ ...l, state: 'partial' }, d.conversations.partial);
      dsConversations.set({ ...l, state: 'ended' }, d.conversations.ended);
      for (const [cause, n] of Object.entries(d.conversations.endedBy)) dsEnded.set({ ...l, cause }, n);
    }
    dsStopped.set(l, d.status === 'failed' ? 1 : 0);
    if (config.datasets.find((c) => c.name === d.name)?.prompts === undefined) continue;
    for (const state of JOB_STATES) jobs.set({ ...run, queue: generateQueueName(d.name), state }, d.jobs[state] ?? 0);
  }
  for (const name of [TOKENIZE_QUEUE, MERGE_QUEUE]) {
    const q = new Queue(name, { connection: redis, prefix: keys.bullPrefix });
    try {
      const counts = await q.getJobCounts(...JOB_STATES);
      for (const state of JOB_STATES) jobs.set({ ...run, queue: name, state }, counts[state] ?? 0);
    } finally {
      await q.close();
    }
  }

  const epUp = gauge(
    'tokenmill_endpoint_up',
    '1 while a live inference worker has the endpoint in rotation, 0 while none has (absent while no worker reports on it).',
    ['run', 'endpoint'],
  );
  const epWorkers = gauge('tokenmill_endpoint_reporting_workers', 'Live inference workers reporting on the endpoint.', [
    'run',
    'endpoint',
  ]);
  const epInFlight = gauge(
    'tokenmill_endpoint_in_flight_requests',
    'Generation requests in flight to the endpoint, over the live inference workers.',
    ['run', 'endpoint'],
  );
  const epErrors = new Counter({
    name: 'tokenmill_endpoint_request_errors_total',
    help: 'Generation requests to the endpoint that failed, by HTTP status or failure (timeout, connection), over the live inference workers.',
    labelNames: ['run', 'endpoint', 'status'],
    registers: [registry],
  });
  const epRequests = new Counter({
    name: 'tokenmill_endpoint_requests_total',
    help: 'Generation requests to the endpoint that ended (any outcome but cancelled), over the live inference workers.',
    labelNames: ['run', 'endpoint'],
    registers: [registry],
  });
  for (const e of s.endpoints.endpoints) {
    const l = { ...run, endpoint: e.url };
    if (e.up !== null) epUp.set(l, e.up ? 1 : 0);
    epWorkers.set(l, e.workers);
  }
  for (const e of s.endpointRequests) {
    const l = { ...run, endpoint: e.url };
    epInFlight.set(l, e.inFlight);
    epRequests.inc(l, e.requests);
    for (const [status, n] of Object.entries(e.errors)) epErrors.inc({ ...l, status }, n);
  }
  registry.registerMetric(latencyHistogram(s) as unknown as Metric);

  const hiddenStates = gauge(
    'tokenmill_train_step_hidden_states_bytes',
    'Estimated bytes of the hidden states a train step writes (tokens × (hidden size × layers × bytes per element + per-token overhead)), made before the step starts; absent for steps that declare no hiddenStates.',
    ['run', 'step'],
  );
  const hiddenStatesNeeded = gauge(
    'tokenmill_train_step_hidden_states_needed_bytes',
    "Free bytes the step's output file system needs before it starts: the estimate + its margin + minFreeDiskGiB.",
    ['run', 'step'],
  );
  for (const h of s.train?.hiddenStates ?? []) {
    hiddenStates.set({ ...run, step: h.step }, h.bytes);
    hiddenStatesNeeded.set({ ...run, step: h.step }, h.neededBytes);
  }

  const acceptLength = gauge(
    'tokenmill_eval_accept_length',
    'The drafter\'s acceptance length (output tokens per verify step, the bonus token included) on the dataset\'s held-out prompts, per evaluated attempt; dataset="overall" for all of them.',
    ['run', 'attempt', 'dataset'],
  );
  const speedup = gauge(
    'tokenmill_eval_speedup',
    'Output tokens per second with the drafter over those of the target alone (the baseline), per evaluated attempt and dataset; absent without a baseline.',
    ['run', 'attempt', 'dataset'],
  );
  const evalRate = gauge(
    'tokenmill_eval_tokens_per_second',
    'Output tokens per second of an eval phase (phase="drafter": the target with the drafter; "baseline": the target alone), per evaluated attempt and dataset.',
    ['run', 'attempt', 'dataset', 'phase'],
  );
  const simulated = gauge(
    'tokenmill_eval_simulated',
    "1 when the attempt's eval ran against tokenmill's SGLang simulator (its acceptance configured, its speeds from its load model: not a measurement of the drafter), 0 when measured on SGLang; absent for a report that did not record it.",
    ['run', 'attempt'],
  );
  for (const a of s.eval?.attempts ?? []) {
    if (a.source !== null) simulated.set({ ...run, attempt: a.attempt }, a.source === 'simulator' ? 1 : 0);
    const sections = [
      ...a.datasets,
      {
        dataset: 'overall',
        acceptLength: a.acceptLength,
        speedup: a.speedup,
        drafterTokensPerSec: a.drafterTokensPerSec,
        baselineTokensPerSec: a.baselineTokensPerSec,
      },
    ];
    for (const d of sections) {
      const l = { ...run, attempt: a.attempt, dataset: d.dataset };
      if (d.acceptLength !== null) acceptLength.set(l, d.acceptLength);
      if (d.speedup !== null) speedup.set(l, d.speedup);
      if (d.drafterTokensPerSec !== null) evalRate.set({ ...l, phase: 'drafter' }, d.drafterTokensPerSec);
      if (d.baselineTokensPerSec !== null) evalRate.set({ ...l, phase: 'baseline' }, d.baselineTokensPerSec);
    }
  }

  const workers = gauge('tokenmill_workers', 'Live processes of the run by role (from their heartbeats).', [
    'run',
    'role',
  ]);
  for (const role of ['producer', 'inference', 'postprocess'])
    workers.set({ ...run, role }, s.workers.filter((w) => w.role === role).length);

  return { contentType: registry.contentType, body: await registry.metrics() };
}

/**
 * The request-latency histogram from the workers' bucket counts. prom-client's Histogram only
 * observes one value at a time, so this metric hands the registry its values directly, in the
 * shape prom-client's own histograms use.
 */
function latencyHistogram(s: RunStatus) {
  const name = 'tokenmill_endpoint_request_duration_seconds';
  const help = 'Latency of successful generation requests to the endpoint, over the live inference workers.';
  return {
    name,
    help,
    type: 'histogram',
    aggregator: 'sum',
    reset: () => undefined,
    get: () => {
      const values: { metricName: string; labels: Record<string, string | number>; value: number }[] = [];
      for (const e of s.endpointRequests) {
        const labels = { run: s.run, endpoint: e.url };
        let cumulative = 0;
        REQUEST_LATENCY_BUCKETS_S.forEach((le, i) => {
          cumulative += e.latencyBuckets[i] ?? 0;
          values.push({ metricName: `${name}_bucket`, labels: { ...labels, le }, value: cumulative });
        });
        cumulative += e.latencyBuckets[REQUEST_LATENCY_BUCKETS_S.length] ?? 0;
        values.push({ metricName: `${name}_bucket`, labels: { ...labels, le: '+Inf' }, value: cumulative });
        values.push({ metricName: `${name}_sum`, labels, value: e.latencySumSeconds });
        values.push({ metricName: `${name}_count`, labels, value: e.latencyCount });
      }
      return Promise.resolve({ name, help, type: 'histogram', aggregator: 'sum', values });
    },
  };
}
