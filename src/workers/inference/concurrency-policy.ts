/**
 * The decisions of `sglang.concurrency: "auto"` for one endpoint, one measurement window at a
 * time, with no I/O: raise the requests in flight while the server's throughput rises and its
 * own queue stays short; step back when it queues or answers 503.
 */

/** Bounds and thresholds of the decisions (`sglang.autoConcurrency`). */
export interface ConcurrencyBounds {
  min: number;
  max: number;
  /** Queued requests above which the cap steps back (at least 10% of the running requests count as short). */
  maxQueued: number;
}

/** What one window measured, with the cap in force over all of it. */
export interface WindowObservation {
  cap: number;
  /** Mean requests in flight on the endpoint, leased by every worker. */
  inFlight: number;
  /** Mean requests the server ran and held in its queue. */
  running: number;
  queued: number;
  /** The most requests it ran at once in the window (its capacity, when it queues); default `running`. */
  runningPeak?: number;
  /** Output tokens per second the server decoded over the window; null when it has no `/metrics`. */
  tokensPerSec: number | null;
  /** 503 answers of the endpoint during the window. */
  overloads: number;
}

/** What the policy remembers between windows. */
export interface PolicyState {
  /** The cap before the last raise, and the throughput measured at it; null when no raise is being judged. */
  previousCap: number | null;
  previousTokensPerSec: number | null;
  /** Windows to keep the cap as it is before probing upward again. */
  holdWindows: number;
}

export const INITIAL_POLICY_STATE: PolicyState = { previousCap: null, previousTokensPerSec: null, holdWindows: 0 };

export interface ConcurrencyDecision {
  cap: number;
  reason: string;
  state: PolicyState;
}

/** A raise multiplies the cap by this (at least +1). */
export const RAISE_FACTOR = 1.25;
/** A raise that gained less than this share of throughput did not pay: the cap goes back. */
export const MIN_GAIN = 0.01;
/** A 503 cuts the cap (or the requests in flight, if fewer) by this factor. */
export const OVERLOAD_FACTOR = 0.7;
/** Windows to hold after a raise that did not pay, and after a 503. */
const PLATEAU_HOLD_WINDOWS = 6;
const OVERLOAD_HOLD_WINDOWS = 3;
/** In-flight requests above this share of the cap (plus one): a lowered cap is still draining. */
const DRAINED_SHARE = 1.02;
/** In-flight requests below this share of the cap: demand, not the cap, limits them. */
const CAP_BOUND_SHARE = 0.9;

function clamp(cap: number, b: ConcurrencyBounds): number {
  return Math.min(b.max, Math.max(b.min, Math.round(cap)));
}

function rate(x: number | null): string {
  return x === null ? '?' : `${Math.round(x)}`;
}

/** The queue length still counted as short with `running` requests running. */
export function queueLimit(running: number, b: ConcurrencyBounds): number {
  return Math.max(b.maxQueued, Math.ceil(0.1 * running));
}

/** The next cap after one window, and why. */
export function decideConcurrency(o: WindowObservation, s: PolicyState, b: ConcurrencyBounds): ConcurrencyDecision {
  const limit = queueLimit(o.running, b);
  const seen = `${Math.round(o.running)} running, ${o.queued.toFixed(1)} queued, ${rate(o.tokensPerSec)} tok/s`;
  if (o.overloads > 0) {
    const cap = clamp(Math.floor(Math.min(o.cap, Math.max(1, o.inFlight)) * OVERLOAD_FACTOR), b);
    return {
      cap,
      reason: `stepped back: the server answered 503 ${o.overloads} time(s) (${seen})`,
      state: { ...INITIAL_POLICY_STATE, holdWindows: OVERLOAD_HOLD_WINDOWS },
    };
  }
  if (o.inFlight > o.cap * DRAINED_SHARE + 1) {
    // Lowered, and long requests still hold the old slots: the window measured the old value.
    return {
      cap: o.cap,
      reason: `held: waiting for the requests in flight to drain to the cap (${o.inFlight.toFixed(0)} in flight; ${seen})`,
      state: s,
    };
  }
  if (o.queued > limit) {
    // The server runs all it can: keep that many plus a short queue that refills its slots at once.
    const target = Math.ceil(Math.max(o.running, o.runningPeak ?? 0) + limit / 2);
    const cap = clamp(target < o.cap ? target : Math.floor(o.cap * 0.9), b);
    return {
      cap,
      reason: `stepped back: the server queues more than ${limit} (${seen})`,
      state: { ...INITIAL_POLICY_STATE, holdWindows: 1 },
    };
  }
  if (o.inFlight < CAP_BOUND_SHARE * o.cap) {
    // Nothing to judge the cap by: the next window that fills it is compared as this one would have been.
    return {
      cap: o.cap,
      reason: `held: fewer requests ready than the cap (${o.inFlight.toFixed(0)} in flight; ${seen})`,
      state: s,
    };
  }
  if (o.queued >= 1) {
    return { cap: o.cap, reason: `held: the server is full with a short queue (${seen})`, state: INITIAL_POLICY_STATE };
  }
  if (s.holdWindows > 0) {
    return {
      cap: o.cap,
      reason: `held for ${s.holdWindows} more window(s) (${seen})`,
      state: { ...s, holdWindows: s.holdWindows - 1 },
    };
  }
  const before = s.previousTokensPerSec;
  if (
    s.previousCap !== null &&
    s.previousCap < o.cap &&
    before !== null &&
    o.tokensPerSec !== null &&
    o.tokensPerSec < before * (1 + MIN_GAIN)
  ) {
    return {
      cap: clamp(s.previousCap, b),
      reason: `went back: ${o.cap} in flight gave ${rate(o.tokensPerSec)} tok/s, no more than ${rate(before)} at ${s.previousCap} (${seen})`,
      state: { ...INITIAL_POLICY_STATE, holdWindows: PLATEAU_HOLD_WINDOWS },
    };
  }
  const cap = clamp(Math.max(o.cap + 1, o.cap * RAISE_FACTOR), b);
  if (cap === o.cap) return { cap, reason: `held at the maximum (${seen})`, state: INITIAL_POLICY_STATE };
  return {
    cap,
    reason: `raised: queue short${before === null || o.tokensPerSec === null ? '' : `, throughput ${rate(before)} → ${rate(o.tokensPerSec)} tok/s`} (${seen})`,
    state: { previousCap: o.cap, previousTokensPerSec: o.tokensPerSec, holdWindows: 0 },
  };
}
