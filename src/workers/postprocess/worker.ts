import { rm } from 'node:fs/promises';
import { hostname } from 'node:os';
import { Job, Queue, UnrecoverableError, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  MERGE_QUEUE,
  TOKENIZE_QUEUE,
  checkDflashMaskToken,
  closeRedisConnection,
  createRedisConnection,
  loadTokenizer,
  logger as componentLogger,
  type ChatTokenizer,
  type PostprocessStageOptions,
  type Logger,
  type MergeJobResult,
  type RunKeys,
  type TokenizeResult,
} from '../../shared/index.js';
import { recordRoundEnd, recordRoundFailure, roundFailure, roundStagingDir, setRoundPhase } from './flow.js';
import { processMerge, processTokenize } from './processor.js';
import { createTokenizeContext, type TokenizeContext } from './tokenize.js';

/** A queue of the post-processing stage. */
export type PostprocessStage = 'tokenize' | 'merge';

/**
 * A post-processing worker's options: the stage's options compiled from the config
 * (`postprocessOptions(config)`, every default applied there) and what this process adds.
 */
export interface PostprocessWorkerOptions extends PostprocessStageOptions {
  redisUrl: string;
  keys: RunKeys;
  /** Queues to serve; absent: both. */
  stages?: readonly PostprocessStage[];
  workerId?: string;
  logger?: Logger;
}

/** Tokenize jobs one process runs at once (they are mostly CPU; one job may use threads). */
const TOKENIZE_JOBS_AT_ONCE = 2;

function flowIdOf(job: Job): string | undefined {
  const data: unknown = job.data;
  if (typeof data !== 'object' || data === null) return undefined;
  const flowId = (data as { flowId?: unknown }).flowId;
  return typeof flowId === 'string' ? flowId : undefined;
}

/** A non-retryable {@link AppError} becomes BullMQ's `UnrecoverableError` (no more attempts). */
function atBoundary(e: unknown): unknown {
  return e instanceof AppError && !e.retryable ? new UnrecoverableError(e.message) : e;
}

/**
 * The post-processing worker (`tokenmill worker --role postprocess`): a BullMQ worker on the
 * `tokenize` queue and one on the `merge` queue of a run. Any number may run, on any machine
 * that sees the run folder and the training dataset; each round's merge runs once (one merge job
 * per round, and the target's lock).
 */
export class PostprocessWorker {
  private readonly log: Logger;
  private readonly workers: Worker[] = [];
  private redis: Redis | undefined;
  private bullConnection: Redis | undefined;
  /** For looking up a round's merge job. */
  private mergeQueue: Queue | undefined;
  private tokenizer: Promise<ChatTokenizer> | undefined;
  /** Tokenize contexts by template variables (JSON; "" for none). */
  private readonly contexts = new Map<string, Promise<TokenizeContext>>();
  private stopped = false;
  /** Failure handlers still running: stop() lets them finish before closing Redis. */
  private readonly pending = new Set<Promise<void>>();
  readonly workerId: string;

  constructor(private readonly options: PostprocessWorkerOptions) {
    this.workerId = options.workerId ?? `${hostname()}:${process.pid}`;
    this.log = options.logger ?? componentLogger('postprocess-worker', { worker: this.workerId });
  }

  async start(): Promise<void> {
    const o = this.options;
    this.redis = createRedisConnection(o.redisUrl, { role: 'worker', name: 'tokenmill:postprocess', logger: this.log });
    this.bullConnection = createRedisConnection(o.redisUrl, {
      role: 'worker',
      name: 'tokenmill:postprocess-bull',
      logger: this.log,
    });
    this.mergeQueue = new Queue(MERGE_QUEUE, { connection: this.redis, prefix: o.keys.bullPrefix });
    const stages = o.stages ?? ['tokenize', 'merge'];
    const common = {
      connection: this.bullConnection,
      prefix: o.keys.bullPrefix,
      lockDuration: o.lockDurationMs,
      stalledInterval: o.stalledIntervalMs,
      maxStalledCount: 3,
    };
    if (stages.includes('tokenize')) {
      const w = new Worker<unknown, TokenizeResult>(TOKENIZE_QUEUE, (job) => this.tokenize(job), {
        ...common,
        concurrency: TOKENIZE_JOBS_AT_ONCE,
      });
      w.on('failed', (job, err) => this.track(this.onFailed('tokenize', job, err)));
      this.workers.push(w);
    }
    if (stages.includes('merge')) {
      const w = new Worker<unknown, MergeJobResult>(MERGE_QUEUE, (job) => this.merge(job), {
        ...common,
        concurrency: 1,
      });
      w.on('failed', (job, err) => this.track(this.onFailed('merge', job, err)));
      this.workers.push(w);
    }
    for (const w of this.workers) w.on('error', (err) => this.log.error({ err, queue: w.name }, 'queue worker error'));
    this.log.info({ stages }, 'post-processing worker started');
  }

  private track(p: Promise<void>): void {
    this.pending.add(p);
    void p.finally(() => this.pending.delete(p));
  }

  private loadTokenizer(): Promise<ChatTokenizer> {
    this.tokenizer ??= loadTokenizer(this.options.tokenizerPath, this.options.tokenizer);
    return this.tokenizer;
  }

