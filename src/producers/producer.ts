import { mkdir, open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  AppError,
  ProcessLock,
  GenerateBatchPayloadSchema,
  generateJobOptions,
  generateQueueName,
  logger as componentLogger,
  parsePayload,
  readPromptFile,
  withScripts,
  type ChatTokenizer,
  type DatasetConfig,
  type GenerateBatchPayload,
  type Logger,
  type PromptRecord,
  type RejectedLine,
  type RunKeys,
  type Sample,
  type ScriptedRedis,
} from '../shared/index.js';

export interface ProducerOptions {
  /** A `worker`-role connection (commands wait out Redis restarts rather than fail). */
  redis: Redis;
  keys: RunKeys;
  /** Datasets with `prompts` (generation); datasets with `conversations` are not produced. */
  datasets: readonly DatasetConfig[];
  tokenizer: ChatTokenizer;
  /** `<output.dir>/<run>`: rejects go to `<runDir>/<dataset>/rejects.jsonl`. */
  runDir: string;
  /** Attempts per prompt against a healthy server. */
  maxAttempts: number;
  /** The model's context length, when known: longer prompts are rejected, max_new_tokens capped. */
  contextLength?: number;
  /** Batches kept queued (waiting) per dataset; Redis holds about this many batches of prompts. */
  windowBatches: number;
  /** How often queue depths are checked. */
  pollMs?: number;
  logger?: Logger;
}

/** Prompts checked against Redis at once while scanning a file. */
const SCAN_CHUNK = 256;
const PRODUCER_LOCK_TTL_MS = 30_000;

/**
 * Feeds each dataset's queue from its prompt file (DESIGN invariants 1, 3, 4, 5).
 *
 * - A bounded window: at most `windowBatches` batches wait in a dataset's queue; more are
 *   added as workers take them, so Redis holds O(concurrency) prompts, not the dataset.
 * - Resume: a cursor (the last line enqueued) and an epoch live in Redis. A restarted producer
 *   continues after the cursor; committed and failed samples are never enqueued again. When a
 *   pass reaches the end of the file and the queue drains, a new pass from line 1 picks up
 *   anything not accounted for (a lost batch, samples skipped before a budget was raised); a
 *   full pass that finds nothing means the prompts are exhausted.
 * - Budgets: once a dataset's committed tokens reach its budget, nothing more is enqueued, its
 *   waiting batches are removed and their samples recorded as skipped by budget.
 */
export class Producer {
  private readonly log: Logger;
  private readonly redis: ScriptedRedis;
  private readonly queues = new Map<string, Queue>();
  private readonly feeders: Promise<void>[] = [];
  private readonly lock: ProcessLock;
  private stopping = false;
  private readonly pollMs: number;

  constructor(private readonly options: ProducerOptions) {
    this.log = options.logger ?? componentLogger('producer');
    this.redis = withScripts(options.redis);
    this.pollMs = options.pollMs ?? 200;
    this.lock = new ProcessLock(options.redis, options.keys.producerLock(), PRODUCER_LOCK_TTL_MS, this.log);
  }

  /** Takes the run's producer lock, registers every dataset, and starts feeding them. */
  async start(): Promise<void> {
    const { keys } = this.options;
    if (!(await this.lock.tryAcquire())) {
      throw new AppError(
        `another producer is running for run "${keys.base}" (lock ${keys.producerLock()} held by ${await this.lock.describeHolder()}); stop it first`,
      );
    }
    for (const ds of this.options.datasets) {
      if (ds.prompts === undefined) continue;
      const queue = new Queue(generateQueueName(ds.name), {
        connection: this.options.redis,
        prefix: keys.bullPrefix,
        defaultJobOptions: generateJobOptions,
      });
      queue.on('error', (err) => this.log.error({ err, dataset: ds.name }, 'queue error'));
      this.queues.set(ds.name, queue);
      await this.redis
        .multi()
        .hset(keys.stats(ds.name), 'tokenBudget', ds.tokenBudget ?? -1)
        .sadd(keys.datasets(), ds.name)
        .exec();
    }
    for (const ds of this.options.datasets) {
      const queue = this.queues.get(ds.name);
      if (queue === undefined || ds.prompts === undefined) continue;
      const prompts = ds.prompts;
      this.feeders.push(
        this.feed(ds, prompts, queue).catch((e: unknown) => {
          this.log.error({ err: e, dataset: ds.name }, 'producer failed for dataset');
          throw e;
        }),
      );
    }
  }

