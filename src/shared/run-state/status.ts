import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { runDir, type Config } from '../config/index.js';
import { evalPhaseDetail, readEvalStatus, type EvalStatus } from './eval-status.js';
import { readEndpointHealth, type EndpointHealthSummary } from './endpoint-health.js';
import { estimateRateAndEta } from './eta.js';
import { generateQueueName } from '../queues/index.js';
import type { EndpointRequestStats } from '../sglang/index.js';
import type { RunKeys } from '../queues/index.js';
import { preparedCounts, readPhaseDetails, trainPhase, type PreparedCounts } from './phases.js';
import { readStalls } from './stall-watchdog.js';
import { readTrainStatus, type TrainStatus } from './train-status.js';
import { readWorkers, sumEndpointRequests, type WorkerInfo } from './worker-registry.js';

/** Status of a dataset or a phase, as `status --json` prints it. */
export type ProgressStatus = 'pending' | 'in_progress' | 'completed' | 'failed' | 'paused';

/** BullMQ job states counted per dataset queue. */
export const JOB_STATES = [
  'waiting',
  'active',
  'delayed',
  'prioritized',
  'waiting-children',
  'failed',
  'completed',
] as const;
export type JobState = (typeof JOB_STATES)[number];

export interface DatasetStatus {
  name: string;
  /** Samples committed (records in the generations files once the sink has written them). */
  records: number;
  outputTokens: number;
  /** Output-token budget; null for a dataset without one (tokenize-only). */
  tokenBudget: number | null;
  inFlight: number;
  failed: number;
  /** Skipped by budget. */
  skipped: number;
  /** Prompt lines rejected (bad JSON, missing fields, duplicate ids, too long). */
  rejected: number;
  /** `turns: all`: conversations by how far they got (each turn is one of `records`); absent otherwise. */
  conversations?: ConversationCounts;
  /** With `evalHoldout`: prompts of the dataset held out of generation (its eval split); absent otherwise. */
  evalHeldOut?: number;
  /** Prompts held out for having a held-out prompt's content (under another id or in another dataset); absent when none. */
  evalHeldOutSameContent?: number;
  /** What `tokenmill prepare` made of the dataset's source; null without a source or before it ran. */
  prepared?: PreparedCounts | null;
  /** Committed output tokens per second over the last minute. */
  tokensPerSec: number;
  /** Time left at the fastest and slowest recent rate; null while unknown. */
  etaSeconds: { low: number | null; high: number | null };
  status: ProgressStatus;
  /** Whether the dataset's queue is paused (also while completed). */
  paused: boolean;
  /** Batch jobs of the dataset's queue by state; empty for a dataset without prompts. */
  jobs: Partial<Record<JobState, number>>;
  /**
   * Set while the stall watchdog (in the producer) finds the dataset stalled: prompts pending,
   * nothing in flight and an endpoint healthy for longer than `workers.stallAfterMs`.
   */
  stalled: { sinceMs: number; reason: string } | null;
  /** Why the producer stopped the dataset (status `failed`): passes that made no progress, and their cause. */
  failedReason?: string;
}

/** Conversations of a dataset regenerated turn by turn. */
export interface ConversationCounts {
  /** Every turn committed. */
  complete: number;
  /** Ended early, their earlier turns kept: a turn too long for the context, a turn that failed. */
  ended: number;
  /** Started and not finished: in progress, or cut short by the budget or a stop (they resume at their next turn). */
  partial: number;
  /** Ended early, by cause: `context`, `failed`, `error`, `history-lost`. */
  endedBy: Record<string, number>;
  /**
   * Per cause of {@link endedBy}: the id of a conversation that ended so (the latest still ended;
   * finish-conversation-4.lua), to look at with `tokenmill show`. Absent for a cause without one.
   */
  endedExample: Record<string, string>;
  /** The latest conversations ended early (newest first, at most 5): id, the turn it stopped at, why. */
  lastEnded: { id: string; turn: number | null; reason: string }[];
  /** Turns committed (the dataset's records). */
  turns: number;
  /** Of the turns after the first: those whose prompt was spliced from the previous turn's ids (the rest were rendered from the decoded history). */
  laterTurns: number;
  spliced: number;
}

