import { join } from 'node:path';
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { Producer } from '../producers/index.js';
import { ResultsSink, type SinkCrashPoint } from '../producers/index.js';
import {
  AppError,
  closeRedisConnection,
  createRedisConnection,
  generateQueueName,
  type GenerationDataset,
  inferenceOptions,
  logger,
  postprocessOptions,
  producerOptions,
  type RunKeys,
  WorkerHeartbeat,
} from '../shared/index.js';
import { InferenceWorker } from '../workers/index.js';
import {
  ensurePostprocessRound,
  planPostprocess,
  waitForRound,
  type RoundInfo,
  type RoundOutcome,
} from '../workers/index.js';
import { PostprocessWorker } from '../workers/index.js';
import { resolveContextLength, type RunContext } from './run-context.js';
import { loadRunTokenizer } from './tokenizer-check.js';
import { prepareForRun } from './prepare-run.js';

export interface GenerationOptions {
  /** Run the producer and the sinks (the `produce` verb, and `run`). */
  produce: boolean;
  /** Run an inference worker in this process (the `run` verb). */
  infer: boolean;
  /** Test hook: crash the sink at this point. */
  crashAt?: SinkCrashPoint;
}

/** The generation stage's parts running in this process; `stop()` ends them in order. */
export interface GenerationHandle {
  /** Resolves once every dataset is completed and its results are on disk. */
  finished: Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts the generation stage: producer + results sinks and/or an inference worker, as asked.
 * `finished` resolves when every dataset is completed (budget met or prompts exhausted),
 * nothing is left in flight, and every result has been written to disk.
 */
export async function startGeneration(ctx: RunContext, options: GenerationOptions): Promise<GenerationHandle> {
  const { config, keys } = ctx;
  if (config.sglang.api === 'chat') {
    // Training records must be token-exact (prompt ids + output ids); /v1/chat/completions
    // does not reliably return output ids, so generation runs on /generate.
    throw new AppError(
      'sglang.api: "chat" is not supported for generation yet; use "generate" (token ids in and out, the default)',
    );
  }
  const log = logger('generation', { run: config.run });
  // Each stage's options, compiled once from the config (every default applied in the schema).
  const inference = inferenceOptions(config);
  const production = producerOptions(config);
  const { datasets } = production;
  const conns: Redis[] = [];
  const conn = (name: string): Redis => {
    const c = createRedisConnection(ctx.redisUrl, { role: 'worker', name: `tokenmill:${name}` });
    conns.push(c);
    return c;
  };
  // One load of the run's tokenizer: the producer's, and the worker's for turns after the first.
  let runTokenizer: ReturnType<typeof loadRunTokenizer> | undefined;
  const tokenizerOnce = (): ReturnType<typeof loadRunTokenizer> => {
    runTokenizer ??= loadRunTokenizer(config);
    runTokenizer.catch(() => undefined);
    return runTokenizer;
  };

  let worker: InferenceWorker | undefined;
  if (options.infer) {
    worker = new InferenceWorker({
      ...inference,
      redisUrl: ctx.redisUrl,
      keys,
      ...(inference.turnByTurn ? { tokenizer: tokenizerOnce() } : {}),
    });
  }
  // Start-up runs side by side: the worker connects while the tokenizer loads, the sinks
  // recover while the prompt files are prepared; the producer feeds once its tokenizer is ready.
  const workerStarted = worker?.start();
  workerStarted?.catch(() => undefined);

  let producer: Producer | undefined;
  const sinks: ResultsSink[] = [];
  let sinksStarted: Promise<void> | undefined;
  try {
    if (options.produce) {
      const tokenizer = tokenizerOnce();
      const contextLength = resolveContextLength(config);
      contextLength.catch(() => undefined);
      const producerConn = conn('producer');
      producer = new Producer({
        ...production,
        redis: producerConn,
        keys,
        tokenizer,
        runDir: ctx.runDir,
        contextLength,
      });
      // The producer lock first: a second producer of the same run fails at once, naming the
      // holder, instead of waiting behind the first one's sink locks.
      await producer.acquireLock();
      sinksStarted = startSinks(ctx, datasets, conn, producerConn, options.crashAt, sinks);
      sinksStarted.catch(() => undefined);
      // The datasets' sources become their prompt files before anything reads them.
      await prepareForRun(ctx, await tokenizer);
      await contextLength;
      await sinksStarted;
      await producer.start();
    }
    await workerStarted;
  } catch (e: unknown) {
    // Nothing half-started stays behind: the worker hands back what it took, locks are released.
    await Promise.all([workerStarted?.catch(() => undefined), sinksStarted?.catch(() => undefined)]);
    await worker?.stop(0);
    await producer?.stop();
    for (const s of sinks) await s.stop();
    for (const c of conns) await closeRedisConnection(c);
    throw e;
  }

  // Heartbeats: `status` and the dashboard list this process under each role it plays.
  const heartbeats = [
    ...(options.produce ? [new WorkerHeartbeat({ redis: ctx.redis, keys, role: 'producer' })] : []),
    ...(worker === undefined
      ? []
      : [new WorkerHeartbeat({ redis: ctx.redis, keys, role: 'inference', inFlight: () => worker?.inFlight ?? 0 })]),
  ];
  for (const h of heartbeats) await h.start();

  const finishing = (async () => {
    if (producer === undefined) return new Promise<void>(() => undefined); // a worker runs until stopped
    await producer.done();
    await waitSettled(
      ctx.redis,
      keys,
      datasets.map((d) => d.name),
    );
    for (const s of sinks) await s.drained();
    log.info('generation finished');
  })();
  // A sink or producer that stops on its own (it lost its lock to another process) ends this process with its error.
  const finished = Promise.race([
    finishing,
    ...sinks.map((s) => s.failed),
    ...(producer === undefined ? [] : [producer.failed]),
  ]);

  let stopped = false;
  return {
    finished,
    async stop() {
      if (stopped) return;
      stopped = true;
      // Order: stop taking work (worker, which lets requests in flight finish or hands them
      // back), then the producer, then the sinks (after they wrote what is committed), then Redis.
      await worker?.stop(inference.shutdownGraceMs);
      for (const h of heartbeats) await h.stop();
      await producer?.stop();
      for (const s of sinks) await s.stop();
      for (const c of conns) await closeRedisConnection(c);
    },
  };
}

/**
 * Starts a results sink per dataset, side by side; `started` receives each one that started
 * (for the caller to stop). Rejects with the first failure once every start has settled.
 */
async function startSinks(
  ctx: RunContext,
  datasets: readonly GenerationDataset[],
  conn: (name: string) => Redis,
  probe: Redis,
  crashAt: SinkCrashPoint | undefined,
  started: ResultsSink[],
): Promise<void> {
  const starts = datasets.map(async (ds) => {
    const sink = new ResultsSink({
      redis: conn(`sink-${ds.name}`),
      probe,
      keys: ctx.keys,
      dataset: ds.name,
      dir: join(ctx.runDir, ds.name, 'generations'),
      ...(crashAt === undefined ? {} : { crashAt }),
      notify: (line) => process.stderr.write(`tokenmill: ${line}\n`),
    });
    await sink.start();
    started.push(sink);
  });
  const failure = (await Promise.allSettled(starts)).find((r) => r.status === 'rejected');
  if (failure !== undefined) throw failure.reason;
}

/** The first of {@link waitSettled}'s polls; each next one waits twice as long, up to 200 ms. */
const SETTLED_FIRST_POLL_MS = 2;

/** Waits until no batch is queued or running and no request is in flight for these datasets. */
async function waitSettled(redis: Redis, keys: RunKeys, datasets: readonly string[]): Promise<void> {
  const queues = datasets.map((d) => new Queue(generateQueueName(d), { connection: redis, prefix: keys.bullPrefix }));
  try {
    for (let wait = SETTLED_FIRST_POLL_MS; ; wait = Math.min(200, wait * 2)) {
      let busy = 0;
      for (const [i, q] of queues.entries()) {
        const counts = await q.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
        busy += Object.values(counts).reduce((a, b) => a + b, 0);
        busy += await redis.zcount(keys.inflight(datasets[i] ?? ''), Date.now(), '+inf');
      }
      if (busy === 0) return;
      await new Promise((r) => setTimeout(r, wait));
    }
  } finally {
    for (const q of queues) await q.close();
  }
}

export interface PostprocessOptions {
  /** Run a post-processing worker (tokenize + merge) in this process until the round ends. */
  worker: boolean;
  /** Wait for the round to end (`finished`); without it, `finished` never settles. */
  wait: boolean;
}

/** A post-process round started (or joined) by this process; `stop()` ends what runs here. */
export interface PostprocessHandle {
  round: RoundInfo;
  /** How the round ended: its merge result, or its failure reason. */
  finished: Promise<RoundOutcome>;
  stop(): Promise<void>;
}

/**
 * Starts a post-process round over what is on disk now (tokenize each dataset, then one merge
 * into the training dataset), or joins the round in progress; with `worker`, serves the
 * round's jobs in this process.
 */
export async function startPostprocess(ctx: RunContext, options: PostprocessOptions): Promise<PostprocessHandle> {
  const { config, keys } = ctx;
  let worker: PostprocessWorker | undefined;
  if (options.worker) {
    worker = new PostprocessWorker({ ...postprocessOptions(config), redisUrl: ctx.redisUrl, keys });
    await worker.start();
  }
  let round: RoundInfo;
  try {
    round = await ensurePostprocessRound(ctx.redis, keys, await planPostprocess(config, ctx.runDir));
  } catch (e: unknown) {
    await worker?.stop();
    throw e;
  }
  const abort = new AbortController();
  const finished: Promise<RoundOutcome> = options.wait
    ? waitForRound(ctx.redis, keys, round.flowId, { signal: abort.signal })
    : new Promise<RoundOutcome>(() => undefined);
  let stopped = false;
  return {
    round,
    finished,
    async stop() {
      if (stopped) return;
      stopped = true;
      // Order: stop waiting, then the worker (its running jobs finish), which closes its Redis.
      abort.abort();
      if (options.wait) await finished.catch(() => undefined);
      await worker?.stop();
    },
  };
}
