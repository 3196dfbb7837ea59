import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import type { ChatTokenizer, RunKeys } from '../../shared/index.js';
import {
  AppError,
  closeRedisConnection,
  createRedisConnection,
  generateQueueName,
  throttledErrorLog,
  logger as componentLogger,
  withScripts,
  type InferenceStageOptions,
  type GenerateBatchResult,
  type Logger,
  type ScriptedRedis,
} from '../../shared/index.js';
import { BatchReporter } from './batch-report.js';
import { Dispatcher, type DispatchAccounting } from './dispatcher.js';
import { EndpointPool, type EndpointPoolOptions } from './endpoint-pool.js';
import { batchJobError, failBatchJob } from './failed-batch.js';
import { parseFailureRecord } from './failure-records.js';
import { processGenerateBatch, type GenerateBatchOutcome } from './processor.js';
import { conversationStore } from './conversation-store.js';

/** The first wait for a batch when none is queued; each next one doubles, up to 200 ms. */
const FIRST_EMPTY_WAIT_MS = 2;
/** How often a worker without a dataset list looks for newly registered datasets. */
const DISCOVER_INTERVAL_MS = 2_000;

/**
 * An inference worker's options: the stage's options compiled from the config
 * (`inferenceOptions(config)`, every default applied there) and what this process adds.
 */
export interface InferenceWorkerOptions extends InferenceStageOptions {
  redisUrl: string;
  keys: RunKeys;
  /** Shorter `"auto"` steering samples and lease (tests). */
  autoConcurrencyTiming?: EndpointPoolOptions['autoConcurrencyTiming'];
  /** Datasets to serve; when absent, every dataset a producer registers, found as they appear. */
  datasets?: readonly string[];
  workerId?: string;
  /** The run's tokenizer: renders the turns after the first of conversations regenerated turn by turn (`turns: all`). */
  tokenizer?: ChatTokenizer | Promise<ChatTokenizer> | undefined;
  logger?: Logger;
}

/** A batch job this process took, while its samples run. */
interface HeldBatch {
  job: Job;
  token: string;
  worker: Worker;
  /** Its lock lapsed and another worker may hold it now: this process records nothing for it. */
  lost: boolean;
  /** Called once when the batch is lost. */
  onLost?: () => void;
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
  private feeding: Promise<void> | undefined;
  /** Batch jobs this process holds (their locks are renewed until they settle). */
  private readonly held = new Set<HeldBatch>();
  private readonly settling = new Set<Promise<void>>();
  readonly workerId: string;

  constructor(private readonly options: InferenceWorkerOptions) {
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.log = options.logger ?? componentLogger('inference-worker', { worker: this.workerId });
  }

  /** Requests in flight from this process. */
  get inFlight(): number {
    return this.dispatcher?.inFlight ?? 0;
  }

  /** Why the dispatcher's accounting of its samples does not add up, or undefined (for tests and checks). */
  dispatchInvariantViolation(): string | undefined {
    return this.dispatcher?.invariantViolation();
  }

  /** The dispatcher's counts: samples submitted, pending, acquiring, running and settled. */
  dispatchAccounting(): DispatchAccounting | undefined {
    return this.dispatcher?.accounting();
  }

  async start(): Promise<void> {
    const o = this.options;
    this.redis = withScripts(
      createRedisConnection(o.redisUrl, { role: 'worker', name: 'tokenmill:inference', logger: this.log }),
    );
    this.bullConnection = createRedisConnection(o.redisUrl, {
      role: 'worker',
      name: 'tokenmill:inference-bull',
      logger: this.log,
    });
    this.pool = new EndpointPool({
      endpoints: o.endpoints,
      concurrency: o.concurrency,
      ...(o.autoConcurrencyTiming === undefined ? {} : { autoConcurrencyTiming: o.autoConcurrencyTiming }),
      requestTimeoutMs: o.requestTimeoutMs,
      ...(o.apiKey === undefined ? {} : { apiKey: o.apiKey }),
      healthCheckIntervalMs: o.healthCheckIntervalMs,
      onChange: () => this.dispatcher?.wake(),
      // Endpoint health goes to Redis, so `status` and the stall watchdog see it from anywhere.
      publish: { redis: this.redis, keys: o.keys, workerId: this.workerId },
      logger: this.log,
    });
    this.dispatcher = new Dispatcher({
      redis: this.redis,
      keys: o.keys,
      pool: this.pool,
      workerId: this.workerId,
      leaseTtlMs: o.leaseTtlMs,
      crashProbationMs: o.crashProbationMs,
      strictBudgetDatasets: o.strictBudgetDatasets,
      budgetMarginSd: o.budgetMarginSd,
      logger: this.log,
    });
    await this.pool.start();
    this.dispatcher.start();
    await this.discover();
    this.feeding = this.feed();
    if (o.datasets === undefined) {
      this.discoverTimer = setInterval(() => {
        void this.discover().catch((e: unknown) => this.log.warn({ err: e }, 'dataset discovery failed'));
      }, DISCOVER_INTERVAL_MS);
      this.discoverTimer.unref();
    }
    this.log.info(
      { endpoints: o.endpoints, concurrency: typeof o.concurrency === 'number' ? o.concurrency : 'auto' },
      'inference worker started',
    );
  }

