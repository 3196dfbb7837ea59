import path from 'node:path';
import { FlowProducer, type FlowJob } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  TRAIN_QUEUE,
  TrainKeys,
  TrainPayloadSchema,
  TrainResultSchema,
  parsePayload,
  readTrainStatus,
  type Config,
  type RunKeys,
  type TrainMode,
  type TrainPayload,
  type TrainHiddenStates,
  type TrainResult,
  type TrainStatus,
} from '../../shared/index.js';
import { cancelJobs, waitForJob, statusWriter } from '../gpu/index.js';
import type { CancelledJob, StatusPlace, StatusWriter } from '../gpu/index.js';
import { trainFlow } from './chain.js';
import { stepGpuNeed, type GpuGroupsNeed } from './gpu-need.js';

/**
 * Train jobs: the payload made from the config, the `train` parent that a post-process round's
 * merge job gets when `train` is configured, `tokenmill train`'s own jobs, waiting for one, and
 * cancelling.
 */

/** Choices made when a train job is queued (the CLI's flags; the config's otherwise). */
export interface TrainChoice {
  mode?: TrainMode;
  checkpoint?: string;
  allowEnvChange?: boolean;
  /** A round's flow id, or `cli`. */
  origin: string;
}

/** A step's GPUs and memory as its payload carries them: the total, and the groups of a split step. */
function stepNeed(
  s: NonNullable<NonNullable<Config['train']>['steps']>[number],
  t: NonNullable<Config['train']>,
): { gpus: number; minFreeGpuMemMiB: number; gpuGroups?: GpuGroupsNeed } {
  const need = stepGpuNeed(s, t);
  return {
    gpus: need.gpus,
    minFreeGpuMemMiB: need.minFreeGpuMemMiB,
    ...(need.groups === null ? {} : { gpuGroups: need.groups }),
  };
}

/** The train payload for `config`; throws when the config has no `train` section. */
export function trainPayloadOf(config: Config, runDir: string, choice: TrainChoice): TrainPayload {
  const t = config.train;
  if (t === undefined) throw new AppError('train: the config has no `train` section (train.command, train.mode, …)');
  return parsePayload(
    TrainPayloadSchema,
    {
      run: config.run,
      runDir,
      dataset: config.postprocess.target,
      mode: choice.mode ?? t.mode,
      ...(choice.checkpoint === undefined ? {} : { checkpoint: choice.checkpoint }),
      command: t.command ?? t.steps?.[0]?.command,
      resumeArgs: t.resumeArgs,
      ...(t.steps === undefined
        ? {}
        : {
            steps: t.steps.map((s) => ({
              name: s.name,
              command: s.command,
              ...stepNeed(s, t),
              minFreeDiskGiB: s.minFreeDiskGiB,
              ...(s.hiddenStates === undefined
                ? {}
                : {
                    hiddenStates: {
                      ...s.hiddenStates,
                      model: path.resolve(config.source.baseDir, s.hiddenStates.model),
                    },
                  }),
            })),
          }),
      cwd: config.source.baseDir,
      gpus: t.gpus,
      minFreeGpuMemMiB: t.minFreeGpuMemMiB,
      ...(t.python === undefined ? {} : { python: t.python }),
      allowEnvChange: choice.allowEnvChange === true || t.allowEnvChange,
      autoResume: t.autoResume,
      ...(t.progressRegex === undefined ? {} : { progressRegex: t.progressRegex }),
      cancelGraceMs: t.cancelGraceMs,
      preflightPollMs: t.preflightPollMs,
      origin: choice.origin,
      // The eval step after the training, with the eval section as it is now.
      ...(config.eval === undefined
        ? {}
        : {
            evaluate: {
              run: config.run,
              runDir,
              eval: config.eval,
              cwd: config.source.baseDir,
              preflightPollMs: t.preflightPollMs,
            },
          }),
    },
    'train',
  );
}

/** The train job id of a post-process round. */
export function roundTrainJobId(flowId: string): string {
  return `${flowId}-train`;
}

/**
 * A round's flow with training behind it: `train ◀ merge ◀ tokenize(<dataset>)…`. The merge
 * fails its train parent when it fails (the training never waits for a merge that will not come).
 */
export function withTrainParent(merge: FlowJob, payload: TrainPayload, flowId: string): FlowJob {
  return trainFlow(
    parsePayload(TrainPayloadSchema, { ...payload, origin: flowId }, 'train'),
    roundTrainJobId(flowId),
    merge,
  );
}

/** The run's train status, and its entry in the phases hash. */
export function trainStatusPlace(keys: RunKeys): StatusPlace {
  return { key: new TrainKeys(keys).status(), phase: 'train' };
}

