import { AppError, decodeAcquire, type AcquireOutcome, type RunKeys, type ScriptedRedis } from '../../shared/index.js';
import type { AcquireAttempt, PumpPass } from './dispatch-acquire.js';
import type { RequestRunner } from './dispatch-request.js';
import type { DispatchState } from './dispatch-state.js';
import type { Endpoint } from './endpoint-pool.js';
import type { LeaseKeeper } from './lease-keeper.js';

/** What acting on the acquires' answers needs from the dispatcher. */
export interface AnswerContext {
  redis: ScriptedRedis;
  keys: RunKeys;
  state: DispatchState;
  leases: LeaseKeeper;
  requests: RequestRunner;
  /** Another pump pass once this one ends: samples it passed over may start now. */
  pumpAgain(): void;
  schedulePump(delayMs?: number): void;
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
 * What the dispatcher does with acquire-request.lua's answers, for the pump and for the
 * acquires that ride on commits alike: a slot got is sent at once (or given back), a met
 * budget skips the dataset's samples, a reserved or paused one blocks them.
 */
export class AcquireAnswers {
  constructor(private readonly ctx: AnswerContext) {}

  /** Acts on each acquire's answer, in order: sends the samples that got a slot, skips, blocks or settles the others. */
  async apply(attempts: AcquireAttempt[], pass: PumpPass): Promise<void> {
    const { state } = this.ctx;
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
      state.blockedDatasets.delete(dataset);
      if (pass.probed.has(dataset)) this.ctx.pumpAgain();
      const endpoint = a.group[outcome.endpointIndex];
      const leaseKey = a.leaseKeys[outcome.endpointIndex];
      if (endpoint === undefined || leaseKey === undefined) {
        pass.failure ??= new AppError(`acquire returned endpoint ${outcome.endpointIndex} of ${a.group.length}`);
        continue;
      }
      if (this.ctx.leases.expired(a.sentMs)) {
        // Redis answered so late (it froze) that the lease may lapse before its first renewal:
        // the slot goes back and the sample stays in line for the next pass.
        later.push({ a, outcome: { kind: 'give-back', endpoint, leaseKey, retry: true } });
        continue;
      }
      // Stopped, or settled by a drain, while Redis answered: give the slot back, send nothing.
      if (state.stopping || !state.queue.take(task)) {
        later.push({ a, outcome: { kind: 'give-back', endpoint, leaseKey, retry: false } });
        continue;
      }
      state.signalDemand();
      void this.ctx.requests.send(task, rid, endpoint, leaseKey, probation, a.sentMs);
    }
    for (const { a, outcome } of later) {
      const { task, rid, probation } = a;
      const { dataset } = task.req;
      switch (outcome.kind) {
        case 'give-back':
          await this.ctx.requests.release(dataset, rid, outcome.leaseKey, probation ? outcome.endpoint : undefined);
          if (outcome.retry) this.ctx.schedulePump(this.ctx.leases.checkMs);
          else if (state.stopping) state.queue.settle(task, { kind: 'handed-back' });
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
          if (!state.blockedDatasets.has(dataset)) {
            state.blockedDatasets.add(dataset);
            state.signalDemand();
          }
          pass.retryInMs = Math.min(pass.retryInMs, PAUSED_RECHECK_MS);
          break;
        case 'already-done':
          // Committed by another worker meanwhile (it took over this batch after a stall).
          if (state.queue.isWaiting(task)) state.queue.settle(task, { kind: 'duplicate' });
          state.signalDemand();
          break;
      }
    }
  }

  /** The dataset met its budget: every sample of it still pending is skipped by budget. */
  private async skipDataset(dataset: string): Promise<void> {
    const { queue } = this.ctx.state;
    const skipped = queue.ofDataset(dataset);
    if (skipped.length === 0) return;
    const { keys, redis } = this.ctx;
    await redis.skipSamples(keys.done(dataset), keys.skipped(dataset), ...skipped.map((t) => t.req.sample.id));
    for (const t of skipped) {
      // Only those still waiting: one may have been drained by a stop meanwhile.
      if (queue.isWaiting(t)) queue.settle(t, { kind: 'skipped-budget' });
    }
    this.ctx.state.signalDemand();
  }
}