export interface PhaseStatus {
  name: 'prepare' | 'generate' | 'tokenize' | 'merge' | 'train' | 'eval';
  status: ProgressStatus;
  /** False for a stage this version or config does not run (train, eval). */
  configured: boolean;
  /** The numbers that prove the phase's state ("1,200 prompts read, 3 rejected"); '' when none yet. */
  detail: string;
}

/** One configured endpoint's requests, summed over the live inference workers. */
export type EndpointRequests = EndpointRequestStats;

export interface RunStatus {
  run: string;
  phases: PhaseStatus[];
  datasets: DatasetStatus[];
  /** SGLang endpoints' health as the live inference workers report it. */
  endpoints: EndpointHealthSummary;
  /** Per configured endpoint: in flight, recent latency, errors, as the live inference workers report them. */
  endpointRequests: EndpointRequests[];
  /** Live processes of the run (producer, inference and post-process workers), from their heartbeats. */
  workers: WorkerInfo[];
  /** The run's latest train job: state, attempt, progress, why it waits, environment fingerprint; null before any. */
  train?: TrainStatus | null;
  /**
   * The drafter's evaluations: the latest eval job, each attempt's figures, the latest attempt's
   * eval.json (`report`); null before any.
   */
  eval?: EvalStatus | null;
}

/** Width of the commit-rate buckets written by commit-sample-9.lua. */
export const RATE_BUCKET_MS = 10_000;
/** Buckets kept by commit-sample-9.lua (5 minutes). */
export const RATE_BUCKETS_KEPT = 30;
/** Buckets the tokens/s figure and the ETA measure over at most (the last minute). */
const RATE_WINDOW_BUCKETS = 6;

type StatusConfig = Pick<Config, 'run' | 'datasets'> & {
  sglang?: Pick<Config['sglang'], 'endpoints'>;
  train?: Config['train'];
  eval?: unknown;
  /** Where the run folder is, for the attempts' eval.json files (omitted: the reports in Redis only). */
  output?: Pick<Config['output'], 'dir'>;
};

/**
 * Reads a run's progress from Redis: per dataset records, tokens, budget, in flight, failed,
 * skipped, tok/s, an ETA range and its queue's jobs by state; the pipeline's phases as a
 * checklist with their numbers; the endpoints' health and requests; the live workers.
 */
