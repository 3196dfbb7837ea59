import {
  AppError,
  UpstreamHttpError,
  decodeAcquire,
  type AcquireOutcome,
  logger as componentLogger,
  type Logger,
  type RunKeys,
  type ScriptedRedis,
} from '../../shared/index.js';
import { DispatchQueue, type DispatchAccounting, type Task } from './dispatch-queue.js';
import type { SampleOutcome, SampleRequest } from './dispatch-types.js';
import type { Endpoint, EndpointPool } from './endpoint-pool.js';
import { LeaseKeeper } from './lease-keeper.js';
import { SlotWantedFlag } from './slot-wanted.js';
import {
  addAcquires,
  newAttempts,
  newPass,
  readAcquires,
  type AcquireAttempt,
  type PumpPass,
  type RedisPipeline,
} from './dispatch-acquire.js';
import { EndpointAffinity, addRound, staged, stillOpen, type AcquireStage } from './dispatch-affinity.js';
import { CommitBatcher, checkOutputVocabulary } from './sample-records.js';
import { StrictBudget } from './budget-strict.js';
import { FailureHandler, type Running } from './failure-handling.js';

export type { SampleOutcome, SampleRequest } from './dispatch-types.js';
export type { DispatchAccounting } from './dispatch-queue.js';

export interface DispatcherOptions {
  redis: ScriptedRedis;
  keys: RunKeys;
  /** The endpoints, with their caps (requests in flight per endpoint over every worker process, fixed or steered). */
  pool: EndpointPool;
  /** Name written into each record's `worker` field. */
  workerId: string;
  /** A request's leases lapse this long after its process stops renewing them. */
  leaseTtlMs?: number;
  /** Commits a dataset needs before its running mean replaces the prior. */
  minCommitsForMean?: number;
  /** Wait before re-sending a sample after a retryable error. */
  retryDelayMs?: number;
  /**
   * How long a prompt on probation (in flight at two server crashes) has its endpoint to
   * itself: no other request starts there meanwhile, so a crash in that window is its own.
   */
  crashProbationMs?: number;
  /**
   * Datasets in `budget: strict`: their requests are streamed, and aborted once the tokens
   * committed plus those produced in flight reach the budget (budget-strict.ts).
   */
  strictBudgetDatasets?: readonly string[];
  /** Per dataset, `datasets[].budgetMarginSd` (acquire-request.lua ARGV[10]); others get the default. */
  budgetMarginSd?: Readonly<Record<string, number>>;
  logger?: Logger;
}

/** A slot an acquire got that is given back unsent: `retry` keeps the sample in line for the next pass. */
interface GiveBack {
  kind: 'give-back';
  endpoint: Endpoint;
  leaseKey: string;
  retry: boolean;
}

/** How often a paused dataset is looked at again (ms): the delay before a resume takes effect. */
const PAUSED_RECHECK_MS = 250;

/**
 * Keeps requests in flight continuously (docs/design.md, invariants 2, 3, 6, 7): the moment one
 * request ends, the next pending sample starts, whatever batch job it came from. Every start goes
 * through `acquire-request.lua`, which enforces the per-endpoint cap across all worker processes
 * and the dataset's token budget; every result goes through `commit-sample-9.lua`.
 *
 * An endpoint that is down costs a sample nothing: the sample goes back to the front of the
 * queue and waits for a healthy endpoint. Attempts are spent only against a healthy server.
 *
 * A prompt that crashes the server would otherwise look like an outage forever. A sample in
 * flight when the server dropped its connections is counted (`crashes`); after two, it is sent
 * on probation — alone on its endpoint for `crashProbationMs` — and a crash then is charged to
 * it as an attempt once an endpoint is healthy again. Innocent bystanders of a crash are never
 * charged: they survive their probation.
 */
