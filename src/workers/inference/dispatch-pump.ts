import type { Logger, ScriptedRedis } from '../../shared/index.js';
import {
  addAcquires,
  newAttempts,
  newPass,
  readAcquires,
  type AcquireAttempt,
  type AcquireSettings,
  type PumpPass,
  type RedisPipeline,
} from './dispatch-acquire.js';
import { addRound, staged, stillOpen, type AcquireStage, type EndpointAffinity } from './dispatch-affinity.js';
import { AcquireAnswers } from './dispatch-answers.js';
import type { Task } from './dispatch-queue.js';
import type { RequestRunner } from './dispatch-request.js';
import type { DispatchState } from './dispatch-state.js';
import type { Endpoint, EndpointPool } from './endpoint-pool.js';
import type { FailureHandler } from './failure-handling.js';
import type { LeaseKeeper } from './lease-keeper.js';
import type { SlotWantedFlag } from './slot-wanted.js';

/** What the pump needs from the dispatcher. */
export interface PumpContext {
  redis: ScriptedRedis;
  pool: EndpointPool;
  state: DispatchState;
  log: Logger;
  /** What every acquire-request.lua call is given besides its samples. */
  acquire: AcquireSettings;
  /** Slots held for conversations between turns, and each turn's preferred endpoint first. */
  affinity: EndpointAffinity;
  leases: LeaseKeeper;
  slotWanted: SlotWantedFlag;
  failures: FailureHandler;
  requests: RequestRunner;
}

/**
 * Starts the samples in line as slots free: passes over the line, asking acquire-request.lua
 * for slots in one round trip per stage, and acquires that ride on the commits' round trips.
 * One pass runs at a time; a pass asked for while one runs follows it.
 */
export class DispatchPump {
  private pumping = false;
  private pumpAgain = false;
  private wakeTimer: NodeJS.Timeout | undefined;
  private readonly answers: AcquireAnswers;

  constructor(private readonly ctx: PumpContext) {
    this.answers = new AcquireAnswers({
      redis: ctx.redis,
      keys: ctx.acquire.keys,
      state: ctx.state,
      leases: ctx.leases,
      requests: ctx.requests,
      pumpAgain: () => {
        this.pumpAgain = true;
      },
      schedulePump: (delayMs) => this.schedule(delayMs),
    });
  }