  private async discover(): Promise<void> {
    const redis = this.redis;
    if (redis === undefined || this.stopped) return;
    const names = this.options.datasets ?? (await redis.smembers(this.options.keys.datasets()));
    for (const name of names) if (!this.workers.has(name)) this.serve(name);
  }

  /** Opens a BullMQ worker on one dataset's queue, in manual mode: jobs are fetched on demand. */
  private serve(dataset: string): void {
    const o = this.options;
    const connection = this.bullConnection;
    if (connection === undefined) throw new AppError('inference worker not started');
    const worker = new Worker<unknown, GenerateBatchResult>(generateQueueName(dataset), null, {
      connection,
      prefix: o.keys.bullPrefix,
      lockDuration: o.lockDurationMs,
      stalledInterval: o.stalledIntervalMs,
      maxStalledCount: 10,
      autorun: false,
    });
    worker.on('error', throttledErrorLog(this.log, 'queue worker error', { dataset }));
    // Batches of a killed worker go back to the queue once their lock lapses.
    void worker
      .startStalledCheckTimer()
      .catch((e: unknown) => this.log.error({ err: e, dataset }, 'stalled-job checker failed'));
    this.workers.set(dataset, worker);
    this.log.info({ dataset, queue: generateQueueName(dataset) }, 'serving dataset');
  }

  /**
   * Fetches batch jobs whenever the dispatcher runs low on samples ready to send — not when a
   * job finishes: a job stays open until its slowest sample is done, and waiting for that would
   * leave slots idle through every batch's long tail.
   */
  private async feed(): Promise<void> {
    const dispatcher = this.dispatcher;
    if (dispatcher === undefined) return;
    let turn = 0;
    let emptyWaitMs = FIRST_EMPTY_WAIT_MS;
    while (!this.stopped) {
      if (!dispatcher.hungry(this.options.batchSize)) {
        await dispatcher.waitForDemand(250);
        continue;
      }
      // No dataset yet (a producer started with this worker registers them just after): look
      // for them now rather than at the next discovery tick, seconds away.
      if (this.workers.size === 0)
        await this.discover().catch((e: unknown) => this.log.warn({ err: e }, 'dataset discovery failed'));
      const queues = [...this.workers.entries()];
      let fetched = false;
      for (let k = 0; k < queues.length && dispatcher.hungry(this.options.batchSize) && !this.stopped; k += 1) {
        const entry = queues[(turn + k) % queues.length];
        if (entry === undefined) continue;
        const [dataset, worker] = entry;
        // Its budget is reserved by requests in flight: more of its prompts would only wait
        // here and end as skipped; leave them in the queue.
        if (dispatcher.isBlocked(dataset)) continue;
        const token = `${this.workerId}:${randomUUID()}`;
        let job: Job | undefined;
        try {
          job = (await worker.getNextJob(token, { block: false })) as Job | undefined;
        } catch (e: unknown) {
          this.log.warn({ err: e, dataset }, 'could not fetch a batch');
        }
        if (job === undefined || job === null) continue;
        fetched = true;
        this.hold(dataset, worker, job, token);
      }
      turn += 1;
      // Nothing queued anywhere: look again soon, then less often (or as soon as demand
      // changes): the producer's next batch may be milliseconds away (the run's first one, or
      // a window that ran dry while it tokenized).
      if (fetched) emptyWaitMs = FIRST_EMPTY_WAIT_MS;
      else {
        await dispatcher.waitForDemand(emptyWaitMs);
        emptyWaitMs = Math.min(200, emptyWaitMs * 2);
      }
    }
  }