export async function readRunStatus(
  redis: Redis,
  keys: RunKeys,
  config: StatusConfig,
  nowMs = Date.now(),
): Promise<RunStatus> {
  const datasets: DatasetStatus[] = [];
  const [endpoints, stalls, workers] = await Promise.all([
    readEndpointHealth(redis, keys, config.sglang?.endpoints ?? [], nowMs),
    readStalls(redis, keys, nowMs),
    readWorkers(redis, keys, nowMs),
  ]);
  for (const ds of config.datasets) {
    const [stats, inFlight, failed, skipped, rate, queue, lastEnded] = await Promise.all([
      redis.hgetall(keys.stats(ds.name)),
      redis.zcount(keys.inflight(ds.name), nowMs, '+inf'),
      redis.hlen(keys.failed(ds.name)),
      redis.scard(keys.skipped(ds.name)),
      redis.hgetall(keys.rate(ds.name)),
      ds.prompts === undefined ? Promise.resolve({ paused: false, jobs: {} }) : queueState(redis, keys, ds.name),
      ds.turns === 'all' ? redis.lrange(`${keys.stats(ds.name)}:ended`, 0, 4) : Promise.resolve([]),
    ]);
    const paused = queue.paused;
    const records = Number(stats.records ?? 0);
    const outputTokens = Number(stats.outputTokens ?? 0);
    const conversations =
      ds.turns === 'all'
        ? await stillEnded(redis, keys, ds.name, conversationCounts(stats, records, lastEnded))
        : undefined;
    const tokenBudget = ds.tokenBudget ?? null;
    const completed =
      stats.status === 'completed' &&
      (tokenBudget === null || stats.completedReason !== 'budget' || outputTokens >= tokenBudget);
    const { tokensPerSec, eta } = estimateRateAndEta(
      rate,
      nowMs,
      remainingTokens(ds, stats, records, outputTokens, failed, skipped, conversations),
      {
        bucketMs: RATE_BUCKET_MS,
        windowBuckets: RATE_WINDOW_BUCKETS,
        firstCommitMs: stats.firstCommitMs === undefined ? null : Number(stats.firstCommitMs),
        meanTokens: records > 0 ? outputTokens / records : null,
      },
    );
    let status: ProgressStatus;
    if (ds.prompts === undefined) status = 'completed';
    else if (paused && !completed) status = 'paused';
    else if (completed) status = 'completed';
    else if (stats.status === 'failed') status = 'failed';
    else if (stats.status === 'in_progress' || records > 0) status = 'in_progress';
    else status = 'pending';
    datasets.push({
      name: ds.name,
      records,
      outputTokens,
      tokenBudget,
      inFlight,
      failed,
      skipped,
      rejected: Number(stats.rejected ?? 0),
      ...(conversations === undefined ? {} : { conversations }),
      ...(stats.evalHeldOut === undefined ? {} : { evalHeldOut: Number(stats.evalHeldOut) }),
      ...(Number(stats.evalHeldOutSameContent ?? 0) > 0
        ? { evalHeldOutSameContent: Number(stats.evalHeldOutSameContent) }
        : {}),
      prepared: preparedCounts(stats),
      tokensPerSec,
      // A paused dataset has no ETA: nothing moves until `resume`.
      etaSeconds: status === 'completed' ? { low: 0, high: 0 } : status === 'paused' ? { low: null, high: null } : eta,
      status,
      paused,
      jobs: queue.jobs,
      stalled: stallOf(stalls.get(ds.name), status),
      ...(status === 'failed' && stats.failedReason !== undefined ? { failedReason: stats.failedReason } : {}),
    });
  }
  const phaseState = await redis.hgetall(keys.phases());
  const gen = datasets.filter((d) => config.datasets.find((c) => c.name === d.name)?.prompts !== undefined);
  const generate: ProgressStatus =
    gen.length === 0 || gen.every((d) => d.status === 'completed')
      ? 'completed'
      : gen.every((d) => d.status === 'completed' || d.status === 'failed')
        ? 'failed'
        : gen.some((d) => d.status === 'in_progress' || d.status === 'completed' || d.status === 'failed')
          ? 'in_progress'
          : gen.some((d) => d.status === 'paused')
            ? 'paused'
            : 'pending';
  const stateOf = (name: PhaseStatus['name'], fallback: ProgressStatus): ProgressStatus =>
    (phaseState[name] as ProgressStatus | undefined) ?? fallback;
  const prepared = Object.keys(await redis.hgetall(keys.stats(config.datasets[0]?.name ?? ''))).length > 0;
  const details = await readPhaseDetails(redis, keys, config, gen);
  const requests = sumEndpointRequests(workers);
  const train = await readTrainStatus(redis, keys);
  const evaluation = await readEvalStatus(
    redis,
    keys,
    config.output === undefined ? null : runDir({ run: config.run, output: config.output }),
  );
  const latest = evaluation?.report;
  return {
    run: config.run,
    phases: [
      {
        name: 'prepare',
        status: stateOf('prepare', prepared ? 'completed' : 'pending'),
        configured: true,
        detail: details.prepare,
      },
      { name: 'generate', status: generate, configured: gen.length > 0, detail: details.generate },
      { name: 'tokenize', status: stateOf('tokenize', 'pending'), configured: true, detail: details.tokenize },
      { name: 'merge', status: stateOf('merge', 'pending'), configured: true, detail: details.merge },
      trainPhase(stateOf('train', 'pending'), config.train !== undefined, train),
      {
        name: 'eval',
        status: stateOf(
          'eval',
          latest === null || latest === undefined ? 'pending' : latest.ok ? 'completed' : 'failed',
        ),
        configured: config.eval !== undefined || evaluation !== null,
        detail: evalPhaseDetail(evaluation),
      },
    ],
    datasets,
    endpoints,
    endpointRequests: (config.sglang?.endpoints ?? []).map(
      (url) => requests.get(url.replace(/\/+$/, '')) ?? emptyRequests(url),
    ),
    workers,
    train,
    eval: evaluation,
  };
}

function emptyRequests(url: string): EndpointRequests {
  return {
    url,
    inFlight: 0,
    requests: 0,
    latencyBuckets: [],
    latencySumSeconds: 0,
    latencyCount: 0,
    errors: {},
    recentLatencyMs: null,
  };
}

/** A live stall record counts only while the dataset is still being generated. */
function stallOf(
  record: { sinceMs: number; reason: string } | undefined,
  status: ProgressStatus,
): DatasetStatus['stalled'] {
  if (record === undefined || status === 'completed' || status === 'paused') return null;
  return { sinceMs: record.sinceMs, reason: record.reason };
}

