import type { SampleOutcome, SampleRequest } from './dispatch-types.js';

/** Where a sample handed to the dispatcher is now. */
export type TaskState = 'pending' | 'acquiring' | 'running' | 'settled';

/** One sample inside the dispatcher, from `submit` until its outcome is settled. */
export interface Task {
  readonly req: SampleRequest;
  state: TaskState;
  /** Earliest time (ms) it may be sent again, after a retryable error. */
  notBeforeMs: number;
  /** Times the server dropped every connection while this sample was in flight (from Redis). */
  crashes: number;
  /**
   * Its request was the one on probation when the server dropped the connection: an attempt
   * is charged once an endpoint is healthy again (a server that never comes back is an
   * outage, not the prompt's fault).
   */
  chargeOnRecovery: boolean;
}

/** Counts that must always add up: `submitted == pending + acquiring + running + settled`. */
export interface DispatchAccounting {
  submitted: number;
  pending: number;
  acquiring: number;
  running: number;
  settled: number;
}

/**
 * The samples waiting for a request slot, and the settle-once bookkeeping of every sample the
 * dispatcher was given. Removal is by identity, never by position: other code paths (an outage
 * putting a sample back at the front, a retry at the back, a stop draining everything) change
 * the list while a pump pass awaits Redis, so a position taken before an await is meaningless
 * after it.
 */
export class DispatchQueue {
  private readonly waiting: Task[] = [];
  private readonly resolvers = new Map<Task, (o: SampleOutcome) => void>();
  private submittedCount = 0;
  private settledCount = 0;

  /** A new task, queued at the back; resolves with its outcome once {@link settle}d. */
  submit(req: SampleRequest): Promise<SampleOutcome> {
    return new Promise((resolve) => {
      const task: Task = { req, state: 'pending', notBeforeMs: 0, crashes: 0, chargeOnRecovery: false };
      this.submittedCount += 1;
      this.resolvers.set(task, resolve);
      this.waiting.push(task);
    });
  }

  get length(): number {
    return this.waiting.length;
  }

  /** The waiting tasks, as of now (a copy: safe to iterate across awaits). */
  snapshot(): Task[] {
    return [...this.waiting];
  }

  /** Whether the task is still waiting (not taken by a request, settled or drained). */
  isWaiting(task: Task): boolean {
    // A task in line is always 'pending', and a 'pending' task is always in line.
    return task.state === 'pending';
  }

  /** Puts a task that was running back in line (front: it waited already; back: a retry). */
  requeue(task: Task, where: 'front' | 'back', notBeforeMs = 0): void {
    if (task.state === 'settled' || task.state === 'pending') return;
    task.state = 'pending';
    task.notBeforeMs = notBeforeMs;
    if (where === 'front') this.waiting.unshift(task);
    else this.waiting.push(task);
  }

  /** Takes the task out of line by identity; false when it is no longer there. */
  take(task: Task): boolean {
    const i = this.waiting.indexOf(task);
    if (i < 0) return false;
    this.waiting.splice(i, 1);
    return true;
  }

  /** Removes and returns every waiting task (a stop). */
  drain(): Task[] {
    return this.waiting.splice(0);
  }

  /** Waiting tasks of one dataset. */
  ofDataset(dataset: string): Task[] {
    return this.waiting.filter((t) => t.req.dataset === dataset);
  }

  /** Resolves the task's promise; only the first call counts. */
  settle(task: Task, outcome: SampleOutcome): void {
    const resolve = this.resolvers.get(task);
    if (resolve === undefined) return;
    this.resolvers.delete(task);
    this.take(task);
    task.state = 'settled';
    this.settledCount += 1;
    resolve(outcome);
  }

  /**
   * The counts. `pending` and `acquiring` samples are in line (an acquiring one awaits Redis
   * for a slot); `running` ones have a request out.
   */
  accounting(): DispatchAccounting {
    let pending = 0;
    let acquiring = 0;
    let running = 0;
    for (const t of this.resolvers.keys()) {
      if (t.state === 'pending') pending += 1;
      else if (t.state === 'acquiring') acquiring += 1;
      else if (t.state === 'running') running += 1;
    }
    return { submitted: this.submittedCount, pending, acquiring, running, settled: this.settledCount };
  }

  /**
   * A description of what does not add up, or undefined when every sample is accounted for:
   * every sample waiting by its state is in line (one that is not would never be sent, and its
   * batch would never end), and every request in flight has a running sample.
   */
  invariantViolation(requestsInFlight: number): string | undefined {
    const a = this.accounting();
    const inLine = this.waiting.length;
    const inLineByState = this.waiting.filter((t) => t.state === 'pending' || t.state === 'acquiring').length;
    if (inLineByState !== inLine || a.pending + a.acquiring !== inLine || a.running < requestsInFlight) {
      return `dispatch accounting broken: submitted ${a.submitted} = pending ${a.pending} + acquiring ${a.acquiring} + running ${a.running} + settled ${a.settled}, but ${inLine} in line (${inLineByState} of them waiting) and ${requestsInFlight} requests in flight`;
    }
    return undefined;
  }

  /** The samples in line, in order, without a copy: do not settle or requeue while iterating. */
  get inLine(): readonly Task[] {
    return this.waiting;
  }
}
