import { hostname } from 'node:os';
import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  TRAIN_MAX_STALLED_COUNT,
  TRAIN_QUEUE,
  TrainKeys,
  closeRedisConnection,
  createRedisConnection,
  errorMessage,
  logger as componentLogger,
  type Logger,
  type RunKeys,
  type TrainResult,
} from '../../shared/index.js';
import type { EnvFingerprint } from './fingerprint.js';
import { probeGpus, type GpuProbe } from './gpus.js';
import { isCancel, processTrain, type PreviousRun } from './processor.js';
import { keepHiddenStatesOf, recordHiddenStates, writeStatus } from './train-jobs.js';

/** Lines of a job's output copied into its Bull Board log; the rest is in train.log. */
export const JOB_LOG_MAX_LINES = 2_000;

export interface TrainWorkerOptions {
  redisUrl: string;
  keys: RunKeys;
  /** GPU indices this worker may use (`--gpus`); all when omitted. */
  gpus?: readonly number[];
  /** GPU discovery; default `nvidia-smi` from PATH. */
  probeGpus?: () => Promise<GpuProbe>;
  /** BullMQ lock of the job, renewed while it runs; a dead worker's job is picked up after about this long. */
  lockDurationMs?: number;
  stalledIntervalMs?: number;
  workerId?: string;
  logger?: Logger;
}

/**
 * The train worker (`tokenmill worker --role train`): takes one train job at a time, and only
 * when this machine has the GPUs it needs with enough free memory; otherwise the job goes back
 * as delayed (not failed) and `status` says why, until memory frees.
 */
export class TrainWorker {
  private readonly log: Logger;
  private worker: Worker | undefined;
  private redis: Redis | undefined;
  private bullConnection: Redis | undefined;
  private readonly shutdown = new AbortController();
  private stopped = false;
  readonly workerId: string;

  constructor(private readonly options: TrainWorkerOptions) {
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.log = options.logger ?? componentLogger('train-worker', { worker: this.workerId });
  }

  async start(): Promise<void> {
    const o = this.options;
    this.redis = createRedisConnection(o.redisUrl, { role: 'worker', name: 'tokenmill:train', logger: this.log });
    this.bullConnection = createRedisConnection(o.redisUrl, {
      role: 'worker',
      name: 'tokenmill:train-bull',
      logger: this.log,
    });
    this.worker = new Worker<unknown, TrainResult>(TRAIN_QUEUE, (job, token) => this.process(job, token), {
      connection: this.bullConnection,
      prefix: o.keys.bullPrefix,
      concurrency: 1,
      lockDuration: o.lockDurationMs ?? 30_000,
      stalledInterval: o.stalledIntervalMs ?? 30_000,
      maxStalledCount: TRAIN_MAX_STALLED_COUNT,
    });
    this.worker.on('error', (err) => this.log.error({ err }, 'train queue worker error'));
    this.log.info({ gpus: o.gpus ?? 'all' }, 'train worker started');
  }

  private conn(): Redis {
    if (this.redis === undefined) throw new AppError('train worker not started');
    return this.redis;
  }

  private async process(job: Job, token: string | undefined): Promise<TrainResult> {
    const redis = this.conn();
    const tk = new TrainKeys(this.options.keys);
    const jobId = job.id ?? '';
    const log = this.log.child({ queue: job.queueName, jobId });
    // A job seen for the first time takes over the run's train status.
    const owner = await redis.hget(tk.status(), 'jobId');
    if (owner !== jobId) {
      await writeStatus(redis, this.options.keys, jobId, { state: 'queued' }, undefined, true);
      const chain = (job.data as { chain?: unknown }).chain;
      await keepHiddenStatesOf(redis, this.options.keys, typeof chain === 'string' ? chain : null);
    }
    let logged = 0;
    let logChain: Promise<unknown> = Promise.resolve();
    const payload = job.data as { preflightPollMs?: number };
    try {
      const outcome = await processTrain(job.data, {
        jobId,
        workerId: this.workerId,
        ...(this.options.gpus === undefined ? {} : { allowedGpus: this.options.gpus }),
        probeGpus: this.options.probeGpus ?? (() => probeGpus()),
        setStatus: (fields, phase) => writeStatus(redis, this.options.keys, jobId, fields, phase),
        previousRun: async () => (owner === jobId ? previousRunOf(await redis.hgetall(tk.status())) : null),
        lastGoodEnv: async () => {
          const v = await redis.get(tk.lastGoodEnv());
          return v === null ? null : (JSON.parse(v) as EnvFingerprint);
        },
        saveGoodEnv: async (fp) => {
          await redis.set(tk.lastGoodEnv(), JSON.stringify(fp));
        },
        isCancelled: async () => (await redis.exists(tk.cancel(jobId))) === 1,
        jobLog: (line) => {
          logged += 1;
          if (logged > JOB_LOG_MAX_LINES + 1) return;
          const text =
            logged > JOB_LOG_MAX_LINES
              ? `… output continues in train.log (only the first ${JOB_LOG_MAX_LINES} lines are copied here)`
              : line;
          logChain = logChain.then(() => job.log(text)).catch(() => undefined);
        },
        recordHiddenStates: (entry) => recordHiddenStates(redis, this.options.keys, entry),
        reportProgress: (p) => job.updateProgress(p),
        childResult: async () => Object.values(await job.getChildrenValues())[0],
        shutdown: this.shutdown.signal,
        logger: log,
      });
      await logChain;
      if (outcome.kind === 'done') return outcome.result;
      // Not startable here now: back to the queue as delayed, for this or another worker.
      const delay = outcome.kind === 'wait' ? (payload.preflightPollMs ?? 30_000) : 1_000;
      log.info(
        { reason: outcome.reason, delayMs: delay },
        outcome.kind === 'wait' ? 'train job waits' : 'train job handed back',
      );
      await job.moveToDelayed(Date.now() + delay, token);
      throw new DelayedError();
    } catch (e: unknown) {
      await logChain;
      if (e instanceof DelayedError) throw e;
      const cancelled = isCancel(e);
      const reason = errorMessage(e);
      log.error({ reason }, cancelled ? 'train job cancelled' : 'train job failed');
      await writeStatus(
        redis,
        this.options.keys,
        jobId,
        { state: cancelled ? 'cancelled' : 'failed', reason, finishedAt: new Date().toISOString() },
        'failed',
      ).catch(() => undefined);
      // A training is never retried on its own: a person chooses resume or from-scratch.
      throw new UnrecoverableError(reason);
    }
  }

  /**
   * Stops: no new job; a running command gets SIGTERM (SIGKILL after `train.cancelGraceMs`),
   * and its job fails, or goes back to the queue with `train.autoResume`; then Redis closes.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    // 1. The running command, then the queue worker (its job settles).
    this.shutdown.abort();
    await this.worker?.close();
    // 2. Redis connections.
    if (this.redis !== undefined) await closeRedisConnection(this.redis);
    if (this.bullConnection !== undefined) await closeRedisConnection(this.bullConnection);
    this.log.info('train worker stopped');
  }
}

function previousRunOf(h: Record<string, string>): PreviousRun | null {
  if (h.state === undefined) return null;
  const pid = Number(h.pid);
  return {
    state: h.state as PreviousRun['state'],
    worker: h.worker ?? null,
    host: h.host ?? null,
    pid: h.pid !== undefined && h.pid !== '' && Number.isInteger(pid) ? pid : null,
    pidIdentity: h.pidIdentity === undefined || h.pidIdentity === '' ? null : h.pidIdentity,
    attempt: h.attempt ?? null,
  };
}