export class Dispatcher {
  private readonly queue = new DispatchQueue();
  private readonly running = new Map<string, Running>();
  private readonly log: Logger;
  private readonly leaseTtlMs: number;
  private readonly minCommitsForMean: number;
  private readonly retryDelayMs: number;
  private readonly crashProbationMs: number;
  private pumping = false;
  private pumpAgain = false;
  /** Samples whose acquire is on its way to Redis (they take slots once answered). */
  private acquiring = 0;
  private wakeTimer: NodeJS.Timeout | undefined;
  private readonly leases: LeaseKeeper;
  private readonly slotWanted: SlotWantedFlag;
  private stopping = false;
  private idleWaiters: (() => void)[] = [];
  private demandWaiters: (() => void)[] = [];
  /** Datasets whose budget is reserved by requests in flight, or paused (their samples wait). */
  private blockedDatasets = new Set<string>();
  private readonly failures: FailureHandler;
  /** Results finishing together are committed in one round trip. */
  private readonly commits: CommitBatcher;
  private readonly strictDatasets: ReadonlySet<string>;
  private readonly strict: StrictBudget;
  /** Slots held for conversations between turns, and each turn's preferred endpoint first. */
  private readonly affinity = new EndpointAffinity();
  /**
   * Batches (their lock tokens) lost to another worker: a sample they submit later — a
   * conversation's next turn — is handed back at once, so the new holder alone drives it.
   */
  private readonly withdrawn = new Set<string>();

  constructor(private readonly options: DispatcherOptions) {
    this.log = options.logger ?? componentLogger('dispatcher');
    this.leaseTtlMs = options.leaseTtlMs ?? 30_000;
    this.minCommitsForMean = options.minCommitsForMean ?? 32;
    this.retryDelayMs = options.retryDelayMs ?? 500;
    this.crashProbationMs = options.crashProbationMs ?? 5_000;
    this.strictDatasets = new Set(options.strictBudgetDatasets ?? []);
    this.strict = new StrictBudget({
      redis: options.redis,
      keys: options.keys,
      log: this.log,
      onStop: (dataset, rids) => {
        this.log.info(
          { dataset, aborting: rids.length },
          'strict budget met by the tokens committed and in flight: aborting its requests in flight, keeping their partial outputs',
        );
        for (const rid of rids) {
          const r = this.running.get(rid);
          if (r !== undefined && !r.settling) void r.endpoint.client.abort(rid);
        }
      },
    });
    this.slotWanted = new SlotWantedFlag(options.redis, options.keys);
    this.leases = new LeaseKeeper({
      redis: options.redis,
      keys: options.keys,
      ttlMs: this.leaseTtlMs,
      capOf: (r) => this.options.pool.capOf(r.endpoint),
      running: () => this.running.values(),
      isCurrent: (r) => this.running.get(r.rid) === r,
      log: this.log,
    });
    this.commits = new CommitBatcher(options.redis, options.keys, (pipeline, freed) =>
      this.rideOnCommits(pipeline as RedisPipeline, freed),
    );
    this.failures = new FailureHandler({
      redis: options.redis,
      keys: options.keys,
      pool: options.pool,
      queue: this.queue,
      log: this.log,
      retryDelayMs: this.retryDelayMs,
      isStopping: () => this.stopping,
      release: (dataset, rid, leaseKey) => this.release(dataset, rid, leaseKey),
    });
  }

  /** Requests this process has in flight. */
  get inFlight(): number {
    return this.running.size;
  }

  get queued(): number {
    return this.queue.length;
  }

  /** Every sample handed over is pending, acquiring, running or settled — exactly one. */
  accounting(): DispatchAccounting {
    return this.queue.accounting();
  }

  /** Why the accounting does not add up, or undefined (what a test asserts under faults). */
  invariantViolation(): string | undefined {
    // A request whose answer (or error) is being recorded has already put its sample back or settled it.
    let live = 0;
    for (const r of this.running.values()) if (!r.settling) live += 1;
    return this.queue.invariantViolation(live);
  }

