// The ETA from what was measured: the cases of issue 21 (an ETA of 1.2h at 10 s of a run that
// ended at 33 s, the demo's 3m–5m at 9 s when it ended at ~20 s, 217h–434h right after a resume
// for 136 prompts at 96 tok/s, 0s for a paused dataset), each a simulated commit stream.
import { describe, expect, it } from 'vitest';
import { formatProgressLine } from '../../src/cli/progress.js';
import { estimateRateAndEta } from '../../src/shared/run-state/eta.js';
import { formatRunStatus, RATE_BUCKET_MS, type DatasetStatus, type RunStatus } from '../../src/shared/index.js';

const WINDOW = 6;

/** A run's commits: `len` tokens each, every `gapMs`, between `fromMs` and `toMs`. */
interface Stream {
  fromMs: number;
  toMs: number;
  gapMs: number;
  len: number;
}

/** The rate hash (bucket → tokens) and counters as they stand at `nowMs`. */
function measure(
  streams: Stream[],
  nowMs: number,
): { rate: Record<string, string>; tokens: number; records: number; firstCommitMs: number | null } {
  const rate: Record<string, number> = {};
  let tokens = 0;
  let records = 0;
  let firstCommitMs: number | null = null;
  for (const s of streams) {
    for (let t = s.fromMs; t <= Math.min(s.toMs, nowMs); t += s.gapMs) {
      const b = Math.floor(t / RATE_BUCKET_MS);
      rate[b] = (rate[b] ?? 0) + s.len;
      tokens += s.len;
      records += 1;
      firstCommitMs ??= t;
    }
  }
  return {
    rate: Object.fromEntries(Object.entries(rate).map(([k, v]) => [k, String(v)])),
    tokens,
    records,
    firstCommitMs,
  };
}

function etaAt(streams: Stream[], nowMs: number, remaining: (m: ReturnType<typeof measure>) => number) {
  const m = measure(streams, nowMs);
  return estimateRateAndEta(m.rate, nowMs, remaining(m), {
    bucketMs: RATE_BUCKET_MS,
    windowBuckets: WINDOW,
    firstCommitMs: m.firstCommitMs,
    meanTokens: m.records > 0 ? m.tokens / m.records : null,
  });
}

/** The range holds the truth (within 10 %) and is no wider than `maxRatio`. */
function expectAround(eta: { low: number | null; high: number | null }, truthSec: number, maxRatio: number): void {
  expect(eta.low, JSON.stringify(eta)).not.toBeNull();
  expect(eta.low ?? Infinity).toBeLessThanOrEqual(truthSec * 1.1);
  expect(eta.high ?? 0).toBeGreaterThanOrEqual(truthSec * 0.9);
  expect((eta.high ?? Infinity) / Math.max(1, eta.low ?? 0)).toBeLessThanOrEqual(maxRatio);
}

// Bucket-aligned starts and starts late in a bucket: the old figure was worst there.
const OFFSETS = [0, 3_000, 7_000, 9_500];
const T0 = 1_700_000_000_000 - (1_700_000_000_000 % RATE_BUCKET_MS);

