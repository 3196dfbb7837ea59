import type { DispatchState } from './dispatch-state.js';

/**
 * Batches (their lock tokens) lost to another worker: a sample they submit later — a
 * conversation's next turn — is handed back at once, so the new holder alone drives it.
 */
export class Withdrawals {
  private readonly withdrawn = new Set<string>();

  constructor(private readonly state: DispatchState) {}

  /** Whether the batch `owner` was withdrawn (and has not settled since). */
  has(owner: string): boolean {
    return this.withdrawn.has(owner);
  }

  /**
   * Takes back the samples of one batch that are still waiting (its job was taken over by
   * another worker after a stall): they settle as handed back; those running finish, and any
   * sample the batch submits from now on (a conversation's next turn) is handed back too.
   */
  withdraw(owner: string): number {
    this.withdrawn.add(owner);
    const { queue } = this.state;
    let n = 0;
    for (const t of queue.snapshot()) {
      if (t.req.owner === owner && queue.isWaiting(t)) {
        queue.settle(t, { kind: 'handed-back' });
        n += 1;
      }
    }
    if (n > 0) this.state.signalDemand();
    return n;
  }

  /** The batch `owner` has settled: nothing more comes from it. */
  forget(owner: string): void {
    this.withdrawn.delete(owner);
  }
}