  private hold(dataset: string, worker: Worker, job: Job, token: string): void {
    const { lockDurationMs } = this.options;
    const held: HeldBatch = { job, token, worker, lost: false };
    this.held.add(held);
    const settled = this.process(dataset, held)
      .catch((e: unknown) => this.log.error({ err: e, dataset, jobId: job.id }, 'could not settle a batch'))
      .finally(() => {
        clearInterval(renew);
        this.dispatcher?.forget(token);
        this.held.delete(held);
        this.settling.delete(settled);
      });
    this.settling.add(settled);
    // The job's lock is ours while its samples run; renew it so long generations never look stalled.
    const renew = setInterval(
      () => {
        void job
          .extendLock(token, lockDurationMs)
          .then((ok) => {
            // 0: the lock is gone — this process or Redis stalled past it, and the batch went back
            // to the queue for another worker. Its samples still waiting here are withdrawn (the
            // new holder sends them); those in flight finish and commit once.
            if (ok === 0 && !held.lost) {
              held.lost = true;
              held.onLost?.();
              clearInterval(renew);
              const withdrawn = this.dispatcher?.withdraw(token) ?? 0;
              this.log.info(
                { dataset, jobId: job.id, withdrawn },
                'batch lock lost to another worker after a stall; its waiting samples are left to that worker',
              );
            }
          })
          .catch((e: unknown) => this.log.warn({ err: e, jobId: job.id }, 'could not extend a batch lock'));
      },
      Math.max(100, Math.floor(lockDurationMs / 2)),
    );
    renew.unref();
  }

  /** Runs one batch to its end and records the job's outcome (unless the batch was lost meanwhile). */
  private async process(dataset: string, held: HeldBatch): Promise<void> {
    const { job, token } = held;
    const redis = this.redis;
    const dispatcher = this.dispatcher;
    if (redis === undefined || dispatcher === undefined) throw new AppError('inference worker not started');
    const keys = this.options.keys;
    const log = this.log.child({ queue: job.queueName, jobId: job.id, dataset });
    const jobId = String(job.id);
    const report = new BatchReporter(job, log);
    held.onLost = () => report.close();
    let outcome: GenerateBatchOutcome;
    try {
      outcome = await processGenerateBatch(job.data, {
        isDone: async (ds, ids) => (await redis.smismember(keys.done(ds), ...ids)).map((x) => x === 1),
        attemptsSpent: async (ds, ids) => (await redis.hmget(keys.attempts(ds), ...ids)).map((x) => Number(x ?? 0)),
        failures: async (ds, ids) => (await redis.hmget(keys.failed(ds), ...ids)).map(parseFailureRecord),
        claimFailed: async (ds, ids) =>
          (await redis.claimFailed(keys.done(ds), keys.failed(ds), keys.attempts(ds), jobId, ...ids)).map(Number),
        releaseClaims: async (ds, ids) => void (await redis.releaseClaims(keys.failed(ds), jobId, ...ids)),
        submit: (req) => dispatcher.submit({ ...req, owner: token }),
        conversationEnded: (ds, id) => dispatcher.conversationEnded(ds, id),
        ...(this.options.tokenizer === undefined
          ? {}
          : { conversations: conversationStore(redis, keys, async () => await this.options.tokenizer!) }),
        jobId,
        // The job's lock still ours: BullMQ's lock key holds the token of the worker that has the job.
        stillHeld: async () => !held.lost && (await redis.get(`${job.queueQualifiedName}:${jobId}:lock`)) === token,
        progress: (p) => report.progress(p),
        log: (line) => report.line(line),
        logger: log,
      });
    } catch (e: unknown) {
      await report.flush();
      if (held.lost) return;
      const err = batchJobError(e);
      log.warn({ err: e }, 'batch failed');
      await job.moveToFailed(err, token, false);
      return;
    }
    await report.flush();
    // Another worker holds the job now: it records the outcome.
    if (held.lost) return;
    if (outcome.handedBack > 0) {
      // Stopping: the job goes back to the queue without spending an attempt; the next
      // worker skips the samples this one committed.
      log.info({ handedBack: outcome.handedBack }, 'batch handed back');
      await job.moveToWait(token);
      return;
    }
    const { committed, duplicates, alreadyDone, failed, skippedByBudget, outputTokens } = outcome;
    if (outcome.failures.length > 0) {
      await failBatchJob(job, token, outcome, this.log);
      return;
    }
    await job.moveToCompleted(
      { committed, duplicates, alreadyDone, failed, skippedByBudget, outputTokens },
      token,
      false,
    );
  }

  /**
   * Stops cleanly: stop fetching jobs, let requests in flight finish for `graceMs` (then
   * abort them and hand their samples back), close the queue workers, then Redis.
   */
  async stop(graceMs = 10_000): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.discoverTimer);
    // 1. No new batches.
    await this.feeding;
    // 2. Requests in flight: finish within the grace period, or abort and hand back; every
    //    batch this process holds is then completed or moved back to the queue.
    await this.dispatcher?.stop(graceMs);
    await Promise.all([...this.settling]);
    await Promise.all([...this.workers.values()].map((w) => w.close()));
    // 3. Endpoints (HTTP pools), then 4. Redis connections.
    await this.pool?.stop();
    if (this.redis !== undefined) await closeRedisConnection(this.redis);
    if (this.bullConnection !== undefined) await closeRedisConnection(this.bullConnection);
    this.log.info('inference worker stopped');
  }
}
