/**
 * Post-process rounds as BullMQ flows: one `merge` parent per round over one `tokenize` child
 * per dataset, with deterministic job ids.
 *
 * - A round's flow id is `<run>-pp-<n>`; its children are `<flowId>-<dataset>`. `n` is the
 *   run's round counter in Redis (`keys.postprocess()`), moved on only when a new round starts
 *   after the previous one finished (completed or failed). Starting post-processing while a
 *   round is in progress joins that round: nothing is added again, and children already
 *   finished are not redone. A round whose counter was recorded but whose flow was never added
 *   (a crash in between) is added again under the same ids.
 * - A failed round is not resumed: the next start is a new round (after the cause is fixed).
 * - Children fail their parent (`failParentOnFailure`): a tokenize job that fails for good
 *   fails the round, whose reason is the child's ({@link roundFailure}); the merge never
 *   waits for a child that will not come.
 * - Datasets: every conversation dataset, and every generation dataset that has a generations
 *   folder, as it is on disk when the round starts. Rows the training dataset already holds
 *   are left out by the tokenize jobs, so rounds can follow one another as generations grow.
 */
import { randomBytes } from 'node:crypto';
import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';

import { FlowProducer, Job, Queue, type FlowJob } from 'bullmq';
import type { Redis } from 'ioredis';

import {
  AppError,
  CancelledError,
  DEFAULT_PYTHON,
  MERGE_QUEUE,
  MergePayloadSchema,
  MergeJobResultSchema,
  ProcessLock,
  TOKENIZE_QUEUE,
  TokenizePayloadSchema,
  checkTokenizerKindFits,
  logger as componentLogger,
  mergeJobOptions,
  parsePayload,
  tokenizeJobOptions,
  type Config,
  type Logger,
  type MergeJobResult,
  type RunKeys,
  type TokenizeSourceKind,
  type TrainPayload,
} from '../../shared/index.js';
import { trainPayloadOf, withTrainParent } from '../train/index.js';
import type { PhaseState, PostprocessPhase } from './processor.js';

/** Invalid lines tolerated in a conversation dataset (user data). */
export const CONVERSATION_MAX_INVALID_FRACTION = 0.05;

/**
 * Invalid lines tolerated in a dataset's generation files, over every line of the dataset read
 * so far: workers refuse bad answers before they are committed, so such a line comes from an
 * older version or a hand edit. It is skipped with a warning naming its file and line (and
 * listed in the round's report) instead of blocking every later round.
 */
export const GENERATION_MAX_INVALID_FRACTION = 0.05;

/** One dataset of a round. */
export interface PostprocessDatasetPlan {
  name: string;
  kind: TokenizeSourceKind;
  /** Generations folder, or conversation file. */
  source: string;
  /** `datasets[].chatTemplateKwargs`. */
  templateKwargs?: Record<string, unknown>;
  /** `postprocess.rows`, for a dataset regenerated turn by turn. */
  rows?: 'per-turn' | 'conversation';
}

/** What a round post-processes, and where. */
export interface PostprocessPlan {
  run: string;
  runDir: string;
  target: string;
  shardSizeMiB: number;
  datasets: PostprocessDatasetPlan[];
  /** `postprocess.verifyWithPython`: the merge loads the merged dataset with this Python before the swap. */
  verifyWithPython?: { python: string };
  /** With `train` configured: the round's train job, the parent of its merge. */
  train?: TrainPayload;
  /** `postprocess.dflash.maskToken`: the merge checks it against the tokenizer and the new rows. */
  dflashMaskToken?: string;
}

async function isDir(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isDirectory();
  } catch {
    return false;
  }
}

/**
 * The datasets a round started now would cover: each conversation dataset, and each
 * generation dataset with a `<runDir>/<dataset>/generations` folder holding a `*.jsonl` file.
 */
