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
 * The length distribution as Kaplan-Meier estimates it from the committed lengths (events) and
 * the requests still in flight (censored: each is known to run past its progress x). Without the
 * censored ones, early commits are the short completions (they finish first) and the tail would
 * be missing; with them, the share of requests still running past the last length seen is kept
 * as `tailMass`, spread evenly up to max_new_tokens.
 */
export interface LengthModel {
  /** Per bucket: the probability mass of lengths in it and their mean. */
  mass: Map<number, { mass: number; mean: number }>;
  /** Probability of a length past every bucket with an event. */
  tailMass: number;
  /** Upper bound of the last bucket with an event (0 when none). */
  tailFrom: number;
}

/** Builds the {@link LengthModel} (the same steps as acquire-request.lua). */
export function lengthModel(
  hist: ReadonlyMap<number, LengthBucket>,
  censoredBuckets: ReadonlyMap<number, number> = new Map(),
): LengthModel {
  let maxB = -1;
  let atRisk = 0;
  for (const [b, e] of hist) {
    if (b > maxB) maxB = b;
    atRisk += e.count;
  }
  for (const [b, n] of censoredBuckets) {
    if (b > maxB) maxB = b;
    atRisk += n;
  }
  const mass = new Map<number, { mass: number; mean: number }>();
  let survival = 1;
  let lastEvent = -1;
  for (let b = 0; b <= maxB; b += 1) {
    const e = hist.get(b);
    const d = e?.count ?? 0;
    if (d > 0 && atRisk > 0) {
      const m = (survival * d) / atRisk;
      mass.set(b, { mass: m, mean: (e?.tokens ?? 0) / d });
      survival -= m;
      lastEvent = b;
    }
    atRisk -= d + (censoredBuckets.get(b) ?? 0);
  }
  return {
    mass,
    tailMass: lastEvent < 0 ? 0 : Math.max(0, survival),
    tailFrom: lastEvent < 0 ? 0 : bucketBounds(lastEvent).hi,
  };
}

/**
 * E[L | L > x] under `model`, capped at `maxNewTokens`. Inside the bucket holding x, the share
 * of its lengths above x is taken as spread evenly over the bucket, at their bucket mean or the
 * middle of (x, hi), whichever is higher (a spike such as the lengths cut at max_new_tokens keeps
 * its value). The tail mass counts at the middle of (max(x, tailFrom), maxNewTokens). With nothing
 * above x (no lengths yet, or x past every one) it is `min(maxNewTokens, 1.25 (x + 1))`, and
 * `observedAbove` is 0.
 */
export function conditionalMean(
  model: LengthModel,
  x: number,
  maxNewTokens: number,
): { expected: number; variance: number; observedAbove: number } {
  const bx = lengthBucket(x);
  let mass = 0;
  let tokens = 0;
  let squares = 0;
  for (const [b, e] of model.mass) {
    if (b > bx) {
      mass += e.mass;
      tokens += e.mass * e.mean;
      squares += e.mass * e.mean * e.mean;
    } else if (b === bx) {
      const { lo, hi } = bucketBounds(b);
      const part = e.mass * Math.min(1, Math.max(0, (hi - x) / (hi - lo)));
      const v = Math.max(e.mean, (x + hi) / 2);
      mass += part;
      tokens += part * v;
      squares += part * v * v;
    }
  }
  if (model.tailMass > 0 && maxNewTokens > x) {
    const a = Math.max(x, model.tailFrom);
    mass += model.tailMass;
    tokens += (model.tailMass * (a + maxNewTokens)) / 2;
    squares += (model.tailMass * (a * a + a * maxNewTokens + maxNewTokens * maxNewTokens)) / 3;
  }
  if (mass <= 1e-12) return { expected: Math.min(maxNewTokens, 1.25 * (x + 1)), variance: 0, observedAbove: 0 };
  const mean = tokens / mass;
  return {
    expected: Math.min(maxNewTokens, Math.max(x, mean)),
    variance: Math.max(0, squares / mass - mean * mean),
    observedAbove: mass,
  };
}

/** What the reservation of one in-flight request is, as acquire-request.lua computes it. */
export interface InFlightProgress {
  /** Tokens produced so far (streamed, or elapsed time x decode rate). */
  produced: number;
}

/**
 * The tokens a dataset has reserved: committed + the sum of E[L | L > x_i] over the requests in
 * flight, under the Kaplan-Meier model of the committed lengths with the requests in flight as
 * censored at their progress, + `marginSd` standard deviations of that sum (the lengths taken as
 * independent). While the commits are fewer than `minCommits`, each expectation is floored by
 * `prior` and each variance by prior^2 / 3. With nothing in flight the margin is 0, so a dataset
 * below its budget always admits one request.
 */
export function reservedTokens(opts: {
  committed: number;
  records: number;
  hist: ReadonlyMap<number, LengthBucket>;
  inFlight: readonly InFlightProgress[];
  prior: number;
  minCommits: number;
  maxNewTokens: number;
  /** Standard deviations of the in-flight total added to the reservation (default 0; the workers pass the dataset's `budgetMarginSd`). */
  marginSd?: number;
}): number {
  const xs = opts.inFlight.map((r) => Math.floor(Math.min(r.produced, opts.maxNewTokens - 1)));
  const censored = new Map<number, number>();
  for (const x of xs) censored.set(lengthBucket(x), (censored.get(lengthBucket(x)) ?? 0) + 1);
  const model = lengthModel(opts.hist, censored);
  const floor = opts.records < opts.minCommits ? Math.min(opts.prior, opts.maxNewTokens) : 0;
  // While the prior floors the means, the variances are floored by that of a length spread evenly over [0, 2 prior].
  const varFloor = (floor * floor) / 3;
  let sum = opts.committed;
  let variance = 0;
  for (const x of xs) {
    const c = conditionalMean(model, x, opts.maxNewTokens);
    sum += Math.max(floor, c.expected);
    variance += Math.max(varFloor, c.variance);
  }
  return sum + (opts.marginSd ?? 0) * Math.sqrt(variance);
}