  schedule(delayMs = 0): void {
    if (this.ctx.state.stopping) return;
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

  /** No pass is started by a timer set before now (the dispatcher stops). */
  cancel(): void {
    clearTimeout(this.wakeTimer);
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
      } while (this.pumpAgain && !this.ctx.state.stopping);
    } catch (e: unknown) {
      this.ctx.log.error({ err: e }, 'dispatch failed; retrying shortly');
      this.schedule(500);
    } finally {
      this.pumping = false;
    }
    const broken = this.ctx.state.invariantViolation();
    if (broken !== undefined) this.ctx.log.error(broken);
  }

  /**
   * One pass over the samples waiting, in order. The list changes while a pass awaits Redis
   * (outages put samples back at the front, retries at the back, a stop drains it), so the
   * pass walks a snapshot and takes each sample out by identity once it has a slot.
   */
  private async pumpOnce(): Promise<void> {
    const { state, pool } = this.ctx;
    // Datasets found budget-reserved in this pass; published when the pass has looked at
    // every pending sample (an early return keeps the previous pass's view).
    const pass = newPass();
    const line = state.queue.snapshot();
    let next = 0;
    while (next < line.length) {
      if (state.stopping) return;
      const healthy = pool.healthy();
      if (healthy.length === 0) return; // the pool wakes us when an endpoint is back
      const free = pool.totalCap() - state.running.size - state.acquiring;
      if (free <= 0) return;
      // The next samples that may start, as many as there are free slots: their acquires go to
      // Redis in one round trip. A dataset blocked in the last pass gets one probe per group.
      const plan = this.ctx.affinity.plan(pool.byCap(healthy), state.running.values());
      const batch: Task[] = [];
      while (next < line.length && batch.length < free) {
        const task = line[next] as Task;
        next += 1;
        if (!this.mayStart(task, pass)) continue;
        if (task.chargeOnRecovery) {
          // An endpoint is healthy again after this prompt's probation crash: now it is its attempt.
          state.queue.take(task);
          task.state = 'running';
          await this.ctx.failures.chargeCrash(task);
          continue;
        }
        if (!plan.admit(task.req)) continue; // every free slot is held for a conversation's next turn
        if (state.blockedDatasets.has(task.req.dataset)) pass.probed.add(task.req.dataset);
        batch.push(task);
      }
      pass.retryInMs = Math.min(pass.retryInMs, plan.waitMs);
      if (batch.length === 0) break;
      const attempts = await this.acquireAll(batch, plan.admitted);
      await this.answers.apply(attempts, pass);
      if (pass.failure !== undefined) throw pass.failure;
      if (pass.noSlot) {
        this.ctx.slotWanted.mark();
        this.schedule(25);
        return;
      }
    }
    state.blockedDatasets = pass.blocked;
    if (pass.retryInMs !== Infinity && !state.stopping) this.schedule(Math.max(10, pass.retryInMs));
  }

  /** Whether a sample in line may be asked a slot for in this pass (not blocked, not waiting out a retry delay). */
  private mayStart(task: Task, pass: PumpPass): boolean {
    if (!this.ctx.state.queue.isWaiting(task)) return false;
    const { dataset } = task.req;
    const now = Date.now();
    if (task.notBeforeMs > now) {
      pass.retryInMs = Math.min(pass.retryInMs, task.notBeforeMs - now);
      return false;
    }
    return !pass.blocked.has(dataset) && !pass.probed.has(dataset);
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
        const pipeline = this.ctx.redis.pipeline() as unknown as RedisPipeline;
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
  rideOnCommits(
    pipeline: RedisPipeline,
    freed: number,
  ): ((replies: readonly [Error | null, unknown][] | null) => void) | undefined {
    const { state, pool } = this.ctx;
    if (state.stopping || this.ctx.slotWanted.othersWaiting) return undefined;
    const groups = pool.byCap(pool.healthy());
    if (groups.length === 0) return undefined;
    const want = freed + Math.max(0, pool.totalCap() - state.running.size - state.acquiring);
    const pass = newPass();
    const plan = this.ctx.affinity.plan(groups, state.running.values());
    const batch: Task[] = [];
    for (const task of state.queue.inLine) {
      if (batch.length >= want) break;
      if (task.chargeOnRecovery || !this.mayStart(task, pass) || !plan.admit(task.req)) continue;
      if (state.blockedDatasets.has(task.req.dataset)) pass.probed.add(task.req.dataset);
      batch.push(task);
    }
    pass.retryInMs = Math.min(pass.retryInMs, plan.waitMs);
    if (batch.length === 0) return undefined;
    const attempts = this.beginAcquires(batch);
    const calls = addRound(pipeline, staged(attempts, plan.admitted), 0, this.addAcquires);
    return (replies) => {
      readAcquires(calls, replies);
      this.endAcquires(attempts);
      void this.answers
        .apply(attempts, pass)
        .then(() => {
          for (const d of pass.blocked) state.blockedDatasets.add(d);
          if (pass.failure !== undefined) {
            this.ctx.log.warn({ err: pass.failure }, 'acquiring slots with the commits failed; the pump tries again');
            this.schedule(500);
          } else if (pass.noSlot) {
            // Full in the first stage: the pump asks the others, or waits for a slot.
            this.schedule();
          } else if (pass.retryInMs !== Infinity) {
            this.schedule(Math.max(10, pass.retryInMs));
          }
        })
        .catch((e: unknown) => {
          this.ctx.log.error({ err: e }, 'dispatch failed; retrying shortly');
          this.schedule(500);
        });
    };
  }

  private beginAcquires(batch: Task[]): AcquireAttempt[] {
    this.ctx.state.acquiring += batch.length;
    return newAttempts(batch);
  }

  private endAcquires(attempts: AcquireAttempt[]): void {
    this.ctx.state.acquiring -= attempts.length;
    for (const a of attempts) if (a.task.state === 'acquiring') a.task.state = 'pending';
    this.ctx.affinity.answeredAcquires(attempts.map((a) => a.task.req));
  }

  private readonly addAcquires = (
    pipeline: RedisPipeline,
    attempts: AcquireAttempt[],
    group: Endpoint[],
    cap: number,
  ): AcquireAttempt[][] => addAcquires(pipeline, attempts, group, cap, this.ctx.acquire);
}
