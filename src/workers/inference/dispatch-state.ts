import { DispatchQueue } from './dispatch-queue.js';
import type { Running } from './failure-handling.js';

/**
 * What the parts of the dispatcher share: the samples in line, the requests in flight, the
 * acquires on their way, the datasets blocked, whether it is stopping, and the waiters told
 * when a request ends or a sample leaves the queue.
 */
export class DispatchState {
  readonly queue = new DispatchQueue();
  readonly running = new Map<string, Running>();
  /** Samples whose acquire is on its way to Redis (they take slots once answered). */
  acquiring = 0;
  stopping = false;
  /** Datasets whose budget is reserved by requests in flight, or paused (their samples wait). */
  blockedDatasets = new Set<string>();
  private idleWaiters: (() => void)[] = [];
  private demandWaiters: (() => void)[] = [];

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

  signalDemand(): void {
    for (const w of this.demandWaiters.splice(0)) w();
  }

  /** Resolves once {@link signalIdle} is called: the last request in flight has ended. */
  whenIdle(): Promise<void> {
    return new Promise<void>((r) => this.idleWaiters.push(r));
  }

  signalIdle(): void {
    for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Why the accounting does not add up, or undefined (what a test asserts under faults). */
  invariantViolation(): string | undefined {
    // A request whose answer (or error) is being recorded has already put its sample back or settled it.
    let live = 0;
    for (const r of this.running.values()) if (!r.settling) live += 1;
    return this.queue.invariantViolation(live);
  }
}
