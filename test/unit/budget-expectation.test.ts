import { describe, expect, it } from 'vitest';
import {
  bucketBounds,
  conditionalMean,
  histogramFromHash,
  histogramOf,
  lengthBucket,
  lengthModel,
  reservedTokens,
} from '../../src/workers/inference/budget-expectation.js';

/** Deterministic lognormal lengths (Box-Muller on a small LCG), capped like max_new_tokens. */
function lognormalLengths(n: number, mean: number, sigma: number, maxNew: number, seed = 7): number[] {
  let state = seed;
  const uniform = (): number => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return (state + 0.5) / 2147483648;
  };
  const mu = Math.log(mean) - (sigma * sigma) / 2;
  const out: number[] = [];
  for (let i = 0; i < n; i += 1) {
    const z = Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
    out.push(Math.min(maxNew, Math.max(1, Math.round(Math.exp(mu + sigma * z)))));
  }
  return out;
}

function exactConditional(lengths: readonly number[], x: number): number {
  const above = lengths.filter((l) => l > x);
  return above.reduce((a, b) => a + b, 0) / above.length;
}

describe('length buckets', () => {
  it('put every length inside its bucket, about 9 % wide', () => {
    for (const l of [0, 1, 2, 7, 100, 2_700, 10_239, 10_240, 1_000_000]) {
      const { lo, hi } = bucketBounds(lengthBucket(l));
      expect(l).toBeGreaterThanOrEqual(lo - 1e-9);
      expect(l).toBeLessThan(hi);
    }
    const { lo, hi } = bucketBounds(lengthBucket(2_700));
    expect((hi - lo) / lo).toBeCloseTo(2 ** (1 / 8) - 1, 2);
  });

  it('reads back from the Redis hash fields the commit writes', () => {
    const h = histogramFromHash({ c3: '2', t3: '9', c80: '1', t80: '1000', junk: '5' });
    expect([...h.entries()].sort((a, b) => a[0] - b[0])).toEqual([
      [3, { count: 2, tokens: 9 }],
      [80, { count: 1, tokens: 1000 }],
    ]);
  });
});

describe('E[L | L > x] from the histogram', () => {
  for (const sigma of [0.8, 1.0]) {
    it(`is within a few percent of the sample's own conditional mean (lognormal mean 2700, sigma ${sigma}, max 10240)`, () => {
      const lengths = lognormalLengths(20_000, 2_700, sigma, 10_240);
      const hist = histogramOf(lengths);
      for (const x of [0, 100, 1_000, 2_700, 5_000, 8_000, 10_000]) {
        const got = conditionalMean(lengthModel(hist), x, 10_240).expected;
        const want = exactConditional(lengths, x);
        expect(Math.abs(got - want) / want, `x=${x}: ${got} vs ${want}`).toBeLessThan(0.03);
      }
    });
  }

  it('is the plain mean for a fresh request, not the size-biased one', () => {
    const lengths = lognormalLengths(20_000, 2_700, 0.8, 10_240);
    const mean = lengths.reduce((a, b) => a + b, 0) / lengths.length;
    const sizeBiased = lengths.reduce((a, b) => a + b * b, 0) / lengths.reduce((a, b) => a + b, 0);
    const got = conditionalMean(lengthModel(histogramOf(lengths)), 0, 10_240).expected;
    expect(got).toBeCloseTo(mean, -1);
    expect(got).toBeLessThan(0.7 * sizeBiased);
  });

  it('grows as the request comes further, and never passes max_new_tokens', () => {
    const hist = lengthModel(histogramOf(lognormalLengths(5_000, 2_700, 1.0, 10_240)));
    let last = 0;
    for (let x = 0; x < 10_240; x += 97) {
      const e = conditionalMean(hist, x, 10_240).expected;
      expect(e).toBeGreaterThanOrEqual(last - 1e-6);
      expect(e).toBeGreaterThanOrEqual(x);
      expect(e).toBeLessThanOrEqual(10_240);
      last = e;
    }
  });

  it('keeps a spike of lengths cut at max_new_tokens at its value', () => {
    const hist = lengthModel(histogramOf([...Array<number>(50).fill(500), ...Array<number>(50).fill(10_240)]));
    expect(conditionalMean(hist, 9_900, 10_240).expected).toBe(10_240);
    expect(conditionalMean(hist, 600, 10_240).expected).toBe(10_240);
  });

  it('says when nothing was observed above x, and then expects a quarter more, capped', () => {
    expect(conditionalMean(lengthModel(new Map()), 0, 4_096)).toEqual({
      expected: 1.25,
      variance: 0,
      observedAbove: 0,
    });
    const hist = lengthModel(histogramOf([100, 200, 300]));
    expect(conditionalMean(hist, 1_000, 4_096)).toEqual({ expected: 1_251.25, variance: 0, observedAbove: 0 });
    expect(conditionalMean(hist, 4_000, 4_096).expected).toBe(4_096);
  });
});