  private tokenizeContext(templateKwargs?: Record<string, unknown>): Promise<TokenizeContext> {
    // With server-side tokenization, the few ids the template's format needs are fetched here,
    // once per set of template variables.
    const key = templateKwargs === undefined ? '' : JSON.stringify(templateKwargs);
    let ctx = this.contexts.get(key);
    if (ctx === undefined) {
      ctx = this.loadTokenizer().then((t) =>
        t.withServerTokens(() =>
          createTokenizeContext(t, {
            keepTruncated: this.options.keepTruncated,
            ...(templateKwargs === undefined ? {} : { templateKwargs }),
          }),
        ),
      );
      this.contexts.set(key, ctx);
    }
    return ctx;
  }

  private conn(): Redis {
    if (this.redis === undefined) throw new AppError('post-processing worker not started');
    return this.redis;
  }

  private async tokenize(job: Job): Promise<TokenizeResult> {
    const redis = this.conn();
    const { keys } = this.options;
    const flowId = flowIdOf(job) ?? '';
    try {
      const result = await processTokenize(job.data, {
        tokenizeContext: (kwargs) => this.tokenizeContext(kwargs),
        ...(this.options.tokenizeThreads === undefined ? {} : { tokenizeThreads: this.options.tokenizeThreads }),
        setPhase: (phase, state) => setRoundPhase(redis, keys, flowId, phase, state),
        logger: this.log.child({ queue: job.queueName, jobId: job.id }),
      });
      // A sibling failed the round while this job ran: its rows will not be merged.
      if (await this.roundFailed(job)) await rm(result.stagedDir, { recursive: true, force: true });
      return result;
    } catch (e: unknown) {
      throw atBoundary(e);
    }
  }

  /** Whether the round of a tokenize job has failed (its merge job failed, or is condemned to). */
  private async roundFailed(job: Job): Promise<boolean> {
    const parentId = job.parent?.id;
    if (parentId === undefined || this.mergeQueue === undefined) return false;
    const parent = await Job.fromId(this.mergeQueue, parentId);
    if (parent === undefined) return false;
    return Boolean(parent.deferredFailure) || (await parent.getState()) === 'failed';
  }

  private async merge(job: Job): Promise<MergeJobResult> {
    const redis = this.conn();
    const { keys } = this.options;
    const flowId = flowIdOf(job) ?? '';
    try {
      const tokenizer = await this.loadTokenizer();
      return await processMerge(job.data, {
        childResults: async () => Object.values(await job.getChildrenValues()),
        setPhase: (phase, state) => setRoundPhase(redis, keys, flowId, phase, state),
        roundCompleted: () => recordRoundEnd(redis, keys, flowId, 'completed'),
        ...(tokenizer.encoderKind === 'server' ? {} : { decode: (ids: number[]) => tokenizer.decode(ids) }),
        dflashMaskTokenId: (token: string) => checkDflashMaskToken(tokenizer, token).id,
        logger: this.log.child({ queue: job.queueName, jobId: job.id }),
      });
    } catch (e: unknown) {
      throw atBoundary(e);
    }
  }

  /** A job that failed for good marks its phase (and, for a merge job, its round) failed. */
  private async onFailed(stage: PostprocessStage, job: Job | undefined, err: Error): Promise<void> {
    if (job === undefined || this.redis === undefined) return;
    const log = this.log.child({ queue: job.queueName, jobId: job.id });
    try {
      if ((await job.getState()) !== 'failed') {
        log.warn({ err, attemptsMade: job.attemptsMade }, `${stage} job failed; it will be retried`);
        return;
      }
      const flowId = flowIdOf(job);
      if (flowId === undefined) return;
      const { keys } = this.options;
      if (stage === 'tokenize') {
        log.error({ err, flowId }, 'tokenize job failed: its round fails');
        await setRoundPhase(this.redis, keys, flowId, 'tokenize', 'failed');
        return;
      }
      const failure = await roundFailure(this.redis, keys, job);
      log.error({ reason: failure.reason, flowId }, 'post-process round failed');
      await recordRoundFailure(this.redis, keys, flowId, failure);
      // What the round's finished tokenize jobs staged will not be merged.
      const runDir = (job.data as { runDir?: unknown }).runDir;
      if (typeof runDir === 'string') await rm(roundStagingDir(runDir, flowId), { recursive: true, force: true });
    } catch (e: unknown) {
      if (!this.stopped) log.warn({ err: e }, 'could not record a failed post-processing job');
    }
  }

  /**
   * Stops cleanly: stop taking jobs and let the ones running finish (a tokenize or merge job
   * is bounded; a process killed instead has its jobs retried after the lock lapses), then
   * close the Redis connections.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    // 1. The queue workers: no new jobs, running ones finish.
    await Promise.all(this.workers.map((w) => w.close()));
    // 2. Failures being recorded.
    await Promise.all([...this.pending]);
    // 3. Redis connections.
    await this.mergeQueue?.close();
    if (this.redis !== undefined) await closeRedisConnection(this.redis);
    if (this.bullConnection !== undefined) await closeRedisConnection(this.bullConnection);
    this.log.info('post-processing worker stopped');
  }
}
