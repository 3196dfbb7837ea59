import path from 'node:path';
import { FlowProducer, Job, Queue, type FlowJob } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  CancelledError,
  EVAL_QUEUE,
  EvalKeys,
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
import { trainFlow } from './chain.js';

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
              gpus: s.gpus ?? t.gpus,
              minFreeGpuMemMiB: s.minFreeGpuMemMiB ?? t.minFreeGpuMemMiB,
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

/**
 * Writes fields of the run's train status for job `jobId` (and the `train` phase). With
 * `reset`, the status is started afresh for that job; otherwise a job that no longer owns
 * the status (a newer one took it) writes nothing.
 */
export async function writeStatus(
  redis: Redis,
  keys: RunKeys,
  jobId: string,
  fields: Record<string, string | number>,
  phase?: JobPhase,
  reset = false,
): Promise<void> {
  await writeJobStatus(redis, keys, { key: new TrainKeys(keys).status(), phase: 'train' }, jobId, fields, phase, reset);
}

/** A phase's state, as the phases hash holds it. */
export type JobPhase = 'pending' | 'in_progress' | 'completed' | 'failed';

/**
 * Writes fields of a stage's status hash (`status.key`) for job `jobId`, and that stage's entry
 * (`status.phase`) in the run's phases hash: the train and the eval status alike. With `reset`,
 * the status is started afresh for that job; otherwise a job that no longer owns it writes nothing.
 */
export async function writeJobStatus(
  redis: Redis,
  keys: RunKeys,
  status: { key: string; phase: string },
  jobId: string,
  fields: Record<string, string | number>,
  phase?: JobPhase,
  reset = false,
): Promise<void> {
  if (!reset && (await redis.hget(status.key, 'jobId')) !== jobId) return;
  const m = redis.multi();
  if (reset) m.del(status.key);
  m.hset(status.key, { ...fields, jobId, updatedAt: new Date().toISOString() });
  if (phase !== undefined) m.hset(keys.phases(), status.phase, phase);
  await m.exec();
}

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
  const queue = new Queue(TRAIN_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  let lastSeen = '';
  try {
    for (;;) {
      if (opts.signal?.aborted === true) throw new CancelledError(`stopped waiting for train job ${jobId}`);
      const status = await readTrainStatus(redis, keys);
      const ours = status !== null && (status.jobId === jobId || status.jobId.startsWith(`${jobId}-`));
      if (status !== null && ours && opts.onStatus !== undefined) {
        const key = JSON.stringify([status.state, status.step, status.loss, status.waiting, status.attempt]);
        if (key !== lastSeen) {
          lastSeen = key;
          opts.onStatus(status);
        }
      }
      // The state first, then the job: a job read before it finished has no result yet.
      const state = await queue.getJobState(jobId);
      if (state === 'unknown') throw new AppError(`train job ${jobId} is not in Redis (removed, or another Redis?)`);
      if (state === 'completed' || state === 'failed') {
        const job = await Job.fromId(queue, jobId);
        if (state === 'completed') return { status: 'completed', result: TrainResultSchema.parse(job?.returnvalue) };
        // A chain fails at the step that failed: its reason, not the parent's "child failed".
        const latest = await readTrainStatus(redis, keys);
        const own =
          latest !== null && latest.jobId.startsWith(`${jobId}-`) && latest.reason !== null
            ? `${latest.jobId}: ${latest.reason}`
            : null;
        return { status: 'failed', reason: own ?? (job?.failedReason || 'failed') };
      }
      await new Promise((r) => setTimeout(r, opts.pollMs ?? 250));
    }
  } finally {
    await queue.close();
  }
}

/** What `tokenmill train --cancel` did to each unfinished train job. */
export interface CancelledJob {
  jobId: string;
  state: string;
  action: 'removed' | 'signalled';
}

/**
 * Cancels the run's unfinished train jobs: a queued or delayed one is removed; a running one
 * (or one still waiting for its merge) is flagged, and its worker stops the command's process
 * group (SIGTERM, then SIGKILL after `train.cancelGraceMs`). Eval jobs: one still waiting for its
 * training fails with it; a queued or delayed one is removed; a running one is flagged, and its
 * worker stops the measurement and the servers it started.
 */
export async function cancelTrainJobs(redis: Redis, keys: RunKeys): Promise<CancelledJob[]> {
  const queue = new Queue(TRAIN_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  const tk = new TrainKeys(keys);
  const out: CancelledJob[] = [];
  try {
    const jobs = await queue.getJobs(['active', 'waiting', 'delayed', 'prioritized', 'waiting-children']);
    for (const job of jobs) {
      const jobId = job.id;
      if (jobId === undefined) continue;
      const state = await job.getState();
      await redis.set(tk.cancel(jobId), '1', 'EX', 7 * 24 * 3600);
      if (state === 'waiting' || state === 'delayed' || state === 'prioritized') {
        try {
          await job.remove();
          await writeStatus(
            redis,
            keys,
            jobId,
            { state: 'cancelled', reason: 'cancelled by `tokenmill train --cancel` before it started' },
            'failed',
          );
          out.push({ jobId, state, action: 'removed' });
          continue;
        } catch {
          // taken by a worker meanwhile: the flag stops it
        }
      }
      out.push({ jobId, state, action: 'signalled' });
    }
    out.push(...(await cancelEvalJobs(redis, keys)));
    return out;
  } finally {
    await queue.close();
  }
}

async function cancelEvalJobs(redis: Redis, keys: RunKeys): Promise<CancelledJob[]> {
  const queue = new Queue(EVAL_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  const out: CancelledJob[] = [];
  try {
    for (const job of await queue.getJobs(['active', 'waiting', 'delayed', 'prioritized'])) {
      const jobId = job.id;
      if (jobId === undefined) continue;
      const state = await job.getState();
      await redis.set(new EvalKeys(keys).cancel(jobId), '1', 'EX', 7 * 24 * 3600);
      if (state !== 'active') {
        try {
          await job.remove();
          const status = new EvalKeys(keys).status();
          if ((await redis.hget(status, 'jobId')) === jobId)
            await redis.hset(status, {
              state: 'cancelled',
              reason: 'cancelled by `tokenmill train --cancel` before it started',
            });
          out.push({ jobId, state, action: 'removed' });
          continue;
        } catch {
          // taken by a worker meanwhile: the flag stops it
        }
      }
      out.push({ jobId, state, action: 'signalled' });
    }
    return out;
  } finally {
    await queue.close();
  }
}
