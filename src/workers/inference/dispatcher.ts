import { randomBytes } from 'node:crypto';
import {
  AppError,
  CancelledError,
  TimeoutError,
  UnavailableError,
  UpstreamHttpError,
  RATE_BUCKETS_KEPT,
  RATE_BUCKET_MS,
  decodeAcquire,
  errorMessage,
  logger as componentLogger,
  type GenerateResult,
  type Logger,
  type RunKeys,
  type Sample,
  type ScriptedRedis,
} from '../../shared/index.js';
import type { Endpoint, EndpointPool } from './endpoint-pool.js';

/** What became of one sample handed to the dispatcher. */
export type SampleOutcome =
  | { kind: 'committed'; completionTokens: number }
  | { kind: 'duplicate' }
  | { kind: 'failed'; reason: string }
  | { kind: 'skipped-budget' }
  | { kind: 'handed-back' };

export interface SampleRequest {
  dataset: string;
  sample: Sample;
  sampling: Record<string, unknown>;
  maxAttempts: number;
  priorExpectedTokens: number;
  /** Attempts already spent on this sample (from Redis), so the record says which attempt won. */
  attemptsSpent: number;
}

export interface DispatcherOptions {
  redis: ScriptedRedis;
  keys: RunKeys;
  pool: EndpointPool;
  /** Requests in flight per endpoint, over all worker processes together. */
  concurrencyPerEndpoint: number;
  /** Name written into each record's `worker` field. */
  workerId: string;
  /** A request's leases lapse this long after its process stops renewing them. */
  leaseTtlMs?: number;
  /** Commits a dataset needs before its running mean replaces the prior. */
  minCommitsForMean?: number;
  /** Wait before re-sending a sample after a retryable error. */
  retryDelayMs?: number;
  logger?: Logger;
}

interface Task {
  req: SampleRequest;
  resolve: (o: SampleOutcome) => void;
  /** Earliest time (ms) it may be sent again, after a retryable error. */
  notBeforeMs: number;
}

interface Running {
  task: Task;
  rid: string;
  endpoint: Endpoint;
  leaseKey: string;
  abort: AbortController;
}

/**
 * Keeps requests in flight continuously (DESIGN invariants 2, 3, 6, 7): the moment one request
 * ends, the next pending sample starts, whatever batch job it came from. Every start goes
 * through `acquire-request.lua`, which enforces the per-endpoint cap across all worker
 * processes and the dataset's token budget; every result goes through `commit-sample.lua`.
 *
 * An endpoint that is down costs a sample nothing: the sample goes back to the front of the
 * queue and waits for a healthy endpoint. Attempts are spent only against a healthy server.
 */
export class Dispatcher {
  private readonly pending: Task[] = [];
  private readonly running = new Map<string, Running>();
  private readonly log: Logger;
  private readonly leaseTtlMs: number;
  private readonly minCommitsForMean: number;
  private readonly retryDelayMs: number;
  private pumping = false;
  private pumpAgain = false;
  private wakeTimer: NodeJS.Timeout | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private stopping = false;
  private idleWaiters: (() => void)[] = [];
  private demandWaiters: (() => void)[] = [];
  /** Datasets whose budget is reserved by requests in flight (their samples wait). */
  private blockedDatasets = new Set<string>();

  constructor(private readonly options: DispatcherOptions) {
    this.log = options.logger ?? componentLogger('dispatcher');
    this.leaseTtlMs = options.leaseTtlMs ?? 30_000;
    this.minCommitsForMean = options.minCommitsForMean ?? 32;
    this.retryDelayMs = options.retryDelayMs ?? 500;
  }

  /** Requests this process has in flight. */
  get inFlight(): number {
    return this.running.size;
  }

  get queued(): number {
    return this.pending.length;
  }

  /** Samples that could start as soon as a slot frees (not waiting on a budget or a retry delay). */
  get ready(): number {
    const now = Date.now();
    let n = 0;
    for (const t of this.pending) if (!this.blockedDatasets.has(t.req.dataset) && t.notBeforeMs <= now) n += 1;
    return n;
  }

