/**
 * The BullMQ worker of a GPU queue (train, eval): one job at a time, taken only when this
 * machine can run it; otherwise the job goes back as delayed (not failed) and the status says why.
 * A job the processor hands back (the worker stops) is delayed briefly for another worker; any
 * error fails the job for good (a person chooses what comes next), its status saying why.
 */
import { hostname } from 'node:os';
import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  CancelledError,
  closeRedisConnection,
  createRedisConnection,
  errorMessage,
  logger as componentLogger,
  type Logger,
  type RunKeys,
} from '../../shared/index.js';
import { probeGpus, type GpuProbe } from './gpus.js';
import type { GpuJobDeps, GpuJobOutcome } from './job.js';
import { writeJobStatus, type JobPhase, type StatusPlace } from './job-status.js';

/** Lines of a job's output copied into its Bull Board log. */
export const JOB_LOG_MAX_LINES = 2_000;

/** How long a job handed back waits before another worker may take it (ms). */
const HAND_BACK_DELAY_MS = 1_000;

/** How long a job that cannot start waits when its payload names no `preflightPollMs`. */
const DEFAULT_PREFLIGHT_POLL_MS = 30_000;

/** The job was cancelled (`tokenmill train --cancel`). Never retried. */
export class JobCancelledError extends AppError {
  constructor(message: string) {
    super(message, { retryable: false });
  }
}

/** Whether an error means "cancelled" (for the status' state). */
export function isCancel(e: unknown): boolean {
  return e instanceof JobCancelledError || e instanceof CancelledError;
}

export interface GpuWorkerOptions {
  redisUrl: string;
  keys: RunKeys;
  /** GPU indices this worker may use (`--gpus`); all when omitted. */
  gpus?: readonly number[];
  /** GPU discovery; default `nvidia-smi` from PATH. */
  probeGpus?: () => Promise<GpuProbe>;
  /** BullMQ lock of the job, renewed while it runs; a dead worker's job is picked up after about this long (`workers.lockDurationMs`). */
  lockDurationMs: number;
  /** How often BullMQ looks for stalled jobs (`workers.stalledIntervalMs`). */
  stalledIntervalMs: number;
  workerId?: string;
  logger?: Logger;
}

/** A job as its kind sees it once taken: the shell's deps, Redis, and whether it owned the status before. */
export interface TakenJob {
  job: Job;
  deps: GpuJobDeps;
  redis: Redis;
  /** The status was this job's already: a worker ran it before (it died, or handed it back). */
  seenBefore: boolean;
  /** The status as the job found it. */
  before: Record<string, string>;
}

/** What one kind of GPU job tells the shell. */
export interface GpuJobKind<R> {
  /** The queue: `train`, `eval` (also the word of its logs and connection names). */
  queue: string;
  maxStalledCount?: number;
  /** The run's status of this kind of job. */
  status: StatusPlace;
  /** The key of a job's cancel flag. */
  cancelKey(jobId: string): string;
  /** Said once in the job's log when its lines are more than {@link JOB_LOG_MAX_LINES}. */
  logFull?: string;
  /** Status fields cleared when a job fails (what it started and no longer runs). */
  clearedOnFailure?: Record<string, string>;
  /** Before the processor: what a new job resets, or what a dead worker left. */
  taken?(t: TakenJob, log: Logger): Promise<void>;
  /** The processor, with the shell's deps and the kind's own. */
  process(t: TakenJob): Promise<GpuJobOutcome<R>>;
}

/** The shell of a GPU worker: its queue, connections, job log, outcome and failure handling. */
export class GpuWorker<R> {
  protected readonly log: Logger;
  private worker: Worker | undefined;
  private redis: Redis | undefined;
  private bullConnection: Redis | undefined;
  private readonly shutdown = new AbortController();
  private stopped = false;
  readonly workerId: string;

  constructor(
    private readonly options: GpuWorkerOptions,
    private readonly kind: GpuJobKind<R>,
  ) {
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.log = options.logger ?? componentLogger(`${kind.queue}-worker`, { worker: this.workerId });
  }

  async start(): Promise<void> {
    const o = this.options;
    const q = this.kind.queue;
    this.redis = createRedisConnection(o.redisUrl, { role: 'worker', name: `tokenmill:${q}`, logger: this.log });
    this.bullConnection = createRedisConnection(o.redisUrl, {
      role: 'worker',
      name: `tokenmill:${q}-bull`,
      logger: this.log,
    });
    this.worker = new Worker<unknown, R>(q, (job, token) => this.process(job, token), {
      connection: this.bullConnection,
      prefix: o.keys.bullPrefix,
      concurrency: 1,
      lockDuration: o.lockDurationMs,
      stalledInterval: o.stalledIntervalMs,
      ...(this.kind.maxStalledCount === undefined ? {} : { maxStalledCount: this.kind.maxStalledCount }),
    });
    this.worker.on('error', (err) => this.log.error({ err }, `${q} queue worker error`));
    this.log.info({ gpus: o.gpus ?? 'all' }, `${q} worker started`);
  }

