import { hostname } from 'node:os';
import { UnrecoverableError, WaitingError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  RunKeys,
  closeRedisConnection,
  createRedisConnection,
  generateQueueName,
  logger as componentLogger,
  withScripts,
  type GenerateBatchResult,
  type Logger,
  type ScriptedRedis,
} from '../../shared/index.js';
import { Dispatcher } from './dispatcher.js';
import { EndpointPool } from './endpoint-pool.js';
import { processGenerateBatch } from './processor.js';

export interface InferenceWorkerOptions {
  redisUrl: string;
  keys: RunKeys;
  endpoints: readonly string[];
  /** Requests in flight per endpoint, summed over every worker process. */
  concurrency: number;
  requestTimeoutMs: number;
  /** Prompts per batch job, to size how many jobs to hold so the endpoints never starve. */
  batchSize: number;
  /** BullMQ lock of a batch job; a killed worker's jobs return to the queue after it. */
  lockDurationMs?: number;
  stalledIntervalMs?: number;
  /** Datasets to serve; when absent, every dataset a producer registers, found as they appear. */
  datasets?: readonly string[];
  /** How often to look for newly registered datasets. */
  discoverIntervalMs?: number;
  leaseTtlMs?: number;
  workerId?: string;
  logger?: Logger;
}

/**
 * The inference worker process (`tokenmill worker --role inference`): one BullMQ worker per
 * dataset queue, all feeding one {@link Dispatcher} that keeps `concurrency` requests in
 * flight per SGLang endpoint.
 */
export class InferenceWorker {
  private readonly log: Logger;
  private readonly workers = new Map<string, Worker>();
  private redis: ScriptedRedis | undefined;
  private bullConnection: Redis | undefined;
  private pool: EndpointPool | undefined;
  private dispatcher: Dispatcher | undefined;
  private discoverTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  readonly workerId: string;

  constructor(private readonly options: InferenceWorkerOptions) {
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.log = options.logger ?? componentLogger('inference-worker', { worker: this.workerId });
  }

  /** Requests in flight from this process. */
  get inFlight(): number {
    return this.dispatcher?.inFlight ?? 0;
  }

  async start(): Promise<void> {
    const o = this.options;
    this.redis = withScripts(createRedisConnection(o.redisUrl, { role: 'worker', name: 'tokenmill:inference', logger: this.log }));
    this.bullConnection = createRedisConnection(o.redisUrl, { role: 'worker', name: 'tokenmill:inference-bull', logger: this.log });
    this.pool = new EndpointPool({
      endpoints: o.endpoints,
      concurrency: o.concurrency,
      requestTimeoutMs: o.requestTimeoutMs,
      onChange: () => this.dispatcher?.wake(),
      logger: this.log,
    });
    this.dispatcher = new Dispatcher({
      redis: this.redis,
      keys: o.keys,
      pool: this.pool,
      concurrencyPerEndpoint: o.concurrency,
      workerId: this.workerId,
      ...(o.leaseTtlMs === undefined ? {} : { leaseTtlMs: o.leaseTtlMs }),
      logger: this.log,
    });
    await this.pool.start();
    this.dispatcher.start();
    await this.discover();
    if (o.datasets === undefined) {
      this.discoverTimer = setInterval(() => {
        void this.discover().catch((e: unknown) => this.log.warn({ err: e }, 'dataset discovery failed'));
      }, o.discoverIntervalMs ?? 2_000);
      this.discoverTimer.unref();
    }
    this.log.info({ endpoints: o.endpoints, concurrency: o.concurrency }, 'inference worker started');
  }

  private async discover(): Promise<void> {
    const redis = this.redis;
    if (redis === undefined || this.stopped) return;
    const names = this.options.datasets ?? (await redis.smembers(this.options.keys.datasets()));
    for (const name of names) if (!this.workers.has(name)) this.serve(name);
  }

  /** Starts a BullMQ worker on one dataset's queue. */
  private serve(dataset: string): void {
    const o = this.options;
    const connection = this.bullConnection;
    if (connection === undefined) throw new AppError('inference worker not started');
    // Enough jobs in hand that the dispatcher always has prompts to send while a batch's
    // long tail finishes: the slots of every endpoint, in batches, plus one.
    const concurrency = Math.ceil((o.concurrency * o.endpoints.length) / o.batchSize) + 1;
    const worker = new Worker<unknown, GenerateBatchResult>(
      generateQueueName(dataset),
      async (job: Job, token?: string) => this.process(dataset, job, token),
      {
        connection,
        prefix: o.keys.bullPrefix,
        concurrency,
        lockDuration: o.lockDurationMs ?? 30_000,
        stalledInterval: o.stalledIntervalMs ?? 30_000,
        maxStalledCount: 10,
        autorun: true,
      },
    );
    worker.on('error', (err) => this.log.error({ err, dataset }, 'queue worker error'));
    worker.on('failed', (job, err) => this.log.warn({ err, dataset, jobId: job?.id }, 'batch job failed'));
    this.workers.set(dataset, worker);
    this.log.info({ dataset, queue: generateQueueName(dataset), jobsInHand: concurrency }, 'serving dataset');
  }

  private async process(dataset: string, job: Job, token: string | undefined): Promise<GenerateBatchResult> {
    const redis = this.redis;
    const dispatcher = this.dispatcher;
    if (redis === undefined || dispatcher === undefined) throw new AppError('inference worker not started');
    const keys = this.options.keys;
    const log = this.log.child({ queue: job.queueName, jobId: job.id, dataset });
    try {
      const outcome = await processGenerateBatch(job.data, {
        isDone: async (ds, ids) => (await redis.smismember(keys.done(ds), ...ids)).map((x) => x === 1),
        attemptsSpent: async (ds, ids) => (await redis.hmget(keys.attempts(ds), ...ids)).map((x) => Number(x ?? 0)),
        submit: (req) => dispatcher.submit(req),
        logger: log,
      });
      if (outcome.handedBack > 0) {
        // Stopping: the job goes back to the queue without spending an attempt; the next
        // worker skips the samples this one committed.
        log.info({ handedBack: outcome.handedBack }, 'batch handed back');
        await job.moveToWait(token);
        throw new WaitingError();
      }
      const { handedBack: _h, ...result } = outcome;
      void _h;
      return result;
    } catch (e: unknown) {
      if (e instanceof AppError && !e.retryable) throw new UnrecoverableError(e.message);
      throw e;
    }
  }

  /**
   * Stops cleanly: stop fetching jobs, let requests in flight finish for `graceMs` (then
   * abort them and hand their samples back), close the queue workers, then Redis.
   */
  async stop(graceMs = 10_000): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.discoverTimer);
    // 1. No new jobs; jobs in hand finish once the dispatcher settles their samples.
    const closing = Promise.all([...this.workers.values()].map((w) => w.close()));
    // 2. Requests in flight: finish within the grace period, or abort and hand back.
    await this.dispatcher?.stop(graceMs);
    await closing;
    // 3. Endpoints (HTTP pools), then 4. Redis connections.
    await this.pool?.stop();
    if (this.redis !== undefined) await closeRedisConnection(this.redis);
    if (this.bullConnection !== undefined) await closeRedisConnection(this.bullConnection);
    this.log.info('inference worker stopped');
  }
}
