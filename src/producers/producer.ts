import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { resolveEvalHoldout } from './eval-holdout.js';
import { batchIdOf } from './batch-id.js';
import {
  MAX_PASSES_WITHOUT_PROGRESS,
  accountedCount,
  finishDataset,
  progressMark,
  stopWithoutProgress,
} from './dataset-end.js';
import { runPass } from './producer-pass.js';
import {
  AppError,
  ProcessLock,
  batchJobName,
  encodeBatchPayload,
  generateJobOptions,
  generateQueueName,
  logger as componentLogger,
  PromptFileIndex,
  throttledErrorLog,
  withScripts,
  type ChatTokenizer,
  type GenerationDataset,
  type GenerateBatchPayload,
  type Logger,
  type ProducerStageOptions,
  type RunKeys,
  type Sample,
  type ScriptedRedis,
  type ToolCallFormat,
  detectToolCallFormat,
  delay,
} from '../shared/index.js';

/**
 * The producer's options: the stage's options compiled from the config
 * (`producerOptions(config)`: the generated datasets with their budgets, the queue window,
 * every default applied there) and what this process adds.
 */
export interface ProducerOptions extends ProducerStageOptions {
  /** A `worker`-role connection (commands wait out Redis restarts rather than fail). */
  redis: Redis;
  keys: RunKeys;
  /** The run's tokenizer, or its load under way (start-up goes on meanwhile; feeding waits for it). */
  tokenizer: ChatTokenizer | Promise<ChatTokenizer>;
  /** `<output.dir>/<run>`: rejects go to `<runDir>/<dataset>/rejects.jsonl`. */
  runDir: string;
  /** The model's context length, when known: longer prompts are rejected, max_new_tokens capped. */
  contextLength?: number | Promise<number | undefined>;
  /** How often queue depths are checked at most (a wait's first checks come sooner). */
  pollMs?: number;
  logger?: Logger;
}

const PRODUCER_LOCK_TTL_MS = 30_000;
/** The first of a wait's polls; each next one waits twice as long, up to `pollMs`. */
const FIRST_POLL_MS = 2;