describe('the requests in flight as censored lengths (Kaplan-Meier)', () => {
  it('keeps the tail that early commits lack: the short completions finish first', () => {
    const lengths = lognormalLengths(2_000, 2_700, 0.8, 10_240);
    const mean = lengths.reduce((a, b) => a + b, 0) / lengths.length;
    // Early in a dataset: every request started together and has produced 3,000 tokens; those
    // shorter are committed, the others still run.
    const cut = 3_000;
    const committed = histogramOf(lengths.filter((l) => l <= cut));
    const running = lengths.filter((l) => l > cut).length;
    const naive = conditionalMean(lengthModel(committed), 0, 10_240).expected;
    const km = lengthModel(committed, new Map([[lengthBucket(cut), running]]));
    expect(naive).toBeLessThan(0.7 * mean);
    // The running share is put evenly between the cut and max_new_tokens: a little above the truth, never far below.
    const fresh = conditionalMean(km, 0, 10_240).expected;
    expect(fresh).toBeGreaterThan(0.97 * mean);
    expect(fresh).toBeLessThan(1.25 * mean);
    expect(km.tailMass).toBeCloseTo(running / lengths.length, 2);
    // A running request past the cut expects somewhere between the true conditional mean and max_new_tokens.
    const far = conditionalMean(km, cut + 10, 10_240).expected;
    expect(far).toBeGreaterThan(0.95 * exactConditional(lengths, cut));
    expect(far).toBeLessThanOrEqual(10_240);
  });

  it('is the plain histogram when nothing is in flight', () => {
    const hist = histogramOf(lognormalLengths(1_000, 2_700, 1.0, 10_240));
    const a = lengthModel(hist);
    expect(a.tailMass).toBe(0);
    expect([...a.mass.values()].reduce((x, m) => x + m.mass, 0)).toBeCloseTo(1, 9);
  });
});

describe('reservedTokens', () => {
  const hist = histogramOf(lognormalLengths(5_000, 2_700, 0.8, 10_240));

  it('adds each request in flight at its own expectation', () => {
    const one = (produced: number): number =>
      reservedTokens({
        committed: 0,
        records: 5_000,
        hist,
        inFlight: [{ produced }],
        prior: 5_120,
        minCommits: 32,
        maxNewTokens: 10_240,
      });
    const fresh = one(0);
    const far = one(6_000);
    expect(far).toBeGreaterThan(fresh + 4_000);
    const both = reservedTokens({
      committed: 1_000,
      records: 5_000,
      hist,
      inFlight: [{ produced: 0 }, { produced: 6_000 }],
      prior: 5_120,
      minCommits: 32,
      maxNewTokens: 10_240,
    });
    // Each request in flight also counts as a censored length: a little above the sum of the two alone.
    expect(both).toBeGreaterThanOrEqual(1_000 + fresh + far - 1e-6);
    expect(both).toBeLessThan(1.001 * (1_000 + fresh + far));
  });

  it('adds standard deviations of the in-flight total when asked (from the conditional spread of each length)', () => {
    const lengths = lognormalLengths(20_000, 2_700, 0.8, 10_240);
    const c = conditionalMean(lengthModel(histogramOf(lengths)), 2_000, 10_240);
    const above = lengths.filter((l) => l > 2_000);
    const m = above.reduce((a, b) => a + b, 0) / above.length;
    const v = above.reduce((a, b) => a + (b - m) ** 2, 0) / above.length;
    expect(Math.abs(Math.sqrt(c.variance) - Math.sqrt(v)) / Math.sqrt(v)).toBeLessThan(0.05);
    const base = {
      committed: 0,
      records: 20_000,
      hist: histogramOf(lengths),
      inFlight: Array.from({ length: 100 }, () => ({ produced: 2_000 })),
      prior: 5_120,
      minCommits: 32,
      maxNewTokens: 10_240,
    };
    const plain = reservedTokens(base);
    const withMargin = reservedTokens({ ...base, marginSd: 1 });
    // 100 requests: the margin is one standard deviation of their sum, sqrt(100) times theirs.
    expect(withMargin - plain).toBeGreaterThan(0.9 * 10 * Math.sqrt(v));
    expect(withMargin - plain).toBeLessThan(1.1 * 10 * Math.sqrt(v));
  });

  it('floors every variance by that of a length spread over [0, 2 prior] while the commits are few', () => {
    const early = reservedTokens({
      committed: 0,
      records: 3,
      hist: histogramOf([10, 20, 30]),
      inFlight: [{ produced: 0 }, { produced: 0 }, { produced: 0 }],
      prior: 5_120,
      minCommits: 32,
      maxNewTokens: 10_240,
      marginSd: 2,
    });
    expect(early).toBeCloseTo(3 * 5_120 + 2 * Math.sqrt((3 * 5_120 * 5_120) / 3), 6);
    // Past minCommits the observed spread counts alone: 40 lengths of 20 have none.
    const later = reservedTokens({
      committed: 0,
      records: 40,
      hist: histogramOf(Array<number>(40).fill(20)),
      inFlight: [{ produced: 0 }],
      prior: 5_120,
      minCommits: 32,
      maxNewTokens: 10_240,
      marginSd: 2,
    });
    expect(later).toBeLessThan(100);
  });

  it('holds nothing back with nothing in flight, whatever the margin (a dataset below its budget always admits one)', () => {
    expect(
      reservedTokens({
        committed: 12_345,
        records: 5_000,
        hist,
        inFlight: [],
        prior: 5_120,
        minCommits: 32,
        maxNewTokens: 10_240,
        marginSd: 10,
      }),
    ).toBe(12_345);
    expect(
      reservedTokens({
        committed: 12_345,
        records: 0,
        hist: new Map(),
        inFlight: [],
        prior: 5_120,
        minCommits: 32,
        maxNewTokens: 10_240,
        marginSd: 10,
      }),
    ).toBe(12_345);
  });

  it('floors every expectation by the prior while the commits are few', () => {
    const early = reservedTokens({
      committed: 0,
      records: 3,
      hist: histogramOf([10, 20, 30]),
      inFlight: [{ produced: 0 }, { produced: 0 }],
      prior: 5_120,
      minCommits: 32,
      maxNewTokens: 10_240,
    });
    expect(early).toBe(2 * 5_120);
    const later = reservedTokens({
      committed: 0,
      records: 40,
      hist: histogramOf(Array<number>(40).fill(20)),
      inFlight: [{ produced: 0 }],
      prior: 5_120,
      minCommits: 32,
      maxNewTokens: 10_240,
    });
    expect(later).toBeLessThan(100);
  });
});