  private async process(job: Job, token: string | undefined): Promise<R> {
    const redis = this.redis;
    if (redis === undefined) throw new AppError(`${this.kind.queue} worker not started`);
    const jobId = job.id ?? '';
    const log = this.log.child({ queue: job.queueName, jobId });
    const setStatus = (fields: Record<string, string | number>, phase?: JobPhase, reset = false): Promise<void> =>
      writeJobStatus(redis, this.options.keys, this.kind.status, jobId, fields, phase, reset);
    // A job seen for the first time takes over the run's status of its kind.
    const before = await redis.hgetall(this.kind.status.key);
    const seenBefore = before.jobId === jobId;
    if (!seenBefore) await setStatus({ state: 'queued' }, undefined, true);
    const jobLog = boundedJobLog(job, this.kind.logFull);
    const taken: TakenJob = { job, redis, seenBefore, before, deps: this.depsOf(job, redis, log, setStatus, jobLog) };
    await this.kind.taken?.(taken, log);
    try {
      const outcome = await this.kind.process(taken);
      await jobLog.settled();
      if (outcome.kind === 'done') return outcome.result;
      // Not startable here now: back to the queue as delayed, for this or another worker.
      const delay =
        outcome.kind === 'wait'
          ? ((job.data as { preflightPollMs?: number }).preflightPollMs ?? DEFAULT_PREFLIGHT_POLL_MS)
          : HAND_BACK_DELAY_MS;
      const q = this.kind.queue;
      log.info(
        { reason: outcome.reason, delayMs: delay },
        outcome.kind === 'wait' ? `${q} job waits` : `${q} job handed back`,
      );
      await job.moveToDelayed(Date.now() + delay, token);
      throw new DelayedError();
    } catch (e: unknown) {
      await jobLog.settled();
      if (e instanceof DelayedError) throw e;
      throw await this.failed(redis, e, log, setStatus);
    }
  }

  private depsOf(
    job: Job,
    redis: Redis,
    log: Logger,
    setStatus: GpuJobDeps['setStatus'],
    jobLog: { add(line: string): void },
  ): GpuJobDeps {
    const o = this.options;
    return {
      jobId: job.id ?? '',
      workerId: this.workerId,
      ...(o.gpus === undefined ? {} : { allowedGpus: o.gpus }),
      probeGpus: o.probeGpus ?? (() => probeGpus()),
      setStatus,
      isCancelled: async () => (await redis.exists(this.kind.cancelKey(job.id ?? ''))) === 1,
      jobLog: (line) => jobLog.add(line),
      childResult: async () => Object.values(await job.getChildrenValues())[0],
      shutdown: this.shutdown.signal,
      logger: log,
    };
  }

  /** A failed job: its status says why (unless the processor wrote its own failure), never retried. */
  private async failed(
    redis: Redis,
    e: unknown,
    log: Logger,
    setStatus: GpuJobDeps['setStatus'],
  ): Promise<UnrecoverableError> {
    const reason = errorMessage(e);
    const cancelled = isCancel(e);
    const q = this.kind.queue;
    log.error({ reason }, cancelled ? `${q} job cancelled` : `${q} job failed`);
    const own = (await redis.hget(this.kind.status.key, 'state').catch(() => null)) ?? '';
    if (own !== 'failed')
      await setStatus(
        {
          state: cancelled ? 'cancelled' : 'failed',
          reason,
          ...this.kind.clearedOnFailure,
          finishedAt: new Date().toISOString(),
        },
        'failed',
      ).catch(() => undefined);
    // A GPU job is never retried on its own: a person chooses what comes next.
    return new UnrecoverableError(reason);
  }

  /**
   * Stops: no new job; the running job's work is stopped (its command, its servers) and the job
   * fails or goes back to the queue, as its kind decides; then Redis closes.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    // 1. The running work, then the queue worker (its job settles).
    this.shutdown.abort();
    await this.worker?.close();
    // 2. Redis connections.
    if (this.redis !== undefined) await closeRedisConnection(this.redis);
    if (this.bullConnection !== undefined) await closeRedisConnection(this.bullConnection);
    this.log.info(`${this.kind.queue} worker stopped`);
  }
}

/** A job's Bull Board log, written in order and bounded to {@link JOB_LOG_MAX_LINES} lines (then `full`, once). */
function boundedJobLog(job: Job, full: string | undefined): { add(line: string): void; settled(): Promise<unknown> } {
  let logged = 0;
  let chain: Promise<unknown> = Promise.resolve();
  return {
    add(line) {
      logged += 1;
      const text = logged <= JOB_LOG_MAX_LINES ? line : logged === JOB_LOG_MAX_LINES + 1 ? full : undefined;
      if (text === undefined) return;
      chain = chain.then(() => job.log(text)).catch(() => undefined);
    },
    settled: () => chain,
  };
}
