import { hostname } from 'node:os';
import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  EVAL_QUEUE,
  EvalKeys,
  closeRedisConnection,
  createRedisConnection,
  errorMessage,
  logger as componentLogger,
  type ChatTokenizer,
  type Config,
  type EvalJobResult,
  type Logger,
  type RunKeys,
} from '../../shared/index.js';
import { groupAlive, killLeftGroup, parseIdentity, probeGpus, type GpuProbe } from '../train/index.js';
import { recordEvalReport, writeEvalStatus } from './eval-jobs.js';
import { EvalCancelledError, processEvalJob } from './job.js';
import type { EvalRunConfig } from './run.js';
import type { RetryPolicy } from './servers.js';

/** Lines copied into an eval job's Bull Board log. */
const JOB_LOG_MAX_LINES = 2_000;

export interface EvalWorkerOptions {
  redisUrl: string;
  keys: RunKeys;
  /** The run's config (datasets, tokenizer, train steps); each job brings its own `eval` section. */
  config: Config;
  /** The run's tokenizer, checked against the servers measured. */
  loadTokenizer(config: EvalRunConfig): Promise<ChatTokenizer>;
  /** GPU indices this worker may use (`--gpus`); all when omitted. */
  gpus?: readonly number[];
  probeGpus?: () => Promise<GpuProbe>;
  lockDurationMs?: number;
  stalledIntervalMs?: number;
  workerId?: string;
  logger?: Logger;
  retry?: RetryPolicy;
}

/**
 * The eval queue's worker, run beside the train worker (`tokenmill worker --role train`,
 * `tokenmill train`): one eval job at a time, after each completed training attempt.
 */
export class EvalWorker {
  private readonly log: Logger;
  private worker: Worker | undefined;
  private redis: Redis | undefined;
  private bullConnection: Redis | undefined;
  private readonly shutdown = new AbortController();
  private stopped = false;
  readonly workerId: string;

  constructor(private readonly options: EvalWorkerOptions) {
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.log = options.logger ?? componentLogger('eval-worker', { worker: this.workerId });
  }

  async start(): Promise<void> {
    const o = this.options;
    this.redis = createRedisConnection(o.redisUrl, { role: 'worker', name: 'tokenmill:eval', logger: this.log });
    this.bullConnection = createRedisConnection(o.redisUrl, {
      role: 'worker',
      name: 'tokenmill:eval-bull',
      logger: this.log,
    });
    this.worker = new Worker<unknown, EvalJobResult>(EVAL_QUEUE, (job, token) => this.process(job, token), {
      connection: this.bullConnection,
      prefix: o.keys.bullPrefix,
      concurrency: 1,
      lockDuration: o.lockDurationMs ?? 30_000,
      stalledInterval: o.stalledIntervalMs ?? 30_000,
    });
    this.worker.on('error', (err) => this.log.error({ err }, 'eval queue worker error'));
  }

  private async process(job: Job, token: string | undefined): Promise<EvalJobResult> {
    const redis = this.redis;
    if (redis === undefined) throw new AppError('eval worker not started');
    const keys = this.options.keys;
    const jobId = job.id ?? '';
    const log = this.log.child({ queue: job.queueName, jobId });
    const ek = new EvalKeys(keys);
    const before = await redis.hgetall(ek.status());
    if (before.jobId !== jobId) await writeEvalStatus(redis, keys, jobId, { state: 'queued' }, undefined, true);
    else if (before.host === hostname()) {
      // A worker that died while measuring left its servers behind: they hold the GPUs and ports.
      // Killed only when each pid is still the server recorded (a restart may have given it to another process).
      const identities = new Map(
        (before.serverGroups ?? '').split('\n').flatMap((l) => {
          const rec = parseIdentity(l);
          return rec === null ? [] : [[rec.pid, l] as const];
        }),
      );
      for (const pid of (before.servers ?? '').split('\n').map((l) => Number(/pid (\d+)$/.exec(l)?.[1]))) {
        if (!Number.isInteger(pid) || pid <= 1 || !groupAlive(pid)) continue;
        const left = await killLeftGroup(pid, identities.get(pid));
        if (left.killed) log.warn({ pgid: pid }, 'killed an eval server left by a train worker that died');
        else log.warn({ pgid: pid }, `an eval server left by a train worker that died: ${left.reason}`);
      }
    }
    let logged = 0;
    let logChain: Promise<unknown> = Promise.resolve();
    const payload = job.data as { preflightPollMs?: number };
    try {
      const outcome = await processEvalJob(job.data, {
        jobId,
        workerId: this.workerId,
        config: this.options.config,
        loadTokenizer: this.options.loadTokenizer,
        probeGpus: this.options.probeGpus ?? (() => probeGpus()),
        ...(this.options.gpus === undefined ? {} : { allowedGpus: this.options.gpus }),
        childResult: async () => Object.values(await job.getChildrenValues())[0],
        setStatus: (fields, phase) => writeEvalStatus(redis, keys, jobId, fields, phase),
        recordReport: (report) => recordEvalReport(redis, keys, report),
        isCancelled: async () => (await redis.exists(ek.cancel(jobId))) === 1,
        jobLog: (line) => {
          logged += 1;
          if (logged > JOB_LOG_MAX_LINES) return;
          logChain = logChain.then(() => job.log(line)).catch(() => undefined);
        },
        shutdown: this.shutdown.signal,
        logger: log,
        ...(this.options.retry === undefined ? {} : { retry: this.options.retry }),
      });
      await logChain;
      if (outcome.kind === 'done') return outcome.result;
      const delay = outcome.kind === 'wait' ? (payload.preflightPollMs ?? 30_000) : 1_000;
      log.info(
        { reason: outcome.reason, delayMs: delay },
        outcome.kind === 'wait' ? 'eval job waits' : 'eval job handed back',
      );
      if (outcome.kind === 'requeue')
        await writeEvalStatus(redis, keys, jobId, { state: 'queued', detail: outcome.reason });
      await job.moveToDelayed(Date.now() + delay, token);
      throw new DelayedError();
    } catch (e: unknown) {
      await logChain;
      if (e instanceof DelayedError) throw e;
      const reason = errorMessage(e);
      const cancelled = e instanceof EvalCancelledError;
      log.error({ reason }, cancelled ? 'eval job cancelled' : 'eval job failed');
      const own = (await redis.hget(ek.status(), 'state').catch(() => null)) ?? '';
      // A verdict below the thresholds has written its own state; anything else is said here.
      if (own !== 'failed')
        await writeEvalStatus(
          redis,
          keys,
          jobId,
          { state: cancelled ? 'cancelled' : 'failed', reason, servers: '', finishedAt: new Date().toISOString() },
          'failed',
        ).catch(() => undefined);
      throw new UnrecoverableError(reason);
    }
  }

  /** Stops: no new job; a running eval stops its servers and goes back to the queue; then Redis closes. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.shutdown.abort();
    await this.worker?.close();
    if (this.redis !== undefined) await closeRedisConnection(this.redis);
    if (this.bullConnection !== undefined) await closeRedisConnection(this.bullConnection);
  }
}