export async function planPostprocess(config: Config, runDir: string): Promise<PostprocessPlan> {
  checkTokenizerKindFits(config);
  const datasets: PostprocessDatasetPlan[] = [];
  for (const ds of config.datasets) {
    if (ds.conversations !== undefined) {
      datasets.push({
        name: ds.name,
        kind: 'conversations',
        source: ds.conversations,
        ...(ds.chatTemplateKwargs === undefined ? {} : { templateKwargs: ds.chatTemplateKwargs }),
      });
      continue;
    }
    const dir = path.join(runDir, ds.name, 'generations');
    if (!(await isDir(dir))) continue;
    if (!(await readdir(dir)).some((n) => n.endsWith('.jsonl') && !n.startsWith('.'))) continue;
    datasets.push({
      name: ds.name,
      kind: 'generations',
      source: dir,
      ...(ds.chatTemplateKwargs === undefined ? {} : { templateKwargs: ds.chatTemplateKwargs }),
      ...(ds.turns === 'all' ? { rows: config.postprocess.rows } : {}),
    });
  }
  const train = config.train === undefined ? {} : { train: trainPayloadOf(config, runDir, { origin: 'flow' }) };
  const verify = config.postprocess.verifyWithPython
    ? { verifyWithPython: { python: config.postprocess.python ?? DEFAULT_PYTHON } }
    : {};
  const maskToken = config.postprocess.dflash?.maskToken;
  return {
    run: config.run,
    runDir,
    target: config.postprocess.target,
    shardSizeMiB: config.postprocess.shardSizeMiB,
    datasets,
    ...train,
    ...verify,
    ...(maskToken === undefined ? {} : { dflashMaskToken: maskToken }),
  };
}

/** `<run>-pp-<n>`: the flow id (and merge job id) of round `n`. */
export function roundFlowId(run: string, round: number): string {
  return `${run}-pp-${round}`;
}

/** The tokenize job id of `dataset` in a round. */
export function tokenizeJobId(flowId: string, dataset: string): string {
  return `${flowId}-${dataset}`;
}

/** `<runDir>/postprocess/<flowId>`: the folder of a round's staged rows. */
export function roundStagingDir(runDir: string, flowId: string): string {
  return path.join(runDir, 'postprocess', flowId);
}

/** `<runDir>/postprocess/<flowId>/<dataset>`: where a round stages a dataset's rows. */
export function stagedDirOf(runDir: string, flowId: string, dataset: string): string {
  return path.join(roundStagingDir(runDir, flowId), dataset);
}

/** The flow of a round: the merge parent and its tokenize children (under a train job when configured), payloads checked. */
export function buildRoundFlow(plan: PostprocessPlan, flowId: string, mergeKey: string): FlowJob {
  const children: FlowJob[] = plan.datasets.map((d) => ({
    name: `tokenize ${d.name}`,
    queueName: TOKENIZE_QUEUE,
    data: parsePayload(
      TokenizePayloadSchema,
      {
        flowId,
        dataset: d.name,
        kind: d.kind,
        source: d.source,
        stagedDir: stagedDirOf(plan.runDir, flowId, d.name),
        target: plan.target,
        shardSizeMiB: plan.shardSizeMiB,
        maxInvalidFraction:
          d.kind === 'generations' ? GENERATION_MAX_INVALID_FRACTION : CONVERSATION_MAX_INVALID_FRACTION,
        ...(d.templateKwargs === undefined ? {} : { templateKwargs: d.templateKwargs }),
        ...(d.rows === undefined ? {} : { rows: d.rows }),
      },
      'tokenize',
    ),
    opts: { ...tokenizeJobOptions, jobId: tokenizeJobId(flowId, d.name), failParentOnFailure: true },
  }));
  const merge: FlowJob = {
    name: 'merge',
    queueName: MERGE_QUEUE,
    data: parsePayload(
      MergePayloadSchema,
      {
        flowId,
        target: plan.target,
        runDir: plan.runDir,
        shardSizeMiB: plan.shardSizeMiB,
        mergeKey,
        verifyWithPython: plan.verifyWithPython,
        dflashMaskToken: plan.dflashMaskToken,
      },
      'merge',
    ),
    opts: { ...mergeJobOptions, jobId: flowId },
    children,
  };
  // train ◀ merge ◀ tokenize(<dataset>)… when `train` is configured.
  return plan.train === undefined ? merge : withTrainParent(merge, plan.train, flowId);
}

/**
 * Writes a phase of the run's checklist (`status` shows it) for round `flowId`, unless a later
 * round has started since (a late event of an old round must not overwrite the current one's).
 */