  /** Resolves when every dataset is completed (budget met or prompts exhausted), or on stop. */
  async done(): Promise<void> {
    await Promise.all(this.feeders);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await Promise.allSettled(this.feeders);
    await this.lock.release();
    for (const q of this.queues.values()) await q.close();
  }

  private async budgetMet(ds: DatasetConfig): Promise<boolean> {
    if (ds.tokenBudget === undefined) return false;
    const tokens = Number((await this.redis.hget(this.options.keys.stats(ds.name), 'outputTokens')) ?? 0);
    return tokens >= ds.tokenBudget;
  }

  private async feed(ds: DatasetConfig, file: string, queue: Queue): Promise<void> {
    const { keys } = this.options;
    const log = this.log.child({ dataset: ds.name });
    await this.redis.hset(keys.stats(ds.name), 'status', 'in_progress');
    while (!this.stopping) {
      if (await this.budgetMet(ds)) return this.finish(ds, queue, 'budget', log);
      const state = await this.redis.hmget(keys.producer(ds.name), 'epoch', 'line');
      const epoch = Number(state[0] ?? 0);
      const fromLine = Number(state[1] ?? 0);
      const enqueued = await this.pass(ds, file, queue, epoch, fromLine, log);
      if (this.stopping) return;
      await this.waitIdle(ds, queue);
      if (this.stopping) return;
      if (await this.budgetMet(ds)) return this.finish(ds, queue, 'budget', log);
      if (enqueued === 0 && fromLine === 0) return this.finish(ds, queue, 'exhausted', log);
      await this.redis.hset(keys.producer(ds.name), 'epoch', epoch + 1, 'line', 0);
    }
  }

  /** One pass over the file after `fromLine`; returns how many samples it enqueued. */
  private async pass(ds: DatasetConfig, file: string, queue: Queue, epoch: number, fromLine: number, log: Logger): Promise<number> {
    const { keys } = this.options;
    await mkdir(join(this.options.runDir, ds.name), { recursive: true });
    const rejectsFile = await open(join(this.options.runDir, ds.name, 'rejects.jsonl'), 'w');
    let rejected = 0;
    let valid = 0;
    let enqueued = 0;
    let candidates: PromptRecord[] = [];
    let batch: Sample[] = [];
    const reject = async (r: RejectedLine): Promise<void> => {
      rejected += 1;
      await rejectsFile.write(`${JSON.stringify(r)}\n`);
    };
    const flushBatch = async (): Promise<boolean> => {
      if (batch.length === 0) return true;
      const added = await this.addBatch(ds, queue, epoch, batch);
      if (!added) return false;
      enqueued += batch.length;
      batch = [];
      return true;
    };
    const flushCandidates = async (): Promise<boolean> => {
      if (candidates.length === 0) return true;
      const ids = candidates.map((c) => c.id);
      const [done, failed] = await Promise.all([this.redis.smismember(keys.done(ds.name), ...ids), this.redis.hmget(keys.failed(ds.name), ...ids)]);
      for (const [i, rec] of candidates.entries()) {
        if (done[i] === 1 || failed[i] !== null) continue;
        const sample = await this.toSample(ds, rec, file, reject);
        if (sample === undefined) continue;
        batch.push(sample);
        if (batch.length >= ds.batchSize && !(await flushBatch())) return false;
      }
      candidates = [];
      return true;
    };
    try {
      for await (const pl of readPromptFile(file)) {
        if (this.stopping) return enqueued;
        if (!pl.ok) {
          await reject(pl.reject);
          continue;
        }
        valid += 1;
        if (pl.record.line <= fromLine) continue;
        candidates.push(pl.record);
        if (candidates.length >= SCAN_CHUNK && !(await flushCandidates())) return enqueued;
      }
      if (!(await flushCandidates()) || !(await flushBatch())) return enqueued;
      await this.redis.hset(keys.stats(ds.name), 'rejected', rejected, 'prompts', valid);
      log.info({ epoch, fromLine, enqueued, rejected }, 'pass over the prompts done');
      return enqueued;
    } finally {
      await closeQuietly(rejectsFile);
    }
  }