/**
 * Feeds each dataset's queue from its prompt file (docs/design.md, invariants 1, 3, 4, 5).
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
  /** The context length turn 1 was checked against (for the turns after it, with `turns: all`). */
  private contextLengthSeen: number | undefined;
  private toolCallFormatSeen: ToolCallFormat | undefined;
  private stopping = false;
  private readonly pollMs: number;
  private locked = false;
  /**
   * Rejects (with a `LockLostError`) if the run's producer lock is lost while feeding — a Redis
   * outage or a freeze of this process longer than its TTL let another producer take over.
   * Feeding stops at once; the process running it should end with this error.
   */
  readonly failed: Promise<never>;

  constructor(private readonly options: ProducerOptions) {
    this.log = options.logger ?? componentLogger('producer');
    this.redis = withScripts(options.redis);
    this.pollMs = options.pollMs ?? 200;
    this.lock = new ProcessLock(options.redis, options.keys.producerLock(), PRODUCER_LOCK_TTL_MS, this.log);
    this.failed = new Promise<never>((_, reject) => {
      this.lock.onLost((e) => {
        this.stopping = true;
        this.log.error({ err: e }, 'producer lock lost; stopping the producer');
        reject(e);
      });
    });
    this.failed.catch(() => undefined);
  }

  /**
   * Takes the run's producer lock, or fails at once naming the process that holds it (host,
   * pid, since when). Called by {@link start}; call it first to fail before starting anything else.
   */
  async acquireLock(): Promise<void> {
    if (this.locked) return;
    const { keys } = this.options;
    if (!(await this.lock.tryAcquire())) {
      throw new AppError(
        `another producer is running for run "${keys.base}" (lock ${keys.producerLock()} held by ${await this.lock.describeHolder()}); stop it first`,
      );
    }
    this.locked = true;
  }

  /** Takes the run's producer lock, registers every dataset, and starts feeding them. */
  async start(): Promise<void> {
    const { keys } = this.options;
    await this.acquireLock();
    for (const ds of this.options.datasets) {
      const queue = new Queue(generateQueueName(ds.name), {
        connection: this.options.redis,
        prefix: keys.bullPrefix,
        defaultJobOptions: generateJobOptions,
      });
      queue.on('error', throttledErrorLog(this.log, 'queue error', { dataset: ds.name }));
      this.queues.set(ds.name, queue);
      await this.redis
        .multi()
        .hset(keys.stats(ds.name), 'tokenBudget', ds.tokenBudget)
        .sadd(keys.datasets(), ds.name)
        .exec();
    }
    for (const ds of this.options.datasets) {
      const queue = this.queues.get(ds.name);
      if (queue === undefined) continue;
      this.feeders.push(
        this.feed(ds, ds.prompts, queue).catch((e: unknown) => {
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

  private async budgetMet(ds: GenerationDataset): Promise<boolean> {
    const tokens = Number((await this.redis.hget(this.options.keys.stats(ds.name), 'outputTokens')) ?? 0);
    return tokens >= ds.tokenBudget;
  }

  private async feed(ds: GenerationDataset, file: string, queue: Queue): Promise<void> {
    const { keys } = this.options;
    const log = this.log.child({ dataset: ds.name });
    await this.redis
      .multi()
      .hset(keys.stats(ds.name), 'status', 'in_progress')
      .hdel(keys.stats(ds.name), 'failedReason', 'failedAtMs')
      .exec();
    const tokenizer = await this.options.tokenizer;
    const contextLength = await this.options.contextLength;
    this.contextLengthSeen = contextLength;
    const format = this.options.toolCallFormat;
    this.toolCallFormatSeen = format === 'auto' ? detectToolCallFormat(tokenizer.chatTemplateSource()) : format;
    let index: PromptFileIndex | undefined;
    let heldOut: ReadonlySet<string> | undefined;
    let passesWithoutProgress = 0;
    while (!this.stopping) {
      if (await this.budgetMet(ds))
        return void (await finishDataset(this.redis, this.options.keys, ds, queue, 'budget', '', log));
      const state = await this.redis.hmget(keys.producer(ds.name), 'epoch', 'line', 'retryGen');
      const epoch = Number(state[0] ?? 0);
      const fromLine = Number(state[1] ?? 0);
      const retryGen = state[2] ?? '0';
      if (index === undefined || !(await index.isCurrent())) {
        const startedAt = Date.now();
        index = await PromptFileIndex.build(file, { turns: ds.turns });
        log.info(
          { lines: index.lines, suspects: index.suspects.size, ms: Date.now() - startedAt },
          'prompt file indexed for repeated ids',
        );
        // The eval split: made before the first pass, then read back (and checked against the
        // file whenever it changed); its ids are never enqueued.
        heldOut = (
          await resolveEvalHoldout({
            ds,
            promptsFile: file,
            runDir: this.options.runDir,
            index,
            run: { redis: this.options.redis, keys },
            // Prompts of any dataset with a held-out prompt's content are held out too.
            datasets: this.options.datasets,
            log,
          })
        )?.ids;
      }
      // What proves, after the pass, that every sample it enqueued is accounted for (see
      // below): nothing else queued at its start, and the accounted count before it.
      const quietAtStart = fromLine === 0 && (await this.busyJobs(queue)) === 0;
      const accountedBefore = await accountedCount(this.redis, this.options.keys, ds);
      const progressBefore = await progressMark(this.redis, this.options.keys, ds);
      const result = await runPass({
        redis: this.redis,
        keys,
        ds,
        file,
        index,
        ...(heldOut === undefined ? {} : { heldOut }),
        tokenizer,
        contextLength,
        runDir: this.options.runDir,
        epoch,
        fromLine,
        log,
        isStopping: () => this.stopping,
        addBatch: (samples) => this.addBatch(ds, queue, epoch, samples, tokenizer.vocabSize),
      });
      if (this.stopping) return;
      await this.waitIdle(ds, queue);
      if (this.stopping) return;
      if (await this.budgetMet(ds))
        return void (await finishDataset(this.redis, this.options.keys, ds, queue, 'budget', '', log));
      if (fromLine === 0 && result.complete) {
        // A full pass that found nothing to send: the prompts are exhausted. Or it sent
        // samples, and committed + failed grew by exactly their number while nothing else
        // was queued: each of them is accounted for, and a verification pass (a read of
        // every line) would find nothing. Anything else (a lost batch, samples skipped by the
        // budget, a retry) takes another pass.
        const proven =
          result.enqueued === 0 ||
          (quietAtStart &&
            (await accountedCount(this.redis, this.options.keys, ds)) - accountedBefore === result.enqueued);
        if (proven && (await finishDataset(this.redis, this.options.keys, ds, queue, 'exhausted', retryGen, log)))
          return;
      }
      // Samples were sent and not one of them came to an end (committed, failed, finished): the
      // next pass would send them again, and again. After a few such passes the dataset stops.
      passesWithoutProgress =
        result.enqueued > 0 && (await progressMark(this.redis, this.options.keys, ds)) === progressBefore
          ? passesWithoutProgress + 1
          : 0;
      if (passesWithoutProgress >= MAX_PASSES_WITHOUT_PROGRESS)
        return void (await stopWithoutProgress(
          this.redis,
          this.options.keys,
          ds,
          queue,
          { passes: passesWithoutProgress, enqueued: result.enqueued },
          log,
        ));
      await this.redis.hset(keys.producer(ds.name), 'epoch', epoch + 1, 'line', 0);
    }
  }

  /** Jobs of the dataset queued or being processed. */
  private async busyJobs(queue: Queue): Promise<number> {
    const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'waiting-children');
    return Object.values(counts).reduce((a, b) => a + b, 0);
  }

  /** Waits for room in the window, then enqueues; false when the budget was met meanwhile. */
  private async addBatch(
    ds: GenerationDataset,
    queue: Queue,
    epoch: number,
    samples: Sample[],
    vocabSize: number,
  ): Promise<boolean> {
    const { keys } = this.options;
    // Checked again soon, then less and less often: a fast worker frees a slot within
    // milliseconds (the window must not run dry between polls), a slow one costs few checks.
    for (let wait = FIRST_POLL_MS; ; wait = Math.min(this.pollMs, wait * 2)) {
      if (this.stopping || (await this.budgetMet(ds))) return false;
      const counts = await queue.getJobCounts('waiting', 'prioritized', 'delayed');
      const queued = Object.values(counts).reduce((a, b) => a + b, 0);
      if (queued < this.options.windowBatches) break;
      await delay(wait);
    }
    const first = samples[0];
    const last = samples[samples.length - 1];
    if (first === undefined || last === undefined) return true;
    // Ids and lines first, the prompts' token ids last and compact: what a person sees in Bull Board.
    const payload: GenerateBatchPayload = encodeBatchPayload(
      {
        dataset: ds.name,
        batchId: batchIdOf(ds, epoch, first, last),
        sampling: ds.sampling,
        maxAttempts: this.options.maxAttempts,
        priorExpectedTokens: Math.ceil(ds.maxNewTokens / 2),
        vocabSize,
        templateKwargs: ds.chatTemplateKwargs,
        contextLength: this.contextLengthSeen,
        ...(ds.turns === 'all'
          ? { minNewTokens: ds.minNewTokens, toolCallFormat: this.toolCallFormatSeen, toolExecutor: ds.toolExecutor }
          : {}),
      },
      samples,
    );
    // A deterministic job id: a producer restarted before saving its cursor adds the same
    // batch again, and BullMQ ignores the second add while the first job exists. The name
    // says the dataset and the lines (`B3 lines 1201–1300`).
    await queue.add(batchJobName(ds.name, samples), payload, { jobId: payload.batchId.replace(/:/g, '_') });
    await this.redis
      .multi()
      .srem(keys.skipped(ds.name), ...samples.map((s) => s.id))
      .hset(keys.producer(ds.name), 'line', last.line)
      .exec();
    return true;
  }

  /** Waits until the dataset has nothing queued, running or in flight (or its budget is met). */
  private async waitIdle(ds: GenerationDataset, queue: Queue): Promise<void> {
    // A job that finished restarts the polls from the shortest: the last one may end any moment.
    let wait = FIRST_POLL_MS;
    let lastBusy = Infinity;
    while (!this.stopping) {
      if (await this.budgetMet(ds)) return;
      const busy = await this.busyJobs(queue);
      if (busy === 0) return;
      wait = busy < lastBusy ? FIRST_POLL_MS : Math.min(this.pollMs, wait * 2);
      lastBusy = busy;
      await delay(wait);
    }
  }
}