export async function setRoundPhase(
  redis: Redis,
  keys: RunKeys,
  flowId: string,
  phase: PostprocessPhase,
  state: PhaseState,
): Promise<void> {
  if ((await redis.hget(keys.postprocess(), 'flowId')) !== flowId) return;
  await redis.hset(keys.phases(), phase, state);
}

/** Records how round `flowId` ended, unless a later round has started since. */
export async function recordRoundEnd(
  redis: Redis,
  keys: RunKeys,
  flowId: string,
  status: 'completed' | 'failed',
  reason = '',
): Promise<void> {
  if ((await redis.hget(keys.postprocess(), 'flowId')) !== flowId) return;
  await redis.hset(keys.postprocess(), { status, reason, finishedAt: new Date().toISOString() });
}

/** The round that {@link ensurePostprocessRound} started or joined. */
export interface RoundInfo {
  round: number;
  flowId: string;
  /** A round already in progress was joined. */
  reused: boolean;
  /** Datasets of the round (those of the plan, for a round added now). */
  datasets: string[];
}

const FINISHED = new Set(['completed', 'failed']);

/**
 * Starts a post-process round for `plan`, or joins the one in progress (see the module
 * comment). Serialized across processes by a Redis lock, so two callers never start two rounds.
 */
export async function ensurePostprocessRound(
  redis: Redis,
  keys: RunKeys,
  plan: PostprocessPlan,
  log: Logger = componentLogger('postprocess'),
): Promise<RoundInfo> {
  const lock = new ProcessLock(redis, keys.postprocessLock(), 30_000, log);
  await lock.acquire({ pollMs: 100 });
  const mergeQueue = new Queue(MERGE_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  const flows = new FlowProducer({ connection: redis, prefix: keys.bullPrefix });
  try {
    const state = await redis.hgetall(keys.postprocess());
    const current = Number(state.round ?? 0);
    if (current > 0 && state.status === 'in_progress' && state.flowId !== undefined && state.mergeKey !== undefined) {
      const flowId = state.flowId;
      const parent = await Job.fromId(mergeQueue, flowId);
      if (parent === undefined) {
        // Recorded, never added (a crash between the two): add it now under the same ids.
        await flows.add(buildRoundFlow(plan, flowId, state.mergeKey));
        log.info({ flowId, datasets: plan.datasets.map((d) => d.name) }, 'post-process round added again');
        return { round: current, flowId, reused: true, datasets: plan.datasets.map((d) => d.name) };
      }
      const jobState = await parent.getState();
      if (!FINISHED.has(jobState) && !parent.deferredFailure) {
        const datasets = await childDatasets(parent);
        log.info({ flowId, state: jobState }, 'joining the post-process round in progress');
        return { round: current, flowId, reused: true, datasets };
      }
      // Finished (or condemned by a failed child) without its end recorded: record it.
      if (jobState === 'completed') await recordRoundEnd(redis, keys, flowId, 'completed');
      else await recordRoundFailure(redis, keys, flowId, await roundFailure(redis, keys, parent));
    }
    const round = current + 1;
    const flowId = roundFlowId(plan.run, round);
    const mergeKey = `${flowId}/${randomBytes(4).toString('hex')}`;
    const flow = buildRoundFlow(plan, flowId, mergeKey);
    await redis
      .multi()
      .hset(keys.postprocess(), {
        round,
        flowId,
        mergeKey,
        status: 'in_progress',
        reason: '',
        startedAt: new Date().toISOString(),
        finishedAt: '',
      })
      .hset(keys.phases(), { tokenize: 'in_progress', merge: 'pending' })
      .exec();
    await flows.add(flow);
    log.info({ flowId, datasets: plan.datasets.map((d) => d.name) }, 'post-process round started');
    return { round, flowId, reused: false, datasets: plan.datasets.map((d) => d.name) };
  } finally {
    await flows.close();
    await mergeQueue.close();
    await lock.release();
  }
}

/** Dataset names of a round's tokenize jobs. */
async function childDatasets(parent: Job): Promise<string[]> {
  const deps = await parent.getDependencies();
  const keys = [...Object.keys(deps.processed ?? {}), ...(deps.unprocessed ?? []), ...(deps.failed ?? [])];
  const flowId = parent.id ?? '';
  return keys
    .map((k) => k.slice(k.lastIndexOf(':') + 1))
    .map((id) => (id.startsWith(`${flowId}-`) ? id.slice(flowId.length + 1) : id))
    .sort();
}

/** Why a round failed, and whether a tokenize job failed it. */
export interface RoundFailure {
  /** The reasons of its failed tokenize jobs (`tokenize <dataset>: <reason>`), or the merge job's own. */
  reason: string;
  /** A tokenize job failed (rather than the merge itself). */
  fromChild: boolean;
}

/** Why round `parent` (its merge job) failed. */
export async function roundFailure(redis: Redis, keys: RunKeys, parent: Job): Promise<RoundFailure> {
  const tokenizeQueue = new Queue(TOKENIZE_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  try {
    const deps = await parent.getDependencies();
    const reasons: string[] = [];
    for (const key of deps.failed ?? []) {
      const child = await Job.fromId(tokenizeQueue, key.slice(key.lastIndexOf(':') + 1));
      if (child === undefined) continue;
      const dataset = (child.data as { dataset?: unknown }).dataset;
      reasons.push(
        `tokenize ${typeof dataset === 'string' ? dataset : String(child.id)}: ${child.failedReason || 'failed'}`,
      );
    }
    if (reasons.length > 0) return { reason: reasons.join('; '), fromChild: true };
    return { reason: parent.failedReason || parent.deferredFailure || 'failed', fromChild: false };
  } finally {
    await tokenizeQueue.close();
  }
}

/**
 * Records a failed round in the checklist and the round's hash: merge failed, and tokenize
 * failed too when a tokenize job failed it. Idempotent; whoever sees the failure first records it.
 */
export async function recordRoundFailure(
  redis: Redis,
  keys: RunKeys,
  flowId: string,
  failure: RoundFailure,
): Promise<void> {
  if (failure.fromChild) await setRoundPhase(redis, keys, flowId, 'tokenize', 'failed');
  await setRoundPhase(redis, keys, flowId, 'merge', 'failed');
  await recordRoundEnd(redis, keys, flowId, 'failed', failure.reason);
}

/** How a round ended. */
export type RoundOutcome =
  { status: 'completed'; result: MergeJobResult } | { status: 'failed'; flowId: string; reason: string };

/** A post-process round failed; the message is the round's reason. Never retried. */
export class PostprocessFailedError extends AppError {
  constructor(
    readonly flowId: string,
    readonly reason: string,
  ) {
    super(`post-processing ${flowId} failed: ${reason}`, { retryable: false });
  }
}

/**
 * Waits until round `flowId` has finished, polling its merge job: its result, or its failure
 * reason (a failed tokenize job's own). A merge job that a failed child has condemned counts
 * as failed at once, even before a merge worker marks it so; a failure is recorded
 * ({@link recordRoundFailure}) before it is returned.
 */
export async function waitForRound(
  redis: Redis,
  keys: RunKeys,
  flowId: string,
  opts: { pollMs?: number; signal?: AbortSignal } = {},
): Promise<RoundOutcome> {
  const mergeQueue = new Queue(MERGE_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  try {
    for (;;) {
      if (opts.signal?.aborted === true) throw new CancelledError(`stopped waiting for post-process round ${flowId}`);
      const job = await Job.fromId(mergeQueue, flowId);
      if (job === undefined)
        throw new AppError(`post-process round ${flowId} is not in Redis (removed, or another Redis?)`);
      const state = await job.getState();
      if (state === 'completed') {
        // Read again: the job may have completed after it was read above, without its result.
        const completed =
          job.returnvalue === null || job.returnvalue === undefined ? await Job.fromId(mergeQueue, flowId) : job;
        return { status: 'completed', result: MergeJobResultSchema.parse(completed?.returnvalue) };
      }
      if (state === 'failed' || job.deferredFailure) {
        const failure = await roundFailure(redis, keys, job);
        await recordRoundFailure(redis, keys, flowId, failure);
        return { status: 'failed', flowId, reason: failure.reason };
      }
      await new Promise((r) => setTimeout(r, opts.pollMs ?? 200));
    }
  } finally {
    await mergeQueue.close();
  }
}
