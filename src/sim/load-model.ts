/**
 * Continuous-batching load model of an SGLang server, event-driven.
 *
 * Up to `maxRunningRequests` requests hold a slot. A request first prefills (its uncached
 * prompt tokens at `prefillTokensPerSec`), then decodes. With B requests decoding, the batch
 * produces T(B) = peak * B / (B + k) tokens per simulated second, k chosen so that
 * T(1) = singleRequestTokensPerSec; each request advances T(B) / B tokens per second. Requests
 * beyond the slot limit wait in a FIFO queue.
 *
 * Progress is counted in decode steps of work: one a token, unless a job says otherwise
 * (speculative decoding: a verify step costs more than one step and emits several tokens).
 *
 * Nothing ticks per token: whenever B changes, every decoding request's progress is brought
 * up to `now`, and one timer is armed for the next event (a prefill ending or a request
 * finishing). Simulated time runs `timeScale` times faster than the clock.
 */

/** Wall clock and timers; `realClock` in the server, `VirtualClock` in unit tests. */
export interface Clock {
  now(): number;
  setTimer(callback: () => void, delayMs: number): unknown;
  clearTimer(handle: unknown): void;
}

export const realClock: Clock = {
  now: () => performance.now(),
  // Rounded up so that a timer never fires before its event.
  setTimer: (callback, delayMs) => setTimeout(callback, Math.ceil(delayMs)),
  clearTimer: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

/** A clock whose time moves only when told to; runs due timers in time order. */
export class VirtualClock implements Clock {
  private t = 0;
  private seq = 0;
  private readonly timers = new Map<number, { at: number; callback: () => void }>();

  now(): number {
    return this.t;
  }

  setTimer(callback: () => void, delayMs: number): unknown {
    const id = ++this.seq;
    this.timers.set(id, { at: this.t + Math.max(0, delayMs), callback });
    return id;
  }

  clearTimer(handle: unknown): void {
    this.timers.delete(handle as number);
  }

  /** Moves time forward to `targetMs`, firing every timer due on the way. */
  advanceTo(targetMs: number): void {
    for (;;) {
      let nextId: number | undefined;
      let nextAt = Infinity;
      for (const [id, timer] of this.timers) {
        if (timer.at < nextAt) {
          nextAt = timer.at;
          nextId = id;
        }
      }
      if (nextId === undefined || nextAt > targetMs) break;
      const timer = this.timers.get(nextId);
      this.timers.delete(nextId);
      this.t = Math.max(this.t, nextAt);
      timer?.callback();
    }
    this.t = Math.max(this.t, targetMs);
  }

  /** Runs timers until none is left (or `limitMs` of virtual time has passed). */
  runUntilIdle(limitMs = 1e12): void {
    const stopAt = this.t + limitMs;
    while (this.timers.size > 0) {
      let nextAt = Infinity;
      for (const timer of this.timers.values()) nextAt = Math.min(nextAt, timer.at);
      if (nextAt > stopAt) break;
      this.advanceTo(nextAt);
    }
  }

  pendingTimers(): number {
    return this.timers.size;
  }
}

export interface LoadModelConfig {
  maxRunningRequests: number;
  singleRequestTokensPerSec: number;
  peakTokensPerSec: number;
  /**
   * Beyond this many requests decoding, the batch slows down as a server short of KV cache or
   * memory bandwidth does: T(B) is divided by 1 + `declinePerRequest` * (B - this). Default: never.
   */
  declineAboveBatch?: number;
  /** Share of throughput lost per request beyond `declineAboveBatch` (default 0.01). */
  declinePerRequest?: number;
  prefillTokensPerSec: number;
  /** Simulated seconds per wall second. */
  timeScale: number;
}

/** One generation request as the scheduler sees it. */
export interface LoadJob {
  id: string;
  promptTokens: number;
  cachedTokens: number;
  /** Tokens the request will decode before it finishes on its own. */
  outputTokens: number;
  /**
   * What decoding costs, in plain decode steps, when it is not one step a token (speculative
   * decoding, speculative.ts); `tokensAfterWork` then says how many tokens are out after so
   * many steps of work. Default: `outputTokens` steps, one token each.
   */
  decodeWork?: number;
  tokensAfterWork?: (work: number) => number;
  /** Called when the request gets a slot (prefill starts). */
  onStart?: () => void;
  /** Called once when the request has decoded all of `outputTokens`. */
  onFinish: (result: { generatedTokens: number }) => void;
}

export type JobPhase = 'queued' | 'prefill' | 'decode';

interface JobState {
  job: LoadJob;
  phase: JobPhase;
  enqueuedAtMs: number;
  startedAtMs: number;
  prefillEndsAtMs: number;
  /** Decode steps of work done (tokens, unless the job says otherwise). */
  generated: number;
}

/** Decode steps a job costs in all. */
function workOf(job: LoadJob): number {
  return job.decodeWork ?? job.outputTokens;
}

/** Tokens out after `work` decode steps of a job. */
function tokensOf(job: LoadJob, work: number): number {
  const tokens = job.tokensAfterWork === undefined ? Math.floor(work + 1e-9) : job.tokensAfterWork(work);
  return Math.min(job.outputTokens, tokens);
}

/** Tokens decoded between two amounts of work: fractional for plain jobs, as the rate is. */
function tokenDelta(job: LoadJob, fromWork: number, toWork: number): number {
  if (job.tokensAfterWork === undefined) return toWork - fromWork;
  return tokensOf(job, toWork) - tokensOf(job, fromWork);
}

export interface LoadSnapshot {
  running: number;
  queued: number;
  decoding: number;
  /** Total decode throughput now, tokens per simulated second. */
  throughputTokensPerSec: number;
  /** Prompt plus generated tokens held by running requests (the KV cache in use). */
  tokensInUse: number;
}

/** T(B): total decode tokens per simulated second with B requests decoding. */
export function batchThroughput(
  batchSize: number,
  config: Pick<
    LoadModelConfig,
    'singleRequestTokensPerSec' | 'peakTokensPerSec' | 'declineAboveBatch' | 'declinePerRequest'
  >,
): number {
  if (batchSize <= 0) return 0;
  const peak = Math.max(config.peakTokensPerSec, config.singleRequestTokensPerSec);
  const k = peak / config.singleRequestTokensPerSec - 1;
  const t = (peak * batchSize) / (batchSize + k);
  const above = config.declineAboveBatch === undefined ? 0 : batchSize - config.declineAboveBatch;
  return above > 0 ? t / (1 + (config.declinePerRequest ?? 0.01) * above) : t;
}

/** Within this many wall ms of its end, an event counts as reached (avoids 0 ms timer loops). */
const EVENT_SLACK_MS = 0.5;

export class LoadModel {
  private readonly config: LoadModelConfig;
  private readonly clock: Clock;
  private readonly queue: JobState[] = [];
  private queueHead = 0;
  private readonly running = new Map<string, JobState>();
  private decoding = 0;
  private lastAdvanceMs: number;
  private timer: unknown;
  private stopped = false;
  // Time-weighted occupancy since the last reset.
  private occupancyStartMs: number;
  private occupancyLastMs: number;
  private occupancyIntegral = 0;
  private maxRunningObserved = 0;
  /** Tokens decoded by every request since the start, brought up to `lastAdvanceMs` (fractional). */
  private decodedTotal = 0;

  constructor(config: LoadModelConfig, clock: Clock = realClock) {
    if (!(config.maxRunningRequests >= 1)) throw new RangeError('maxRunningRequests must be at least 1');
    if (!(config.singleRequestTokensPerSec > 0)) throw new RangeError('singleRequestTokensPerSec must be > 0');
    if (!(config.prefillTokensPerSec > 0)) throw new RangeError('prefillTokensPerSec must be > 0');
    if (!(config.timeScale > 0)) throw new RangeError('timeScale must be > 0');
    this.config = { ...config };
    this.clock = clock;
    this.lastAdvanceMs = clock.now();
    this.occupancyStartMs = this.lastAdvanceMs;
    this.occupancyLastMs = this.lastAdvanceMs;
  }

  /** Adds a request: it starts now if a slot is free, else it waits in FIFO order. */
  submit(job: LoadJob): void {
    if (this.stopped) throw new Error('load model stopped');
    if (this.has(job.id)) throw new Error(`duplicate job id ${job.id}`);
    const now = this.clock.now();
    this.queue.push({ job, phase: 'queued', enqueuedAtMs: now, startedAtMs: 0, prefillEndsAtMs: 0, generated: 0 });
    this.step();
  }

  has(id: string): boolean {
    return this.running.has(id) || this.findQueued(id) >= 0;
  }

  /**
   * Removes a request now. Returns where it was and how many tokens it had decoded, or
   * undefined when it is unknown (finished already). Its `onFinish` is not called.
   */
  abort(id: string): { phase: JobPhase; generatedTokens: number } | undefined {
    const queuedAt = this.findQueued(id);
    if (queuedAt >= 0) {
      this.queue.splice(queuedAt, 1);
      this.compactQueue();
      return { phase: 'queued', generatedTokens: 0 };
    }
    const state = this.running.get(id);
    if (state === undefined) return undefined;
    this.advance(this.clock.now());
    this.running.delete(id);
    if (state.phase === 'decode') this.decoding--;
    const generatedTokens = tokensOf(state.job, state.generated);
    this.step();
    return { phase: state.phase, generatedTokens };
  }

  /** Where a request is and how many tokens it has decoded so far (for streaming). */
  progress(id: string): { phase: JobPhase; generatedTokens: number } | undefined {
    const state = this.running.get(id);
    if (state === undefined) return this.findQueued(id) >= 0 ? { phase: 'queued', generatedTokens: 0 } : undefined;
    if (state.phase !== 'decode') return { phase: state.phase, generatedTokens: 0 };
    const elapsed = this.clock.now() - this.lastAdvanceMs;
    const generated = state.generated + this.perRequestRatePerMs() * elapsed;
    return { phase: 'decode', generatedTokens: tokensOf(state.job, generated) };
  }

  snapshot(): LoadSnapshot {
    let tokensInUse = 0;
    const elapsed = this.clock.now() - this.lastAdvanceMs;
    const rate = this.perRequestRatePerMs();
    // Tokens per decode step summed over the decoding requests (1 each without speculation).
    let tokensPerStep = 0;
    let speculative = false;
    for (const state of this.running.values()) {
      tokensInUse += state.job.promptTokens;
      if (state.phase !== 'decode') continue;
      tokensInUse += tokensOf(state.job, state.generated + rate * elapsed);
      if (state.job.tokensAfterWork === undefined) tokensPerStep += 1;
      else {
        speculative = true;
        tokensPerStep += state.job.outputTokens / Math.max(workOf(state.job), 1e-9);
      }
    }
    const throughput = batchThroughput(this.decoding, this.config);
    return {
      running: this.running.size,
      queued: this.queue.length - this.queueHead,
      decoding: this.decoding,
      throughputTokensPerSec: speculative ? (throughput / this.decoding) * tokensPerStep : throughput,
      tokensInUse,
    };
  }

  /**
   * Tokens decoded since the start, counted as they are decoded (as SGLang's
   * `sglang:generation_tokens_total` is), so the rate shows at once when the batch changes.
   */
  decodedTokensTotal(): number {
    const work = this.perRequestRatePerMs() * Math.max(0, this.clock.now() - this.lastAdvanceMs);
    let since = 0;
    for (const state of this.running.values()) {
      if (state.phase === 'decode') since += tokenDelta(state.job, state.generated, state.generated + work);
    }
    return this.decodedTotal + since;
  }

  /** Time-weighted mean of running requests since the last reset (wall ms window). */
  occupancy(): { meanRunning: number; windowMs: number; maxRunningObserved: number } {
    const now = this.clock.now();
    const windowMs = now - this.occupancyStartMs;
    const integral = this.occupancyIntegral + this.running.size * (now - this.occupancyLastMs);
    return {
      meanRunning: windowMs > 0 ? integral / windowMs : this.running.size,
      windowMs,
      maxRunningObserved: this.maxRunningObserved,
    };
  }

  resetOccupancy(): void {
    const now = this.clock.now();
    this.occupancyStartMs = now;
    this.occupancyLastMs = now;
    this.occupancyIntegral = 0;
    this.maxRunningObserved = this.running.size;
  }

  /** Ids of every request held (running first, then queued). */
  ids(): string[] {
    return [...this.running.keys(), ...this.queue.slice(this.queueHead).map((s) => s.job.id)];
  }

  /** Drops every request without calling back and disarms the timer. */
  stop(): void {
    this.stopped = true;
    this.running.clear();
    this.queue.length = 0;
    this.queueHead = 0;
    this.decoding = 0;
    if (this.timer !== undefined) this.clock.clearTimer(this.timer);
    this.timer = undefined;
  }

  // --- internals ---

  private findQueued(id: string): number {
    for (let i = this.queueHead; i < this.queue.length; i++) {
      if (this.queue[i]?.job.id === id) return i;
    }
    return -1;
  }

  private compactQueue(): void {
    if (this.queueHead > 1024 && this.queueHead * 2 > this.queue.length) {
      this.queue.splice(0, this.queueHead);
      this.queueHead = 0;
    }
  }

  /** Tokens per wall ms that each decoding request advances at the current batch size. */
  private perRequestRatePerMs(): number {
    if (this.decoding === 0) return 0;
    return ((batchThroughput(this.decoding, this.config) / this.decoding) * this.config.timeScale) / 1000;
  }

  /** Brings decode progress and the occupancy integral up to `now`. */
  private advance(now: number): void {
    const elapsed = now - this.lastAdvanceMs;
    if (elapsed > 0 && this.decoding > 0) {
      const work = this.perRequestRatePerMs() * elapsed;
      for (const state of this.running.values()) {
        if (state.phase !== 'decode') continue;
        this.decodedTotal += tokenDelta(state.job, state.generated, state.generated + work);
        state.generated += work;
      }
    }
    this.lastAdvanceMs = Math.max(this.lastAdvanceMs, now);
    this.occupancyIntegral += this.running.size * Math.max(0, now - this.occupancyLastMs);
    this.occupancyLastMs = Math.max(this.occupancyLastMs, now);
  }

  /** Settles every event due now, admits queued requests, arms the next timer, then calls back. */
  private step(): void {
    if (this.stopped) return;
    const now = this.clock.now();
    this.advance(now);
    const finished: JobState[] = [];
    const started: JobState[] = [];
    for (;;) {
      let changed = false;
      const rate = this.perRequestRatePerMs();
      for (const state of this.running.values()) {
        if (state.phase === 'prefill' && state.prefillEndsAtMs <= now + EVENT_SLACK_MS) {
          state.phase = 'decode';
          state.generated = 0;
          this.decoding++;
          changed = true;
        }
        if (state.phase === 'decode') {
          const remaining = workOf(state.job) - state.generated;
          if (remaining <= 1e-9 || (rate > 0 && remaining / rate <= EVENT_SLACK_MS)) {
            this.decodedTotal += Math.max(0, tokenDelta(state.job, state.generated, workOf(state.job)));
            state.generated = workOf(state.job);
            this.running.delete(state.job.id);
            this.decoding--;
            finished.push(state);
            changed = true;
          }
        }
      }
      while (this.running.size < this.config.maxRunningRequests && this.queueHead < this.queue.length) {
        const state = this.queue[this.queueHead++];
        if (state === undefined) continue;
        state.phase = 'prefill';
        state.startedAtMs = now;
        const uncached = Math.max(0, state.job.promptTokens - state.job.cachedTokens);
        const prefillMs = (uncached / this.config.prefillTokensPerSec / this.config.timeScale) * 1000;
        state.prefillEndsAtMs = now + prefillMs;
        this.running.set(state.job.id, state);
        started.push(state);
        changed = true;
      }
      this.compactQueue();
      if (!changed) break;
    }
    this.maxRunningObserved = Math.max(this.maxRunningObserved, this.running.size);
    this.arm(now);
    for (const state of started) state.job.onStart?.();
    for (const state of finished) state.job.onFinish({ generatedTokens: state.job.outputTokens });
  }

  private arm(now: number): void {
    if (this.timer !== undefined) this.clock.clearTimer(this.timer);
    this.timer = undefined;
    let nextAt = Infinity;
    const rate = this.perRequestRatePerMs();
    for (const state of this.running.values()) {
      if (state.phase === 'prefill') nextAt = Math.min(nextAt, state.prefillEndsAtMs);
      else if (rate > 0) nextAt = Math.min(nextAt, now + (workOf(state.job) - state.generated) / rate);
    }
    if (nextAt === Infinity) return;
    const delayMs = Math.max(0, nextAt - now);
    this.timer = this.clock.setTimer(() => {
      this.timer = undefined;
      this.step();
    }, delayMs);
  }
}