/**
 * Writes fields of the run's train status for job `jobId` (and the `train` phase). With
 * `reset`, the status is started afresh for that job; otherwise a job that no longer owns
 * the status (a newer one took it) writes nothing.
 */
export const writeStatus: StatusWriter = statusWriter(trainStatusPlace);

/** Records a chain step's hidden-state estimate in the run's hash of them. */
export async function recordHiddenStates(redis: Redis, keys: RunKeys, entry: TrainHiddenStates): Promise<void> {
  await redis.hset(new TrainKeys(keys).hiddenStates(), entry.step, JSON.stringify(entry));
}

/** Drops the hidden-state estimates of chains other than `chain` (null: of every chain). */
export async function keepHiddenStatesOf(redis: Redis, keys: RunKeys, chain: string | null): Promise<void> {
  const key = new TrainKeys(keys).hiddenStates();
  const stale = Object.entries(await redis.hgetall(key))
    .filter(([, v]) => {
      try {
        return (JSON.parse(v) as { chain?: unknown }).chain !== chain;
      } catch {
        return true;
      }
    })
    .map(([k]) => k);
  if (stale.length > 0) await redis.hdel(key, ...stale);
}

/** Queues a train job for `tokenmill train` (`<run>-train-<n>`); its status starts as `queued`. */
export async function queueTrainJob(redis: Redis, keys: RunKeys, payload: TrainPayload): Promise<string> {
  const flows = new FlowProducer({ connection: redis, prefix: keys.bullPrefix });
  try {
    const n = await redis.incr(new TrainKeys(keys).counter());
    const jobId = `${payload.run}-train-${n}`;
    await writeStatus(redis, keys, jobId, { state: 'queued', mode: payload.mode }, 'pending', true);
    await keepHiddenStatesOf(redis, keys, payload.steps === undefined ? null : jobId);
    await flows.add(trainFlow(parsePayload(TrainPayloadSchema, payload, 'train'), jobId));
    return jobId;
  } finally {
    await flows.close();
  }
}

/** How a train job ended. */
export type TrainOutcomeSeen = { status: 'completed'; result: TrainResult } | { status: 'failed'; reason: string };

/**
 * Waits for train job `jobId` to finish, calling `onStatus` whenever the run's train status
 * changes (progress, waiting reason).
 */
export async function waitForTrainJob(
  redis: Redis,
  keys: RunKeys,
  jobId: string,
  opts: { pollMs?: number; signal?: AbortSignal; onStatus?: (s: TrainStatus) => void } = {},
): Promise<TrainOutcomeSeen> {
  return waitForJob<TrainStatus, TrainOutcomeSeen>(redis, keys, {
    queue: TRAIN_QUEUE,
    jobId,
    ...opts,
    async status() {
      const s = await readTrainStatus(redis, keys);
      return s !== null && (s.jobId === jobId || s.jobId.startsWith(`${jobId}-`)) ? s : null;
    },
    seen: (s) => [s.state, s.step, s.loss, s.waiting, s.attempt],
    async ended(state, job) {
      if (state === 'completed') return { status: 'completed', result: TrainResultSchema.parse(job?.returnvalue) };
      // A chain fails at the step that failed: its reason, not the parent's "child failed".
      const latest = await readTrainStatus(redis, keys);
      const own =
        latest !== null && latest.jobId.startsWith(`${jobId}-`) && latest.reason !== null
          ? `${latest.jobId}: ${latest.reason}`
          : null;
      return { status: 'failed', reason: own ?? (job?.failedReason || 'failed') };
    },
  });
}

export type { CancelledJob } from '../gpu/index.js';

/**
 * Cancels the run's unfinished train jobs: a queued or delayed one is removed; a running one
 * (or one still waiting for its merge) is flagged, and its worker stops the command's process
 * group (SIGTERM, then SIGKILL after `train.cancelGraceMs`). The eval jobs are eval's
 * (`cancelEvalJobs`).
 */
export async function cancelTrainJobs(redis: Redis, keys: RunKeys): Promise<CancelledJob[]> {
  return cancelJobs(redis, keys, {
    queue: TRAIN_QUEUE,
    states: ['active', 'waiting', 'delayed', 'prioritized', 'waiting-children'],
    cancelKey: (jobId) => new TrainKeys(keys).cancel(jobId),
    removed: (jobId) =>
      writeStatus(
        redis,
        keys,
        jobId,
        { state: 'cancelled', reason: 'cancelled by `tokenmill train --cancel` before it started' },
        'failed',
      ),
  });
}