/** Whether a dataset's queue is paused, and its jobs by state. */
async function queueState(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
): Promise<{ paused: boolean; jobs: DatasetStatus['jobs'] }> {
  const queue = new Queue(generateQueueName(dataset), { connection: redis, prefix: keys.bullPrefix });
  try {
    const [paused, jobs] = await Promise.all([queue.isPaused(), queue.getJobCounts(...JOB_STATES)]);
    return { paused, jobs };
  } finally {
    await queue.close();
  }
}

function conversationCounts(
  stats: Record<string, string>,
  records: number,
  lastEnded: readonly string[],
): ConversationCounts {
  const complete = Number(stats.conversationsComplete ?? 0);
  const ended = Number(stats.conversationsEnded ?? 0);
  const started = Number(stats.conversationsStarted ?? 0);
  const endedBy: Record<string, number> = {};
  for (const [k, v] of Object.entries(stats)) if (k.startsWith('ended:')) endedBy[k.slice('ended:'.length)] = Number(v);
  const endedExample: Record<string, string> = {};
  for (const cause of Object.keys(endedBy)) {
    const id = stats[`ended-example:${cause}`];
    if (id !== undefined && id !== '') endedExample[cause] = id;
  }
  return {
    complete,
    ended,
    endedBy,
    endedExample,
    lastEnded: lastEnded.flatMap((raw) => {
      try {
        const e = JSON.parse(raw) as { id?: unknown; turn?: unknown; reason?: unknown };
        return [
          {
            id: typeof e.id === 'string' ? e.id : '?',
            turn: typeof e.turn === 'number' ? e.turn : null,
            reason: typeof e.reason === 'string' ? e.reason : '',
          },
        ];
      } catch {
        return [];
      }
    }),
    partial: Math.max(0, started - complete - ended),
    turns: records,
    laterTurns: Math.max(0, records - started),
    spliced: Number(stats.turnsSpliced ?? 0),
  };
}

/**
 * Keeps an example only while its conversation is still ended (`retry-failed` reopens some); for
 * one that is not, the latest listed conversation ended for that cause, if any, else none.
 */
async function stillEnded(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
  counts: ConversationCounts,
): Promise<ConversationCounts> {
  const causes = Object.keys(counts.endedExample);
  if (causes.length === 0) return counts;
  const ends = await redis.hmget(keys.conversations(dataset), ...causes.map((c) => counts.endedExample[c] as string));
  const endedExample: Record<string, string> = {};
  causes.forEach((cause, i) => {
    const listed = isEndedRecord(ends[i] ?? null)
      ? counts.endedExample[cause]
      : counts.lastEnded.find((e) => e.reason === cause || e.reason.startsWith(`${cause}:`))?.id;
    if (listed !== undefined) endedExample[cause] = listed;
  });
  return { ...counts, endedExample };
}

function isEndedRecord(raw: string | null): boolean {
  if (raw === null) return false;
  try {
    return (JSON.parse(raw) as { kind?: unknown }).kind === 'ended';
  } catch {
    return false;
  }
}

/**
 * Output tokens still to generate: to the budget, or what the remaining prompts should yield
 * (for conversations: the conversations not finished, at the tokens per conversation so far).
 */
function remainingTokens(
  ds: Pick<Config['datasets'][number], 'tokenBudget'> & { samplesPerPrompt?: number },
  stats: Record<string, string>,
  records: number,
  outputTokens: number,
  failed: number,
  skipped: number,
  conversations?: ConversationCounts,
): number | null {
  const byBudget = ds.tokenBudget === undefined ? Infinity : Math.max(0, ds.tokenBudget - outputTokens);
  // Samples to make: `samplesPerPrompt` of each prompt (or conversation).
  const prompts = stats.prompts === undefined ? undefined : Number(stats.prompts) * (ds.samplesPerPrompt ?? 1);
  const finished = conversations === undefined ? 0 : conversations.complete + conversations.ended;
  const byPrompts =
    prompts === undefined || records === 0
      ? Infinity
      : conversations !== undefined
        ? finished === 0
          ? Infinity
          : Math.max(0, prompts - finished) * (outputTokens / (finished + conversations.partial))
        : Math.max(0, prompts - records - failed - skipped) * (outputTokens / records);
  const r = Math.min(byBudget, byPrompts);
  return Number.isFinite(r) ? r : null;
}
