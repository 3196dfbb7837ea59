import { randomBytes } from 'node:crypto';
import type { RunKeys, ScriptedRedis } from '../../shared/index.js';

/** How often a worker reads (and at most re-sets) the run's "a worker waits for a slot" flag. */
const POLL_MS = 200;
/** How long that flag holds after the last worker that found no slot set it. */
const TTL_MS = 600;

/**
 * The run's "a worker waits for a slot" flag (`<base>:slot-wanted`). Riding acquires (made in
 * a commit's round trip) keep a freed slot with the worker that freed it; while another worker
 * finds every slot taken with samples waiting, it says so here and the others stop riding, so
 * slots are freed and taken by whoever asks first, as with separate acquires, and no worker
 * starves.
 */
export class SlotWantedFlag {
  /** Another worker found every slot taken with samples waiting, lately. */
  othersWaiting = false;
  /** This dispatcher in the flag (two workers of one process share a worker id). */
  private readonly waiterId = randomBytes(6).toString('hex');
  private timer: NodeJS.Timeout | undefined;
  private setMs = 0;

  constructor(
    private readonly redis: ScriptedRedis,
    private readonly keys: RunKeys,
  ) {}

  private get key(): string {
    return `${this.keys.base}:slot-wanted`;
  }

  start(): void {
    this.timer = setInterval(() => {
      this.redis.get(this.key).then(
        (v) => {
          this.othersWaiting = v !== null && v !== this.waiterId;
        },
        () => undefined,
      );
    }, POLL_MS);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Says (for a short while) that this worker has samples waiting and found no slot. */
  mark(): void {
    const now = Date.now();
    if (now - this.setMs < POLL_MS) return;
    this.setMs = now;
    this.redis.set(this.key, this.waiterId, 'PX', TTL_MS).catch(() => undefined);
  }
}
