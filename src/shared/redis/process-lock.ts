import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import { AppError } from '../errors.js';
import type { Logger } from '../logger.js';
import { delay, isProcessAlive } from '../util/index.js';
import { withScripts, type ScriptedRedis } from './scripts.js';

/** Who holds a lock, read from its value `<host>:<pid>:<sinceMs>:<nonce>`. */
export interface LockHolder {
  /** The lock's value: the holder's fencing token. */
  token: string;
  host: string;
  pid: number | undefined;
  /** When the holder took the lock (ms since the epoch), when the value says. */
  sinceMs: number | undefined;
}

/** Parses a lock value; older values (`<host>:<pid>:<nonce>`) have no `sinceMs`. */
export function parseLockHolder(token: string): LockHolder {
  const [host = '?', pidText, sinceText, nonce] = token.split(':');
  const pid = Number(pidText);
  const sinceMs = nonce === undefined ? undefined : Number(sinceText);
  return {
    token,
    host,
    pid: Number.isInteger(pid) && pid > 0 ? pid : undefined,
    sinceMs: sinceMs !== undefined && Number.isFinite(sinceMs) && sinceMs > 0 ? sinceMs : undefined,
  };
}

/** `host:pid since <ISO time> (<n> s ago)`, for messages to users. */
export function describeLockHolder(holder: LockHolder, nowMs = Date.now()): string {
  const who = `${holder.host}:${holder.pid ?? '?'}`;
  if (holder.sinceMs === undefined) return who;
  return `${who} since ${new Date(holder.sinceMs).toISOString()} (${Math.max(0, Math.round((nowMs - holder.sinceMs) / 1000))} s ago)`;
}

/**
 * This process held a lock and no longer does: it lapsed (a Redis outage or a freeze longer
 * than its TTL) and, possibly, another process took it. Whatever the lock guarded must stop:
 * another process may be doing the same work. Not retryable in this process.
 */
export class LockLostError extends AppError {
  readonly lock: string;
  /** The current holder, when another process holds it now. */
  readonly holder: LockHolder | undefined;

  constructor(lock: string, holder: LockHolder | undefined) {
    super(
      `lost the lock ${lock}: ${holder === undefined ? 'it lapsed (Redis unreachable or this process frozen longer than its TTL)' : `it is now held by ${describeLockHolder(holder)}`}; stopping, since another process may be doing the same work`,
    );
    this.lock = lock;
    this.holder = holder;
  }
}

export interface AcquireOptions {
  pollMs?: number;
  /** Called when it must wait (once, then every `waitReportMs`) with the current holder. */
  onWait?: (holder: LockHolder | undefined) => void;
  /** How often `onWait` is called again while still waiting; default 30 s. */
  waitReportMs?: number;
  signal?: AbortSignal;
}

/**
 * A lock in Redis held by one process (the producer of a run, the sink of a dataset), renewed
 * while it lives and lapsing `ttlMs` after it dies. A process that finds the lock held by a
 * process of this same machine that no longer exists takes it over at once, so a restart after
 * a crash does not wait for the lapse.
 *
 * The lock's value is a fencing token unique to one acquisition. Renewal is compare-and-set:
 * it extends the lock only while it still holds this token, and a renewal that finds another
 * value marks the lock lost ({@link lost}, {@link onLost}). Work the lock guards should call
 * {@link confirm} before each step that must not run twice (it also extends the lock), or pass
 * {@link token} to a Lua script that compares it atomically with the step.
 */
export class ProcessLock {
  private readonly redis: ScriptedRedis;
  private current: string | undefined;
  private timer: NodeJS.Timeout | undefined;
  private renewing = false;
  private lostFlag = false;
  private readonly lostListeners: ((e: LockLostError) => void)[] = [];

  constructor(
    redis: Redis,
    /** The lock's Redis key. */
    readonly key: string,
    private readonly ttlMs: number,
    private readonly log: Logger,
  ) {
    this.redis = withScripts(redis);
  }

  /** The fencing token while this process holds the lock. */
  get token(): string | undefined {
    return this.current;
  }

  /** True once a renewal or {@link confirm} found the lock no longer ours. */
  get lost(): boolean {
    return this.lostFlag;
  }

