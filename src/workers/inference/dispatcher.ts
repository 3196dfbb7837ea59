import {
  type BudgetMargins,
  logger as componentLogger,
  type Logger,
  type RunKeys,
  type ScriptedRedis,
} from '../../shared/index.js';
import type { DispatchAccounting } from './dispatch-queue.js';
import type { SampleOutcome, SampleRequest } from './dispatch-types.js';
import type { EndpointPool } from './endpoint-pool.js';
import { LeaseKeeper } from './lease-keeper.js';
import { SlotWantedFlag } from './slot-wanted.js';
import type { RedisPipeline } from './dispatch-acquire.js';
import { EndpointAffinity } from './dispatch-affinity.js';
import { CommitBatcher } from './sample-records.js';
import { StrictBudget } from './budget-strict.js';
import { FailureHandler } from './failure-handling.js';
import { DispatchState } from './dispatch-state.js';
import { RequestRunner } from './dispatch-request.js';
import { DispatchPump } from './dispatch-pump.js';
import { Withdrawals } from './dispatch-withdraw.js';

export type { SampleOutcome, SampleRequest } from './dispatch-types.js';
export type { DispatchAccounting } from './dispatch-queue.js';

/** Commits a dataset needs before its observed lengths replace the prior as a floor (acquire-request.lua ARGV[5]). */
const MIN_COMMITS_FOR_MEAN = 32;
/** Wait before re-sending a sample after a retryable error; doubled with each attempt spent. */
const RETRY_DELAY_MS = 500;

export interface DispatcherOptions {
  redis: ScriptedRedis;
  keys: RunKeys;
  /** The endpoints, with their caps (requests in flight per endpoint over every worker process, fixed or steered). */
  pool: EndpointPool;
  /** Name written into each record's `worker` field. */
  workerId: string;
  /** A request's leases lapse this long after its process stops renewing them (`workers.leaseTtlMs`). */
  leaseTtlMs: number;
  /**
   * How long a prompt on probation (in flight at two server crashes) has its endpoint to
   * itself: no other request starts there meanwhile, so a crash in that window is its own
   * (`workers.crashProbationMs`).
   */
  crashProbationMs: number;
  /**
   * Datasets in `budget: strict`: their requests are streamed, and aborted once the tokens
   * committed plus those produced in flight reach the budget (budget-strict.ts).
   */
  strictBudgetDatasets: readonly string[];
  /** `datasets[].budgetMarginSd` (acquire-request.lua ARGV[10]). */
  budgetMarginSd: BudgetMargins;
  logger?: Logger;
}

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
 *
 * The parts: the samples in line and the requests in flight (dispatch-state.ts), the pump that
 * acquires slots for them (dispatch-pump.ts, acting on the answers in dispatch-answers.ts), one
 * sample's request from send to commit or failure (dispatch-request.ts), and the batches
 * withdrawn after a stall (dispatch-withdraw.ts).
 */
export class Dispatcher {
  private readonly state = new DispatchState();
  private readonly log: Logger;
  private readonly leases: LeaseKeeper;
  private readonly slotWanted: SlotWantedFlag;
  private readonly failures: FailureHandler;
  /** Results finishing together are committed in one round trip. */
  private readonly commits: CommitBatcher;
  private readonly strict: StrictBudget;
  /** Slots held for conversations between turns, and each turn's preferred endpoint first. */
  private readonly affinity = new EndpointAffinity();
  private readonly requests: RequestRunner;
  private readonly pump: DispatchPump;
  private readonly withdrawals: Withdrawals;

