/**
 * A dataset's generation rate and ETA, from what was measured: the tokens committed per time
 * bucket (commit-sample-9.lua's rate hash) since the dataset last started committing, within
 * the recent window, over the time that really passed (not whole buckets), and the output
 * tokens still to generate. Until there is a measurement (a few commits over a few seconds) the
 * ETA is unknown (null), never a guess.
 */

/** Seconds of committing (since the first commit of the current stretch) before an ETA is given. */
export const ETA_MIN_MEASURED_SEC = 5;
/** Commits (estimated as tokens / mean record length) before an ETA is given. */
export const ETA_MIN_COMMITS = 3;
/** The range is at least ±10 % (rates drift), at most ×0.67–×2 of the middle estimate. */
const MIN_SPREAD = 0.1;
const MAX_SPREAD = 0.5;

export interface RateEtaOptions {
  /** Width of the rate hash's buckets (ms). */
  bucketMs: number;
  /** Buckets of the recent window the rate is measured over (the current one not counted). */
  windowBuckets: number;
  /** The dataset's first commit ever (`firstCommitMs` in its stats), when known. */
  firstCommitMs?: number | null | undefined;
  /** Mean output tokens per committed record, to count commits from tokens; unknown: null. */
  meanTokens?: number | null | undefined;
}

export interface RateEta {
  /** Output tokens per second over the measured stretch (0 without one). */
  tokensPerSec: number;
  /** Seconds to go, as a range; null while unknown. */
  eta: { low: number | null; high: number | null };
}

/**
 * The rate over the current stretch of commits and the ETA of `remaining` output tokens at it.
 * A stretch starts at the first bucket of the window with tokens in it; when the bucket before
 * it also had tokens, it is the window's start exactly, otherwise the commits began somewhere
 * in that bucket (at `firstCommitMs` when it lies there): the middle is taken, and the half
 * bucket of doubt widens the range, as does a small number of commits (±1/√n).
 */
export function estimateRateAndEta(
  rate: Readonly<Record<string, string>>,
  nowMs: number,
  remaining: number | null,
  o: RateEtaOptions,
): RateEta {
  const current = Math.floor(nowMs / o.bucketMs);
  const tokensOf = (b: number): number => Number(rate[String(b)] ?? 0);
  const windowStart = current - o.windowBuckets;
  let first: number | undefined;
  let tokens = 0;
  for (let b = windowStart; b <= current; b++) {
    const t = tokensOf(b);
    if (t > 0 && first === undefined) first = b;
    if (first !== undefined) tokens += t;
  }
  if (remaining === 0)
    return {
      tokensPerSec: first === undefined ? 0 : tokens / Math.max(1, (nowMs - first * o.bucketMs) / 1000),
      eta: { low: 0, high: 0 },
    };
  const unknown = { low: null, high: null };
  if (first === undefined) return { tokensPerSec: 0, eta: unknown };

  let startMin = first * o.bucketMs;
  let startMax = Math.min(nowMs, (first + 1) * o.bucketMs);
  if (first === windowStart && tokensOf(first - 1) > 0) startMax = startMin;
  else if (
    o.firstCommitMs !== null &&
    o.firstCommitMs !== undefined &&
    o.firstCommitMs >= startMin &&
    o.firstCommitMs <= startMax
  ) {
    startMin = o.firstCommitMs;
    startMax = o.firstCommitMs;
  }
  const elapsedSec = (nowMs - (startMin + startMax) / 2) / 1000;
  const doubtSec = (startMax - startMin) / 2000;
  if (elapsedSec <= 0) return { tokensPerSec: 0, eta: unknown };
  const tokensPerSec = tokens / elapsedSec;
  const commits =
    o.meanTokens !== null && o.meanTokens !== undefined && o.meanTokens > 0 ? tokens / o.meanTokens : Infinity;
  if (remaining === null || elapsedSec < ETA_MIN_MEASURED_SEC || commits < ETA_MIN_COMMITS || tokensPerSec <= 0)
    return { tokensPerSec, eta: unknown };

  const spread = Math.min(
    MAX_SPREAD,
    Math.max(MIN_SPREAD, Math.sqrt((Number.isFinite(commits) ? 1 / commits : 0) + (doubtSec / elapsedSec) ** 2)),
  );
  const middle = remaining / tokensPerSec;
  return {
    tokensPerSec,
    eta: { low: Math.round(middle / (1 + spread)), high: Math.max(1, Math.round(middle / (1 - spread))) },
  };
}