  private async toSample(
    ds: DatasetConfig,
    rec: PromptRecord,
    file: string,
    reject: (r: RejectedLine) => Promise<void>,
  ): Promise<Sample | undefined> {
    let promptIds: number[];
    try {
      promptIds = this.options.tokenizer.encodePrompt(rec.messages);
    } catch (e: unknown) {
      await reject({ file, line: rec.line, id: rec.id, reason: `cannot render the chat template: ${e instanceof Error ? e.message : String(e)}` });
      return undefined;
    }
    const ctx = this.options.contextLength;
    if (ctx !== undefined && promptIds.length >= ctx) {
      await reject({ file, line: rec.line, id: rec.id, reason: `prompt has ${promptIds.length} tokens; the model's context length is ${ctx}` });
      return undefined;
    }
    const maxNewTokens = ctx === undefined ? ds.maxNewTokens : Math.min(ds.maxNewTokens, ctx - promptIds.length);
    return { id: rec.id, line: rec.line, promptIds, maxNewTokens };
  }

  /** Waits for room in the window, then enqueues; false when the budget was met meanwhile. */
  private async addBatch(ds: DatasetConfig, queue: Queue, epoch: number, samples: Sample[]): Promise<boolean> {
    const { keys } = this.options;
    for (;;) {
      if (this.stopping || (await this.budgetMet(ds))) return false;
      const counts = await queue.getJobCounts('waiting', 'prioritized', 'delayed');
      const queued = Object.values(counts).reduce((a, b) => a + b, 0);
      if (queued < this.options.windowBatches) break;
      await delay(this.pollMs);
    }
    const first = samples[0];
    const last = samples[samples.length - 1];
    if (first === undefined || last === undefined) return true;
    const payload: GenerateBatchPayload = parsePayload(
      GenerateBatchPayloadSchema,
      {
        dataset: ds.name,
        batchId: `${ds.name}:e${epoch}:${first.line}-${last.line}`,
        sampling: ds.sampling,
        maxAttempts: this.options.maxAttempts,
        priorExpectedTokens: Math.ceil(ds.maxNewTokens / 2),
        samples,
      },
      'generate batch',
    );
    // A deterministic job id: a producer restarted before saving its cursor adds the same
    // batch again, and BullMQ ignores the second add while the first job exists.
    await queue.add('batch', payload, { jobId: payload.batchId.replace(/:/g, '_') });
    await this.redis
      .multi()
      .srem(keys.skipped(ds.name), ...samples.map((s) => s.id))
      .hset(keys.producer(ds.name), 'line', last.line)
      .exec();
    return true;
  }

  /** Waits until the dataset has nothing queued, running or in flight (or its budget is met). */
  private async waitIdle(ds: DatasetConfig, queue: Queue): Promise<void> {
    while (!this.stopping) {
      if (await this.budgetMet(ds)) return;
      const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'waiting-children');
      const busy = Object.values(counts).reduce((a, b) => a + b, 0);
      if (busy === 0) return;
      await delay(this.pollMs);
    }
  }

  private async finish(ds: DatasetConfig, queue: Queue, reason: 'budget' | 'exhausted', log: Logger): Promise<void> {
    const { keys } = this.options;
    if (reason === 'budget') {
      // Nothing more is sent for this dataset: its queued batches leave the queue, their
      // samples recorded as skipped by budget (a higher budget later enqueues them again).
      const jobs = await queue.getJobs(['waiting', 'prioritized', 'delayed']);
      for (const job of jobs) {
        const ids = (job.data as { samples?: { id: string }[] }).samples?.map((s) => s.id) ?? [];
        try {
          await job.remove();
          if (ids.length > 0) await this.redis.skipSamples(keys.done(ds.name), keys.skipped(ds.name), ...ids);
        } catch (e: unknown) {
          // Taken by a worker meanwhile: the worker skips its samples itself.
          log.debug({ err: e, jobId: job.id }, 'queued batch already taken');
        }
      }
    }
    await this.redis.hset(keys.stats(ds.name), 'status', 'completed', 'completedReason', reason, 'completedAtMs', Date.now());
    log.info({ reason }, 'dataset completed');
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function closeQuietly(f: FileHandle): Promise<void> {
  try {
    await f.close();
  } catch {
    // already closed
  }
}