  get ttl(): number {
    return this.ttlMs;
  }

  /** `listener` runs once when the lock is found lost. */
  onLost(listener: (e: LockLostError) => void): void {
    this.lostListeners.push(listener);
  }

  /** The current holder (any process), or undefined when the lock is free. */
  async holder(): Promise<LockHolder | undefined> {
    const v = await this.redis.get(this.key);
    return v === null ? undefined : parseLockHolder(v);
  }

  /** Who holds the lock, for messages: `host:pid since <time> (<n> s ago)`, or `nobody`. */
  async describeHolder(): Promise<string> {
    const holder = await this.holder();
    return holder === undefined ? 'nobody' : describeLockHolder(holder);
  }

  /** Tries once; true when this process now holds the lock. */
  async tryAcquire(): Promise<boolean> {
    if (this.current !== undefined) return true;
    const token = `${hostname()}:${process.pid}:${Date.now()}:${randomBytes(4).toString('hex')}`;
    if ((await this.redis.set(this.key, token, 'PX', this.ttlMs, 'NX')) === 'OK') return this.held(token);
    const holder = await this.redis.get(this.key);
    if (holder !== null && isDeadLocalProcess(holder)) {
      this.log.info({ lock: this.key, holder }, 'taking over a lock left by a process that is gone');
      if ((await this.redis.lockSwap(this.key, holder, token, this.ttlMs)) === 1) return this.held(token);
    }
    return false;
  }

  /** Waits until the lock is ours, checking every `pollMs`; `onWait` reports who holds it meanwhile. */
  async acquire(options: AcquireOptions = {}): Promise<boolean> {
    let reportedAt: number | undefined;
    while (!(options.signal?.aborted ?? false)) {
      if (await this.tryAcquire()) return true;
      if (reportedAt === undefined || Date.now() - reportedAt >= (options.waitReportMs ?? 30_000)) {
        reportedAt = Date.now();
        options.onWait?.(await this.holder());
      }
      await delay(options.pollMs ?? 500);
    }
    return false;
  }

  /**
   * Checks that this process still holds the lock and extends it by a full TTL (one atomic
   * compare-and-set); throws {@link LockLostError} when it does not.
   */
  async confirm(): Promise<void> {
    const token = this.current;
    if (token === undefined || this.lostFlag)
      throw new LockLostError(this.key, await this.holder().catch(() => undefined));
    if ((await this.redis.lockRenew(this.key, token, this.ttlMs)) !== 1) throw await this.markLost();
  }

  private held(token: string): true {
    this.current = token;
    this.lostFlag = false;
    this.timer = setInterval(() => void this.renew(), Math.max(1, Math.floor(this.ttlMs / 3)));
    this.timer.unref();
    return true;
  }

  private async renew(): Promise<void> {
    const token = this.current;
    // A renewal still waiting (Redis unreachable) is not queued a second time.
    if (token === undefined || this.renewing || this.lostFlag) return;
    this.renewing = true;
    try {
      if ((await this.redis.lockRenew(this.key, token, this.ttlMs)) !== 1) await this.markLost();
    } catch (e: unknown) {
      this.log.warn(
        { err: e, lock: this.key },
        'lock renewal failed; the lock lapses if Redis stays unreachable longer than its TTL',
      );
    } finally {
      this.renewing = false;
    }
  }

  private async markLost(): Promise<LockLostError> {
    const error = new LockLostError(this.key, await this.holder().catch(() => undefined));
    if (this.lostFlag) return error;
    this.lostFlag = true;
    clearInterval(this.timer);
    this.timer = undefined;
    this.log.error({ lock: this.key, holder: error.holder?.token ?? null }, error.message);
    for (const l of this.lostListeners) l(error);
    return error;
  }

  /** Releases the lock if this process still holds it. */
  async release(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    const token = this.current;
    this.current = undefined;
    if (token === undefined) return;
    await this.redis.lockRelease(this.key, token).catch(() => undefined);
  }
}

/** Whether a lock value names a process on this machine that no longer runs. */
function isDeadLocalProcess(value: string): boolean {
  const { host, pid } = parseLockHolder(value);
  if (host !== hostname() || pid === undefined || pid === process.pid) return false;
  return !isProcessAlive(pid);
}
