/**
 * The expected final length of a request given how far it has come, E[L | L > x], from a
 * log-bucketed histogram of the dataset's committed completion lengths. `acquire-request.lua`
 * computes the same numbers (same buckets, same rule inside a bucket); this module is its
 * reference, used by tests and benchmarks to say what the script should decide.
 *
 * Buckets: a length L falls in bucket floor(BUCKETS_PER_OCTAVE * log2(L + 1)), so a bucket spans
 * about 9 % of its lengths; each keeps a count and a token sum (`c<b>`, `t<b>` in the dataset's
 * `<stats>:lengths` hash, written by commit-sample-9.lua).
 */

/** Sub-buckets per doubling of the length. */
export const BUCKETS_PER_OCTAVE = 8;

/** One bucket of the length histogram. */
export interface LengthBucket {
  count: number;
  tokens: number;
}

/** Bucket index of a completion length. */
export function lengthBucket(length: number): number {
  return Math.floor((BUCKETS_PER_OCTAVE * Math.log(length + 1)) / Math.LN2);
}

/** The lengths bucket `b` spans: [lo, hi). */
export function bucketBounds(b: number): { lo: number; hi: number } {
  return { lo: 2 ** (b / BUCKETS_PER_OCTAVE) - 1, hi: 2 ** ((b + 1) / BUCKETS_PER_OCTAVE) - 1 };
}

/** Builds a histogram from lengths (tests and benchmarks; Redis builds it one commit at a time). */
export function histogramOf(lengths: Iterable<number>): Map<number, LengthBucket> {
  const h = new Map<number, LengthBucket>();
  for (const l of lengths) {
    const b = lengthBucket(l);
    const e = h.get(b) ?? { count: 0, tokens: 0 };
    e.count += 1;
    e.tokens += l;
    h.set(b, e);
  }
  return h;
}

/** Reads the `c<b>` / `t<b>` fields of the Redis hash (as HGETALL returns them). */
export function histogramFromHash(fields: Record<string, string>): Map<number, LengthBucket> {
  const h = new Map<number, LengthBucket>();
  for (const [k, v] of Object.entries(fields)) {
    const kind = k[0];
    const b = Number(k.slice(1));
    if ((kind !== 'c' && kind !== 't') || !Number.isInteger(b)) continue;
    const e = h.get(b) ?? { count: 0, tokens: 0 };
    if (kind === 'c') e.count = Number(v);
    else e.tokens = Number(v);
    h.set(b, e);
  }
  return h;
}

/**
 * E[L | L > x]: the mean of the observed lengths above `x`, capped at `maxNewTokens`. Inside
 * the bucket holding x, the share of its lengths above x is taken as spread evenly over the
 * bucket, at their bucket mean or the middle of (x, hi), whichever is higher (a spike such as
 * the lengths cut at max_new_tokens keeps its value). With nothing observed above x (the
 * histogram is empty, or x is past every length seen) it is `min(maxNewTokens, 1.25 (x + 1))`,
 * and `undefined` is returned for `observedAbove` so a caller can put a prior in its place.
 */
export function conditionalMean(
  hist: ReadonlyMap<number, LengthBucket>,
  x: number,
  maxNewTokens: number,
): { expected: number; observedAbove: number } {
  const bx = lengthBucket(x);
  let count = 0;
  let tokens = 0;
  for (const [b, e] of hist) {
    if (b > bx) {
      count += e.count;
      tokens += e.tokens;
    } else if (b === bx && e.count > 0) {
      const { lo, hi } = bucketBounds(b);
      const share = Math.min(1, Math.max(0, (hi - x) / (hi - lo)));
      const part = e.count * share;
      count += part;
      tokens += part * Math.max(e.tokens / e.count, (x + hi) / 2);
    }
  }
  if (count <= 1e-9) return { expected: Math.min(maxNewTokens, 1.25 * (x + 1)), observedAbove: 0 };
  return { expected: Math.min(maxNewTokens, Math.max(x, tokens / count)), observedAbove: count };
}

/** What the reservation of one in-flight request is, as acquire-request.lua computes it. */
export interface InFlightProgress {
  /** Tokens produced so far (streamed, or elapsed time x decode rate). */
  produced: number;
}

/**
 * The tokens a dataset has reserved: committed + the sum of E[L | L > x_i] over the requests in
 * flight. While the commits are few (fewer than `minCommits`, or than the requests in flight:
 * short completions finish first, so early commits run short), each expectation is floored by
 * `prior`.
 */
export function reservedTokens(opts: {
  committed: number;
  records: number;
  hist: ReadonlyMap<number, LengthBucket>;
  inFlight: readonly InFlightProgress[];
  prior: number;
  minCommits: number;
  maxNewTokens: number;
}): number {
  const early = opts.records < opts.minCommits || opts.records < opts.inFlight.length;
  let sum = opts.committed;
  for (const r of opts.inFlight) {
    const x = Math.min(r.produced, opts.maxNewTokens - 1);
    let e = conditionalMean(opts.hist, x, opts.maxNewTokens).expected;
    if (early) e = Math.max(e, Math.min(opts.prior, opts.maxNewTokens));
    sum += e;
  }
  return sum;
}