  /**
   * Whether more work should be fetched: fewer samples running or ready than the slots of
   * every endpoint plus `reserve`. Fetching on this signal, not per finished job, keeps the
   * slots full while a batch's long tail runs.
   */
  hungry(reserve: number): boolean {
    return !this.stopping && this.running.size + this.ready < this.options.concurrencyPerEndpoint * this.options.pool.all.length + reserve;
  }

  /** Whether the dataset's budget is reserved by requests in flight (fetching more of it is pointless). */
  isBlocked(dataset: string): boolean {
    return this.blockedDatasets.has(dataset);
  }

  /** Resolves when a request ends or a sample leaves the queue (demand may have risen), or after `maxWaitMs`. */
  waitForDemand(maxWaitMs: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, maxWaitMs);
      const waiters = this.demandWaiters;
      function done(): void {
        clearTimeout(timer);
        const i = waiters.indexOf(done);
        if (i >= 0) waiters.splice(i, 1);
        resolve();
      }
      waiters.push(done);
    });
  }

  private signalDemand(): void {
    for (const w of this.demandWaiters.splice(0)) w();
  }

  start(): void {
    this.renewTimer = setInterval(() => {
      void this.renewLeases();
    }, Math.max(50, Math.floor(this.leaseTtlMs / 3)));
    this.renewTimer.unref();
  }

  /** Hands a sample over; resolves once it is committed, failed, skipped or handed back. */
  submit(req: SampleRequest): Promise<SampleOutcome> {
    if (this.stopping) return Promise.resolve({ kind: 'handed-back' });
    return new Promise((resolve) => {
      this.pending.push({ req, resolve, notBeforeMs: 0 });
      this.schedulePump();
    });
  }

  /** Called when endpoint health changes. */
  wake(): void {
    this.schedulePump();
  }

  /**
   * Stops taking work: pending samples are handed back at once; requests in flight may
   * finish within `graceMs`, then they are aborted (SGLang gets `/abort_request`) and handed back.
   */
  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    clearTimeout(this.wakeTimer);
    for (const t of this.pending.splice(0)) t.resolve({ kind: 'handed-back' });
    this.signalDemand();
    if (this.running.size > 0) {
      const idle = new Promise<void>((r) => this.idleWaiters.push(r));
      const timer = setTimeout(() => {
        for (const r of this.running.values()) r.abort.abort();
      }, graceMs);
      await idle;
      clearTimeout(timer);
    }
    clearInterval(this.renewTimer);
  }

  private schedulePump(delayMs = 0): void {
    if (delayMs > 0) {
      if (this.wakeTimer !== undefined) return;
      this.wakeTimer = setTimeout(() => {
        this.wakeTimer = undefined;
        void this.pump();
      }, delayMs);
      return;
    }
    queueMicrotask(() => void this.pump());
  }

  private async pump(): Promise<void> {
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    this.pumping = true;
    try {
      do {
        this.pumpAgain = false;
        await this.pumpOnce();
      } while (this.pumpAgain && !this.stopping);
    } catch (e: unknown) {
      this.log.error({ err: e }, 'dispatch failed; retrying shortly');
      this.schedulePump(500);
    } finally {
      this.pumping = false;
    }
  }

  private async pumpOnce(): Promise<void> {
    const { keys, redis, concurrencyPerEndpoint } = this.options;
    // Datasets found budget-reserved in this pass; published when the pass has looked at
    // every pending sample (an early return keeps the previous pass's view).
    const blocked = new Set<string>();
    let i = 0;
    let retryInMs = Infinity;
    while (!this.stopping && i < this.pending.length) {
      const healthy = this.options.pool.healthy();
      if (healthy.length === 0) return; // the pool wakes us when an endpoint is back
      if (this.running.size >= concurrencyPerEndpoint * this.options.pool.all.length) return;
      const task = this.pending[i];
      if (task === undefined) break;
      const { dataset } = task.req;
      const now = Date.now();
      if (blocked.has(dataset) || task.notBeforeMs > now) {
        if (task.notBeforeMs > now) retryInMs = Math.min(retryInMs, task.notBeforeMs - now);
        i += 1;
        continue;
      }
      const rid = `${dataset}/${task.req.sample.id}#${randomBytes(4).toString('hex')}`;
      const leaseKeys = healthy.map((e) => keys.endpointLeases(e.url));
      const code = await redis.acquireRequest(
        2 + leaseKeys.length,
        keys.stats(dataset),
        keys.inflight(dataset),
        ...leaseKeys,
        rid,
        this.leaseTtlMs,
        task.req.priorExpectedTokens,
        concurrencyPerEndpoint,
        this.minCommitsForMean,
      );
      const outcome = decodeAcquire(code);
      switch (outcome.kind) {
        case 'acquired': {
          this.pending.splice(i, 1);
          this.signalDemand();
          const endpoint = healthy[outcome.endpointIndex];
          const leaseKey = leaseKeys[outcome.endpointIndex];
          if (endpoint === undefined || leaseKey === undefined) throw new AppError(`acquire returned endpoint ${outcome.endpointIndex} of ${healthy.length}`);
          void this.send(task, rid, endpoint, leaseKey);
          break;
        }
        case 'no-slot':
          // Another process holds every lease; they are released as its requests end.
          this.schedulePump(25);
          return;
        case 'budget-met':
          await this.skipDataset(dataset);
          break;
        case 'budget-reserved':
          blocked.add(dataset);
          retryInMs = Math.min(retryInMs, 200);
          i += 1;
          break;
      }
    }
    this.blockedDatasets = blocked;
    if (retryInMs !== Infinity && !this.stopping) this.schedulePump(Math.max(10, retryInMs));
  }

  /** The dataset met its budget: every sample of it still pending is skipped by budget. */
  private async skipDataset(dataset: string): Promise<void> {
    const skipped = this.pending.filter((t) => t.req.dataset === dataset);
    if (skipped.length === 0) return;
    const { keys, redis } = this.options;
    await redis.skipSamples(keys.done(dataset), keys.skipped(dataset), ...skipped.map((t) => t.req.sample.id));
    for (const t of skipped) {
      this.pending.splice(this.pending.indexOf(t), 1);
      t.resolve({ kind: 'skipped-budget' });
    }
    this.signalDemand();
  }

  private async send(task: Task, rid: string, endpoint: Endpoint, leaseKey: string): Promise<void> {
    const { req } = task;
    const abort = new AbortController();
    this.running.set(rid, { task, rid, endpoint, leaseKey, abort });
    endpoint.inFlight += 1;
    try {
      const result = await endpoint.client.generate({
        inputIds: req.sample.promptIds,
        samplingParams: { ...req.sampling, max_new_tokens: req.sample.maxNewTokens },
        rid,
        signal: abort.signal,
      });
      if (result.finishReason.type === 'abort') {
        throw new UpstreamHttpError(`SGLang aborted the request: ${JSON.stringify(result.finishReason)}`, { retryable: true, endpoint: endpoint.url });
      }
      task.resolve(await this.commit(req, rid, endpoint, leaseKey, result));
    } catch (e: unknown) {
      await this.handleError(task, rid, endpoint, leaseKey, e);
    } finally {
      endpoint.inFlight -= 1;
      this.running.delete(rid);
      if (this.running.size === 0) for (const w of this.idleWaiters.splice(0)) w();
      this.signalDemand();
      this.schedulePump();
    }
  }

  private async commit(req: SampleRequest, rid: string, endpoint: Endpoint, leaseKey: string, result: GenerateResult): Promise<SampleOutcome> {
    const { keys, redis } = this.options;
    const { dataset, sample } = req;
    const record = JSON.stringify({
      id: sample.id,
      dataset,
      prompt_ids: sample.promptIds,
      output_ids: result.outputIds,
      prompt_tokens: result.promptTokens,
      completion_tokens: result.completionTokens,
      finish_reason: result.finishReason,
      endpoint: endpoint.url,
      worker: this.options.workerId,
      attempt: req.attemptsSpent + 1,
      ts: new Date().toISOString(),
    });
    const [first] = await redis.commitSample(
      keys.done(dataset),
      keys.stats(dataset),
      keys.results(dataset),
      keys.inflight(dataset),
      leaseKey,
      keys.failed(dataset),
      keys.skipped(dataset),
      keys.attempts(dataset),
      keys.rate(dataset),
      sample.id,
      result.completionTokens,
      record,
      rid,
      RATE_BUCKET_MS,
      RATE_BUCKETS_KEPT,
    );
    return first === 1 ? { kind: 'committed', completionTokens: result.completionTokens } : { kind: 'duplicate' };
  }

  private async release(dataset: string, rid: string, leaseKey: string): Promise<void> {
    await this.options.redis.multi().zrem(this.options.keys.inflight(dataset), rid).zrem(leaseKey, rid).exec();
  }

  private async handleError(task: Task, rid: string, endpoint: Endpoint, leaseKey: string, e: unknown): Promise<void> {
    const { req } = task;
    const { keys, redis, pool } = this.options;
    const log = this.log.child({ dataset: req.dataset, sampleId: req.sample.id, endpoint: endpoint.url });
    try {
      if (e instanceof CancelledError && this.stopping) {
        await this.release(req.dataset, rid, leaseKey);
        task.resolve({ kind: 'handed-back' });
        return;
      }
      if (await this.isOutage(endpoint, e)) {
        // Not the prompt's fault: no attempt spent, it waits for a healthy endpoint.
        await this.release(req.dataset, rid, leaseKey);
        pool.markDown(endpoint, errorMessage(e));
        if (this.stopping) task.resolve({ kind: 'handed-back' });
        else this.pending.unshift(task);
        return;
      }
      const retryable = e instanceof AppError ? e.retryable : true;
      if (retryable) {
        const spent = await redis.spendAttempt(keys.attempts(req.dataset), keys.inflight(req.dataset), leaseKey, req.sample.id, rid);
        req.attemptsSpent = spent;
        if (spent < req.maxAttempts) {
          log.warn({ err: e, attempt: spent }, 'request failed; will retry');
          if (this.stopping) task.resolve({ kind: 'handed-back' });
          else this.pending.push({ ...task, notBeforeMs: Date.now() + this.retryDelayMs * 2 ** (spent - 1) });
          return;
        }
      }
      const reason = retryable ? `failed after ${req.maxAttempts} attempts: ${errorMessage(e)}` : errorMessage(e);
      const failure = JSON.stringify({
        reason,
        status: e instanceof UpstreamHttpError ? e.status : undefined,
        attempts: req.attemptsSpent + (retryable ? 0 : 1),
        endpoint: endpoint.url,
        line: req.sample.line,
        ts: new Date().toISOString(),
      });
      await redis.failSample(keys.done(req.dataset), keys.failed(req.dataset), keys.inflight(req.dataset), leaseKey, keys.attempts(req.dataset), keys.skipped(req.dataset), req.sample.id, failure, rid);
      log.warn({ reason }, 'sample failed');
      task.resolve({ kind: 'failed', reason });
    } catch (inner: unknown) {
      // Redis itself failed: hand the sample back so the job is retried, never lose it.
      log.error({ err: inner }, 'could not record the outcome of a request');
      task.resolve({ kind: 'handed-back' });
    }
  }

  /** Whether an error says the endpoint is down rather than that this request is bad. */
  private async isOutage(endpoint: Endpoint, e: unknown): Promise<boolean> {
    if (e instanceof UnavailableError) return true;
    if (e instanceof UpstreamHttpError && e.status === 503) return true;
    if (e instanceof TimeoutError || (e instanceof UpstreamHttpError && e.retryable)) {
      const h = await endpoint.client.healthGenerate();
      return !h.ok;
    }
    return false;
  }

  private async renewLeases(): Promise<void> {
    if (this.running.size === 0) return;
    const { keys, redis } = this.options;
    const leaseKeys: string[] = [];
    const rids: string[] = [];
    for (const r of this.running.values()) {
      leaseKeys.push(keys.inflight(r.task.req.dataset), r.leaseKey);
      rids.push(r.rid, r.rid);
    }
    try {
      await redis.renewLeases(leaseKeys.length, ...leaseKeys, this.leaseTtlMs, ...rids);
    } catch (e: unknown) {
      this.log.warn({ err: e }, 'lease renewal failed');
    }
  }
}