describe('ETA from the measured rate', () => {
  it('a 33 s run, asked at 10 s and at 20 s: about 23 s and 13 s left (was "1.2h")', () => {
    for (const offset of OFFSETS) {
      const start = T0 + offset;
      // Requests take 2 s; then a 40-token record every 100 ms (400 tok/s) until 33 s.
      const run: Stream[] = [{ fromMs: start + 2_000, toMs: start + 33_000, gapMs: 100, len: 40 }];
      const total = measure(run, start + 33_000).tokens;
      for (const at of [10, 20]) {
        const { eta, tokensPerSec } = etaAt(run, start + at * 1000, (m) => total - m.tokens);
        expect(tokensPerSec, `offset ${offset}, at ${at}s`).toBeGreaterThan(300);
        expect(tokensPerSec).toBeLessThan(500);
        expectAround(eta, 33 - at, 2.5);
      }
    }
  });

  it("the demo's generation, ending at ~20 s, asked at 9 s: about 11 s (was 3m–5m)", () => {
    for (const offset of OFFSETS) {
      const start = T0 + offset;
      const run: Stream[] = [{ fromMs: start + 1_500, toMs: start + 20_000, gapMs: 20, len: 60 }];
      const total = measure(run, start + 20_000).tokens;
      expectAround(etaAt(run, start + 9_000, (m) => total - m.tokens).eta, 11, 2.5);
    }
  });

  it('right after a resume: 136 prompts left at 96 tok/s is about 85 s, not 217h–434h', () => {
    for (const offset of OFFSETS) {
      const resumed = T0 + 600_000 + offset;
      const streams: Stream[] = [
        // Before the pause (over 10 minutes ago, partly still in the rate hash's 5 minutes).
        { fromMs: T0 - 300_000, toMs: T0, gapMs: 625, len: 60 },
        // After the resume: 60-token records at 96 tok/s.
        { fromMs: resumed + 1_000, toMs: resumed + 3_600_000, gapMs: 625, len: 60 },
      ];
      const at = resumed + 30_000;
      const { eta, tokensPerSec } = etaAt(streams, at, () => 136 * 60);
      expect(tokensPerSec).toBeGreaterThan(96 * 0.75);
      expect(tokensPerSec).toBeLessThan(96 * 1.35);
      expectAround(eta, 85, 2.5);
    }
  });

  it('a long steady run (1,000 tok/s, one 1,000-token answer a second): a range within ×1.6', () => {
    const start = T0 + 4_000;
    const run: Stream[] = [{ fromMs: start + 120_000, toMs: start + 100_000_000, gapMs: 1_000, len: 1_000 }];
    expectAround(etaAt(run, start + 3_600_000, () => 3_600_000).eta, 3_600, 1.6);
  });

  it('unknown until measured: no commit yet, one commit, two seconds of commits', () => {
    const start = T0 + 2_000;
    const run: Stream[] = [{ fromMs: start + 5_000, toMs: start + 60_000, gapMs: 500, len: 50 }];
    for (const at of [1_000, 5_000, 7_000])
      expect(etaAt(run, start + at, () => 10_000).eta, `at ${at}`).toEqual({ low: null, high: null });
    expect(etaAt(run, start + 12_000, () => 10_000).eta.low).not.toBeNull();
    // Done is done.
    expect(etaAt(run, start + 1_000, () => 0).eta).toEqual({ low: 0, high: 0 });
  });
});

describe('ETA as printed', () => {
  function dataset(o: Partial<DatasetStatus>): DatasetStatus {
    return {
      name: 'B1',
      records: 40,
      outputTokens: 2_000,
      tokenBudget: 10_000,
      inFlight: 0,
      failed: 0,
      skipped: 0,
      rejected: 0,
      tokensPerSec: 0,
      etaSeconds: { low: null, high: null },
      status: 'in_progress',
      paused: false,
      jobs: {},
      stalled: null,
      ...o,
    };
  }
  const status = (...ds: DatasetStatus[]): RunStatus => ({
    run: 'r',
    phases: [],
    datasets: ds,
    endpoints: { total: 1, healthy: 1, reported: 1, endpoints: [] },
    endpointRequests: [],
    workers: [],
  });

  it('"ETA unknown" while not measured', () => {
    expect(formatProgressLine(status(dataset({ inFlight: 4 })), 3)).toContain(', ETA unknown');
    expect(formatRunStatus(status(dataset({ inFlight: 4 })))).toMatch(/B1\s+in_progress.*\sunknown$/m);
  });

  it('a paused dataset: "paused", never "ETA 0s"', () => {
    const paused = dataset({ status: 'paused', paused: true, etaSeconds: { low: 0, high: 0 } });
    expect(formatRunStatus(status(paused))).toMatch(/B1\s+paused.*\spaused$/m);
    expect(formatRunStatus(status(paused))).not.toMatch(/\s0s$/m);
    expect(formatProgressLine(status(paused), 30)).not.toContain('ETA');
  });
});