  /** Samples that could start as soon as a slot frees (not waiting on a budget or a retry delay). */
  get ready(): number {
    const now = Date.now();
    let n = 0;
    for (const t of this.queue.inLine) if (!this.blockedDatasets.has(t.req.dataset) && t.notBeforeMs <= now) n += 1;
    return n;
  }

  /**
   * Whether more work should be fetched: fewer samples running or ready than the slots of
   * every endpoint plus `reserve`. Fetching on this signal, not per finished job, keeps the
   * slots full while a batch's long tail runs.
   */
  hungry(reserve: number): boolean {
    return !this.stopping && this.running.size + this.ready < this.options.pool.totalCap() + reserve;
  }

  /** Whether the dataset's budget is reserved by requests in flight, or it is paused (fetching more of it is pointless). */
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
    this.leases.start();
    this.slotWanted.start();
  }

  /** Hands a sample over; resolves once it is committed, failed, skipped or handed back. */
  submit(req: SampleRequest): Promise<SampleOutcome> {
    if (this.stopping || (req.owner !== undefined && this.withdrawn.has(req.owner)))
      return Promise.resolve({ kind: 'handed-back' });
    const outcome = this.queue.submit(req);
    this.schedulePump();
    return outcome;
  }

  /** Called when endpoint health changes. */
  wake(): void {
    this.schedulePump();
  }

  /**
   * Stops taking work: pending samples are handed back at once; requests in flight may
   * finish within `graceMs`, then they are aborted (SGLang gets `/abort_request`) and handed back.
   * Nothing is sent once this is called.
   */
  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    clearTimeout(this.wakeTimer);
    for (const t of this.queue.drain()) this.queue.settle(t, { kind: 'handed-back' });
    this.signalDemand();
    if (this.running.size > 0) {
      const idle = new Promise<void>((r) => this.idleWaiters.push(r));
      const timer = setTimeout(() => {
        for (const r of this.running.values()) r.abort.abort();
      }, graceMs);
      await idle;
      clearTimeout(timer);
    }
    this.leases.stop();
    this.slotWanted.stop();
    this.strict.stop();
  }

  private schedulePump(delayMs = 0): void {
    if (this.stopping) return;
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
    const broken = this.invariantViolation();
    if (broken !== undefined) this.log.error(broken);
  }

  /**
   * One pass over the samples waiting, in order. The list changes while a pass awaits Redis
   * (outages put samples back at the front, retries at the back, a stop drains it), so the
   * pass walks a snapshot and takes each sample out by identity once it has a slot.
   */
  private async pumpOnce(): Promise<void> {
    // Datasets found budget-reserved in this pass; published when the pass has looked at
    // every pending sample (an early return keeps the previous pass's view).
    const pass = newPass();
    const line = this.queue.snapshot();
    let next = 0;
    while (next < line.length) {
      if (this.stopping) return;
      const healthy = this.options.pool.healthy();
      if (healthy.length === 0) return; // the pool wakes us when an endpoint is back
      const free = this.options.pool.totalCap() - this.running.size - this.acquiring;
      if (free <= 0) return;
      // The next samples that may start, as many as there are free slots: their acquires go to
      // Redis in one round trip. A dataset blocked in the last pass gets one probe per group.
      const plan = this.affinity.plan(this.options.pool.byCap(healthy), this.running.values());
      const batch: Task[] = [];
      while (next < line.length && batch.length < free) {
        const task = line[next] as Task;
        next += 1;
        if (!this.mayStart(task, pass)) continue;
        if (task.chargeOnRecovery) {
          // An endpoint is healthy again after this prompt's probation crash: now it is its attempt.
          this.queue.take(task);
          task.state = 'running';
          await this.failures.chargeCrash(task);
          continue;
        }
        if (!plan.admit(task.req)) continue; // every free slot is held for a conversation's next turn
        if (this.blockedDatasets.has(task.req.dataset)) pass.probed.add(task.req.dataset);
        batch.push(task);
      }
      pass.retryInMs = Math.min(pass.retryInMs, plan.waitMs);
      if (batch.length === 0) break;
      const attempts = await this.acquireAll(batch, plan.admitted);
      await this.applyAcquires(attempts, pass);
      if (pass.failure !== undefined) throw pass.failure;
      if (pass.noSlot) {
        this.slotWanted.mark();
        this.schedulePump(25);
        return;
      }
    }
    this.blockedDatasets = pass.blocked;
    if (pass.retryInMs !== Infinity && !this.stopping) this.schedulePump(Math.max(10, pass.retryInMs));
  }

  /** Whether a sample in line may be asked a slot for in this pass (not blocked, not waiting out a retry delay). */
  private mayStart(task: Task, pass: PumpPass): boolean {
    if (!this.queue.isWaiting(task)) return false;
    const { dataset } = task.req;
    const now = Date.now();
    if (task.notBeforeMs > now) {
      pass.retryInMs = Math.min(pass.retryInMs, task.notBeforeMs - now);
      return false;
    }
    return !pass.blocked.has(dataset) && !pass.probed.has(dataset);
  }

  /** Acts on each acquire's answer, in order: sends the samples that got a slot, skips, blocks or settles the others. */
  private async applyAcquires(attempts: AcquireAttempt[], pass: PumpPass): Promise<void> {
    // Every request that got a slot goes out first, before anything here awaits Redis: between
    // an acquire's answer and its request leaving for the server no timer runs, so a budget
    // stop seen meanwhile (strict) or a commit meeting the budget cannot come in between.
    const later: { a: AcquireAttempt; outcome: Exclude<AcquireOutcome, { kind: 'acquired' }> | GiveBack }[] = [];
    for (const a of attempts) {
      if (a.error !== undefined) {
        pass.failure ??= a.error;
        continue;
      }
      const outcome = decodeAcquire(a.code);
      if (outcome.kind !== 'acquired') {
        later.push({ a, outcome });
        continue;
      }
      const { task, rid, probation } = a;
      const { dataset } = task.req;
      // Resumed (or its budget freed): its samples count as ready again, and those this pass passed over go next.
      this.blockedDatasets.delete(dataset);
      if (pass.probed.has(dataset)) this.pumpAgain = true;
      const endpoint = a.group[outcome.endpointIndex];
      const leaseKey = a.leaseKeys[outcome.endpointIndex];
      if (endpoint === undefined || leaseKey === undefined) {
        pass.failure ??= new AppError(`acquire returned endpoint ${outcome.endpointIndex} of ${a.group.length}`);
        continue;
      }
      if (this.leases.expired(a.sentMs)) {
        // Redis answered so late (it froze) that the lease may lapse before its first renewal:
        // the slot goes back and the sample stays in line for the next pass.
        later.push({ a, outcome: { kind: 'give-back', endpoint, leaseKey, retry: true } });
        continue;
      }
      // Stopped, or settled by a drain, while Redis answered: give the slot back, send nothing.
      if (this.stopping || !this.queue.take(task)) {
        later.push({ a, outcome: { kind: 'give-back', endpoint, leaseKey, retry: false } });
        continue;
      }
      this.signalDemand();
      void this.send(task, rid, endpoint, leaseKey, probation, a.sentMs);
    }
    for (const { a, outcome } of later) {
      const { task, rid, probation } = a;
      const { dataset } = task.req;
      switch (outcome.kind) {
        case 'give-back':
          await this.release(dataset, rid, outcome.leaseKey, probation ? outcome.endpoint : undefined);
          if (outcome.retry) this.schedulePump(this.leases.checkMs);
          else if (this.stopping) this.queue.settle(task, { kind: 'handed-back' });
          break;
        case 'no-slot':
          // Another process holds every lease (or a probation runs); they end as requests end.
          pass.noSlot = true;
          break;
        case 'budget-met':
          await this.skipDataset(dataset);
          break;
        case 'budget-reserved':
          pass.blocked.add(dataset);
          pass.retryInMs = Math.min(pass.retryInMs, 200);
          break;
        case 'paused':
          // Paused (tokenmill pause, the dashboard or Bull Board): its samples wait here, the
          // others go on. One acquire per pass looks again, so a resume is seen within this.
          // Published at once (a pass cut short by a full endpoint would not): its samples no
          // longer count as ready, so the worker fetches other datasets' batches to fill the slots.
          pass.blocked.add(dataset);
          if (!this.blockedDatasets.has(dataset)) {
            this.blockedDatasets.add(dataset);
            this.signalDemand();
          }
          pass.retryInMs = Math.min(pass.retryInMs, PAUSED_RECHECK_MS);
          break;
        case 'already-done':
          // Committed by another worker meanwhile (it took over this batch after a stall).
          if (this.queue.isWaiting(task)) this.queue.settle(task, { kind: 'duplicate' });
          this.signalDemand();
          break;
      }
    }
  }

  /**
   * Runs acquire-request.lua for the samples of `batch`, in order, in one pipeline per stage:
   * a turn's preferred endpoint alone, then each cap group (endpoints steered by "auto" may
   * differ); a sample goes on to its next stage only when every endpoint of the last one was
   * full. One call decides a run of samples of one dataset asking the same stage, each exactly
   * as if the calls were sent one after the other.
   */
  private async acquireAll(batch: Task[], stages: (readonly AcquireStage[])[]): Promise<AcquireAttempt[]> {
    const attempts = this.beginAcquires(batch);
    try {
      let open = staged(attempts, stages);
      for (let round = 0; open.length > 0; round += 1) {
        const pipeline = this.options.redis.pipeline() as unknown as RedisPipeline;
        readAcquires(addRound(pipeline, open, round, this.addAcquires), await pipeline.exec());
        open = stillOpen(open, round);
      }
    } finally {
      this.endAcquires(attempts);
    }
    return attempts;
  }

  /**
   * Rides on a commit group's round trip (see {@link CommitBatcher}): after the commits that
   * free `freed` slots, acquires for as many waiting samples (plus any slot free now) go in
   * the same pipeline, so a finished request's slot passes to the next sample in one round
   * trip instead of two. Only the first stage is asked (one endpoint, or the first cap group);
   * the pump handles the rest.
   */
  private rideOnCommits(
    pipeline: RedisPipeline,
    freed: number,
  ): ((replies: readonly [Error | null, unknown][] | null) => void) | undefined {
    if (this.stopping || this.slotWanted.othersWaiting) return undefined;
    const groups = this.options.pool.byCap(this.options.pool.healthy());
    if (groups.length === 0) return undefined;
    const want = freed + Math.max(0, this.options.pool.totalCap() - this.running.size - this.acquiring);
    const pass = newPass();
    const plan = this.affinity.plan(groups, this.running.values());
    const batch: Task[] = [];
    for (const task of this.queue.inLine) {
      if (batch.length >= want) break;
      if (task.chargeOnRecovery || !this.mayStart(task, pass) || !plan.admit(task.req)) continue;
      if (this.blockedDatasets.has(task.req.dataset)) pass.probed.add(task.req.dataset);
      batch.push(task);
    }
    pass.retryInMs = Math.min(pass.retryInMs, plan.waitMs);
    if (batch.length === 0) return undefined;
    const attempts = this.beginAcquires(batch);
    const calls = addRound(pipeline, staged(attempts, plan.admitted), 0, this.addAcquires);
    return (replies) => {
      readAcquires(calls, replies);
      this.endAcquires(attempts);
      void this.applyAcquires(attempts, pass)
        .then(() => {
          for (const d of pass.blocked) this.blockedDatasets.add(d);
          if (pass.failure !== undefined) {
            this.log.warn({ err: pass.failure }, 'acquiring slots with the commits failed; the pump tries again');
            this.schedulePump(500);
          } else if (pass.noSlot) {
            // Full in the first stage: the pump asks the others, or waits for a slot.
            this.schedulePump();
          } else if (pass.retryInMs !== Infinity) {
            this.schedulePump(Math.max(10, pass.retryInMs));
          }
        })
        .catch((e: unknown) => {
          this.log.error({ err: e }, 'dispatch failed; retrying shortly');
          this.schedulePump(500);
        });
    };
  }

  private beginAcquires(batch: Task[]): AcquireAttempt[] {
    this.acquiring += batch.length;
    return newAttempts(batch);
  }

  private endAcquires(attempts: AcquireAttempt[]): void {
    this.acquiring -= attempts.length;
    for (const a of attempts) if (a.task.state === 'acquiring') a.task.state = 'pending';
    this.affinity.answeredAcquires(attempts.map((a) => a.task.req));
  }

  private readonly addAcquires = (
    pipeline: RedisPipeline,
    attempts: AcquireAttempt[],
    group: Endpoint[],
    cap: number,
  ): AcquireAttempt[][] =>
    addAcquires(pipeline, attempts, group, cap, {
      keys: this.options.keys,
      leaseTtlMs: this.leaseTtlMs,
      minCommitsForMean: this.minCommitsForMean,
      crashProbationMs: this.crashProbationMs,
      ...(this.options.budgetMarginSd === undefined ? {} : { budgetMarginSd: this.options.budgetMarginSd }),
      strictDatasets: this.strictDatasets,
    });

  /** The dataset met its budget: every sample of it still pending is skipped by budget. */
  private async skipDataset(dataset: string): Promise<void> {
    const skipped = this.queue.ofDataset(dataset);
    if (skipped.length === 0) return;
    const { keys, redis } = this.options;
    await redis.skipSamples(keys.done(dataset), keys.skipped(dataset), ...skipped.map((t) => t.req.sample.id));
    for (const t of skipped) {
      // Only those still waiting: one may have been drained by a stop meanwhile.
      if (this.queue.isWaiting(t)) this.queue.settle(t, { kind: 'skipped-budget' });
    }
    this.signalDemand();
  }

  private async send(
    task: Task,
    rid: string,
    endpoint: Endpoint,
    leaseKey: string,
    probation: boolean,
    leaseSentMs: number,
  ): Promise<void> {
    const { req } = task;
    const abort = new AbortController();
    const running: Running = {
      task,
      dataset: req.dataset,
      rid,
      endpoint,
      leaseKey,
      abort,
      probation,
      leaseLost: false,
      leaseSentMs,
      settling: false,
    };
    task.state = 'running';
    this.running.set(rid, running);
    endpoint.inFlight += 1;
    if (probation)
      this.log.warn(
        {
          dataset: req.dataset,
          sampleId: req.sample.id,
          line: req.sample.line,
          crashes: task.crashes,
          endpoint: endpoint.url,
        },
        'sending a prompt on probation: it was in flight at every recent server crash',
      );
    const strict = this.strictDatasets.has(req.dataset);
    const onProgress = strict ? this.strict.track(req.dataset, rid) : undefined;
    try {
      const result = await endpoint.client.generate({
        inputIds: req.sample.promptIds,
        maxNewTokens: req.sample.maxNewTokens,
        samplingParams: req.sampling,
        rid,
        signal: abort.signal,
        ...(onProgress === undefined ? {} : { onProgress }),
      });
      running.settling = true;
      // Aborted by the strict budget: the partial output is committed as it is (finish_reason
      // abort); one stopped before it produced anything is skipped by budget instead. A
      // conversation's turn is never committed cut off: its tokens are counted, and the turn is
      // generated again, whole, when the conversation resumes (discard-aborted-turn-5.lua).
      const budgetStopped = strict && this.strict.untrack(rid) && result.finishReason.type === 'abort';
      if (budgetStopped && req.conversation !== undefined && result.completionTokens > 0) {
        const { keys, redis } = this.options;
        const total = await redis.discardAbortedTurn(
          keys.done(req.dataset),
          keys.stats(req.dataset),
          keys.inflight(req.dataset),
          leaseKey,
          keys.skipped(req.dataset),
          req.sample.id,
          result.completionTokens,
          rid,
        );
        this.queue.settle(task, total === -1 ? { kind: 'duplicate' } : { kind: 'skipped-budget' });
        return;
      }
      if (budgetStopped && result.completionTokens === 0) {
        await this.release(req.dataset, rid, leaseKey);
        await this.options.redis.skipSamples(
          this.options.keys.done(req.dataset),
          this.options.keys.skipped(req.dataset),
          req.sample.id,
        );
        this.queue.settle(task, { kind: 'skipped-budget' });
        return;
      }
      if (result.finishReason.type === 'abort' && !budgetStopped) {
        throw new UpstreamHttpError(`SGLang aborted the request: ${JSON.stringify(result.finishReason)}`, {
          retryable: true,
          endpoint: endpoint.url,
        });
      }
      checkOutputVocabulary(result, req.vocabSize, endpoint.url);
      // Before the commit frees the slot (acquires ride on it): held for the conversation's next turn.
      this.affinity.answered(req, endpoint.url);
      const outcome = await this.commits.commit({
        req,
        rid,
        endpointUrl: endpoint.url,
        leaseKey,
        workerId: this.options.workerId,
        result,
      });
      if (task.crashes > 0) await this.options.redis.hdel(this.options.keys.crashes(req.dataset), req.sample.id);
      this.queue.settle(task, outcome);
    } catch (e: unknown) {
      running.settling = true;
      if (e instanceof UpstreamHttpError && e.status === 503) this.options.pool.noteOverload(endpoint);
      await this.failures.handleError(running, e);
    } finally {
      if (strict) this.strict.untrack(rid);
      if (probation) await this.endProbation(endpoint, rid);
      endpoint.inFlight -= 1;
      this.running.delete(rid);
      // A task neither settled nor back in line would be lost: its batch would never end.
      if (task.state === 'running') {
        this.log.error(
          { dataset: req.dataset, sampleId: req.sample.id },
          'request ended without an outcome; handing the sample back',
        );
        this.queue.settle(task, { kind: 'handed-back' });
      }
      if (this.running.size === 0) for (const w of this.idleWaiters.splice(0)) w();
      this.signalDemand();
      this.schedulePump();
    }
  }

  private async release(dataset: string, rid: string, leaseKey: string, probationOn?: Endpoint): Promise<void> {
    await this.options.redis.multi().zrem(this.options.keys.inflight(dataset), rid).zrem(leaseKey, rid).exec();
    if (probationOn !== undefined) await this.endProbation(probationOn, rid);
  }

  private async endProbation(endpoint: Endpoint, rid: string): Promise<void> {
    try {
      await this.options.redis.endProbation(this.options.keys.endpointProbation(endpoint.url), rid);
    } catch (e: unknown) {
      // It lapses by itself after crashProbationMs.
      this.log.warn({ err: e, endpoint: endpoint.url }, 'could not end a probation');
    }
  }

  /** Puts a sample back in line, or hands it back when stopping. */
  private requeue(task: Task, where: 'front' | 'back', notBeforeMs = 0): void {
    this.failures.requeue(task, where, notBeforeMs);
  }

  /**
   * Takes back the samples of one batch that are still waiting (its job was taken over by
   * another worker after a stall): they settle as handed back; those running finish, and any
   * sample the batch submits from now on (a conversation's next turn) is handed back too.
   */
  withdraw(owner: string): number {
    this.withdrawn.add(owner);
    let n = 0;
    for (const t of this.queue.snapshot()) {
      if (t.req.owner === owner && this.queue.isWaiting(t)) {
        this.queue.settle(t, { kind: 'handed-back' });
        n += 1;
      }
    }
    if (n > 0) this.signalDemand();
    return n;
  }

  /** The batch `owner` has settled: nothing more comes from it. */
  forget(owner: string): void {
    this.withdrawn.delete(owner);
  }
}
