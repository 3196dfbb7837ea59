import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import type { Logger } from './logger.js';

/**
 * A lock in Redis held by one process (the producer of a run, the sink of a dataset), renewed
 * while it lives and lapsing `ttlMs` after it dies. A process that finds the lock held by a
 * process of this same machine that no longer exists takes it over at once, so a restart after
 * a crash does not wait for the lapse.
 */
export class ProcessLock {
  private readonly value = `${hostname()}:${process.pid}:${Math.random().toString(36).slice(2, 10)}`;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly key: string,
    private readonly ttlMs: number,
    private readonly log: Logger,
  ) {}

  /** Tries once; true when this process now holds the lock. */
  async tryAcquire(): Promise<boolean> {
    if ((await this.redis.set(this.key, this.value, 'PX', this.ttlMs, 'NX')) === 'OK') return this.held();
    const holder = await this.redis.get(this.key);
    if (holder !== null && isDeadLocalProcess(holder)) {
      this.log.info({ lock: this.key, holder }, 'taking over a lock left by a process that is gone');
      // Compare-and-set: only if the dead holder still has it.
      const swapped = await this.redis.eval(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) else return nil end",
        1,
        this.key,
        holder,
        this.value,
        this.ttlMs,
      );
      if (swapped === 'OK') return this.held();
    }
    return false;
  }

  /** Waits until the lock is ours, checking every `pollMs`; `onWait` is called once if it must wait. */
  async acquire(options: { pollMs?: number; onWait?: (holder: string | null) => void; signal?: AbortSignal } = {}): Promise<boolean> {
    let told = false;
    while (!(options.signal?.aborted ?? false)) {
      if (await this.tryAcquire()) return true;
      if (!told) {
        told = true;
        options.onWait?.(await this.redis.get(this.key));
      }
      await new Promise((r) => setTimeout(r, options.pollMs ?? 500));
    }
    return false;
  }

  private held(): true {
    this.timer = setInterval(() => {
      void this.redis.pexpire(this.key, this.ttlMs).catch((e: unknown) => this.log.warn({ err: e, lock: this.key }, 'lock renewal failed'));
    }, Math.floor(this.ttlMs / 3));
    this.timer.unref();
    return true;
  }

  /** Releases the lock if this process still holds it. */
  async release(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.redis.eval("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end", 1, this.key, this.value).catch(() => undefined);
  }
}

/** Whether a lock value names a process on this machine that no longer runs. */
function isDeadLocalProcess(holder: string): boolean {
  const [host, pidText] = holder.split(':');
  if (host !== hostname()) return false;
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid) return false;
  try {
    process.kill(pid, 0);
    return false;
  } catch (e: unknown) {
    return (e as NodeJS.ErrnoException).code === 'ESRCH';
  }
}