  constructor(private readonly options: DispatcherOptions) {
    this.log = options.logger ?? componentLogger('dispatcher');
    const { leaseTtlMs, crashProbationMs } = options;
    const strictDatasets: ReadonlySet<string> = new Set(options.strictBudgetDatasets);
    const { running } = this.state;
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
          const r = running.get(rid);
          if (r !== undefined && !r.settling) void r.endpoint.client.abort(rid);
        }
      },
    });
    this.slotWanted = new SlotWantedFlag(options.redis, options.keys);
    this.leases = new LeaseKeeper({
      redis: options.redis,
      keys: options.keys,
      ttlMs: leaseTtlMs,
      capOf: (r) => this.options.pool.capOf(r.endpoint),
      running: () => running.values(),
      isCurrent: (r) => running.get(r.rid) === r,
      log: this.log,
    });
    this.commits = new CommitBatcher(options.redis, options.keys, (pipeline, freed) =>
      this.pump.rideOnCommits(pipeline as RedisPipeline, freed),
    );
    this.failures = new FailureHandler({
      redis: options.redis,
      keys: options.keys,
      pool: options.pool,
      queue: this.state.queue,
      log: this.log,
      retryDelayMs: RETRY_DELAY_MS,
      isStopping: () => this.state.stopping,
      release: (dataset, rid, leaseKey) => this.requests.release(dataset, rid, leaseKey),
    });
    this.requests = new RequestRunner({
      redis: options.redis,
      keys: options.keys,
      pool: options.pool,
      workerId: options.workerId,
      state: this.state,
      log: this.log,
      strictDatasets,
      strict: this.strict,
      affinity: this.affinity,
      commits: this.commits,
      failures: this.failures,
      schedulePump: () => this.pump.schedule(),
    });
    this.pump = new DispatchPump({
      redis: options.redis,
      pool: options.pool,
      state: this.state,
      log: this.log,
      acquire: {
        keys: options.keys,
        leaseTtlMs,
        minCommitsForMean: MIN_COMMITS_FOR_MEAN,
        crashProbationMs,
        budgetMarginSd: options.budgetMarginSd,
        strictDatasets,
      },
      affinity: this.affinity,
      leases: this.leases,
      slotWanted: this.slotWanted,
      failures: this.failures,
      requests: this.requests,
    });
    this.withdrawals = new Withdrawals(this.state);
  }

  /** Requests this process has in flight. */
  get inFlight(): number {
    return this.state.running.size;
  }

  get queued(): number {
    return this.state.queue.length;
  }

  /** Every sample handed over is pending, acquiring, running or settled — exactly one. */
  accounting(): DispatchAccounting {
    return this.state.queue.accounting();
  }

  /** Why the accounting does not add up, or undefined (what a test asserts under faults). */
  invariantViolation(): string | undefined {
    return this.state.invariantViolation();
  }

  /** Samples that could start as soon as a slot frees (not waiting on a budget or a retry delay). */
  get ready(): number {
    const now = Date.now();
    let n = 0;
    for (const t of this.state.queue.inLine)
      if (!this.state.blockedDatasets.has(t.req.dataset) && t.notBeforeMs <= now) n += 1;
    return n;
  }

  /**
   * Whether more work should be fetched: fewer samples running or ready than the slots of
   * every endpoint plus `reserve`. Fetching on this signal, not per finished job, keeps the
   * slots full while a batch's long tail runs.
   */
  hungry(reserve: number): boolean {
    return !this.state.stopping && this.state.running.size + this.ready < this.options.pool.totalCap() + reserve;
  }

  /** Whether the dataset's budget is reserved by requests in flight, or it is paused (fetching more of it is pointless). */
  isBlocked(dataset: string): boolean {
    return this.state.blockedDatasets.has(dataset);
  }

  /** Resolves when a request ends or a sample leaves the queue (demand may have risen), or after `maxWaitMs`. */
  waitForDemand(maxWaitMs: number): Promise<void> {
    return this.state.waitForDemand(maxWaitMs);
  }

  start(): void {
    this.leases.start();
    this.slotWanted.start();
  }

  /** A conversation ended early (no next turn will come): the slot held for its next turn is freed. */
  conversationEnded(dataset: string, conversationId: string): void {
    this.affinity.release(dataset, conversationId);
  }

  /** Hands a sample over; resolves once it is committed, failed, skipped or handed back. */
  submit(req: SampleRequest): Promise<SampleOutcome> {
    if (this.state.stopping || (req.owner !== undefined && this.withdrawals.has(req.owner)))
      return Promise.resolve({ kind: 'handed-back' });
    const outcome = this.state.queue.submit(req);
    this.pump.schedule();
    return outcome;
  }

  /** Called when endpoint health changes. */
  wake(): void {
    this.pump.schedule();
  }

  /**
   * Stops taking work: pending samples are handed back at once; requests in flight may
   * finish within `graceMs`, then they are aborted (SGLang gets `/abort_request`) and handed back.
   * Nothing is sent once this is called.
   */
  async stop(graceMs: number): Promise<void> {
    const { state } = this;
    state.stopping = true;
    this.pump.cancel();
    for (const t of state.queue.drain()) state.queue.settle(t, { kind: 'handed-back' });
    state.signalDemand();
    if (state.running.size > 0) {
      const idle = state.whenIdle();
      const timer = setTimeout(() => {
        for (const r of state.running.values()) r.abort.abort();
      }, graceMs);
      await idle;
      clearTimeout(timer);
    }
    this.leases.stop();
    this.slotWanted.stop();
    this.strict.stop();
  }

  /**
   * Takes back the samples of one batch that are still waiting (its job was taken over by
   * another worker after a stall): they settle as handed back; those running finish, and any
   * sample the batch submits from now on (a conversation's next turn) is handed back too.
   */
  withdraw(owner: string): number {
    return this.withdrawals.withdraw(owner);
  }

  /** The batch `owner` has settled: nothing more comes from it. */
  forget(owner: string): void {
    this.withdrawals.forget(owner);
  }
}
