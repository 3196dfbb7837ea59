import { describe, expect, it } from 'vitest';

import { LoadModel, type LoadModelConfig, VirtualClock, batchThroughput } from '../../src/sim/load-model.js';
import { FaultInjector, validateFaults } from '../../src/sim/faults.js';
import { completionIds, planOutput, sampleOutputLength, type TokenPool } from '../../src/sim/output-model.js';
import { mulberry32 } from '../../src/sim/random.js';
import { PrefixCache } from '../../src/sim/prefix-cache.js';

const BASE: LoadModelConfig = {
  maxRunningRequests: 64,
  singleRequestTokensPerSec: 80,
  peakTokensPerSec: 2500,
  prefillTokensPerSec: 20000,
  timeScale: 1,
};

interface Finished {
  id: string;
  atMs: number;
  tokens: number;
}

function harness(config: Partial<LoadModelConfig> = {}) {
  const clock = new VirtualClock();
  const model = new LoadModel({ ...BASE, ...config }, clock);
  const finished: Finished[] = [];
  const started: string[] = [];
  const submit = (id: string, outputTokens: number, promptTokens = 0, cachedTokens = 0): void =>
    model.submit({
      id,
      promptTokens,
      cachedTokens,
      outputTokens,
      onStart: () => started.push(id),
      onFinish: ({ generatedTokens }) => finished.push({ id, atMs: clock.now(), tokens: generatedTokens }),
    });
  return { clock, model, finished, started, submit };
}

/** Aggregate decode throughput (tokens per simulated second) of `n` equal requests started together. */
function aggregateThroughput(n: number, outputTokens: number, config: Partial<LoadModelConfig> = {}): number {
  const h = harness(config);
  for (let i = 0; i < n; i++) h.submit(`r${i}`, outputTokens);
  h.clock.runUntilIdle();
  expect(h.finished).toHaveLength(n);
  const lastMs = Math.max(...h.finished.map((f) => f.atMs));
  return (n * outputTokens) / (lastMs / 1000);
}

describe('batchThroughput', () => {
  it('equals the single-request speed at B=1 and saturates towards the peak', () => {
    expect(batchThroughput(1, BASE)).toBeCloseTo(80, 9);
    expect(batchThroughput(0, BASE)).toBe(0);
    let previousTotal = 0;
    let previousPerRequest = Infinity;
    for (const b of [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]) {
      const total = batchThroughput(b, BASE);
      const perRequest = total / b;
      expect(total).toBeGreaterThan(previousTotal);
      expect(perRequest).toBeLessThan(previousPerRequest);
      expect(total).toBeLessThan(BASE.peakTokensPerSec);
      previousTotal = total;
      previousPerRequest = perRequest;
    }
    // Saturation: doubling a large batch gains little, doubling a small one a lot.
    expect(batchThroughput(2, BASE) / batchThroughput(1, BASE)).toBeGreaterThan(1.9);
    expect(batchThroughput(256, BASE) / batchThroughput(128, BASE)).toBeLessThan(1.12);
  });
});

describe('LoadModel', () => {
  it('runs one request at the single-request speed', () => {
    const h = harness();
    h.submit('a', 800);
    expect(h.model.snapshot()).toMatchObject({ running: 1, queued: 0, decoding: 1 });
    h.clock.runUntilIdle();
    expect(h.finished).toEqual([{ id: 'a', atMs: expect.closeTo(10_000, 0) as unknown as number, tokens: 800 }]);
    expect(h.model.snapshot()).toMatchObject({ running: 0, queued: 0, decoding: 0 });
  });

  it('aggregate throughput rises with concurrency and saturates at the slot limit', () => {
    const t1 = aggregateThroughput(1, 1000);
    const t8 = aggregateThroughput(8, 1000);
    const t32 = aggregateThroughput(32, 1000);
    const t64 = aggregateThroughput(64, 1000);
    const t128 = aggregateThroughput(128, 1000);
    expect(t1).toBeCloseTo(80, 0);
    expect(t8).toBeCloseTo(batchThroughput(8, BASE), 0);
    expect(t1).toBeLessThan(t8);
    expect(t8).toBeLessThan(t32);
    expect(t32).toBeLessThan(t64);
    // 128 requests on 64 slots run in two waves: no gain over 64.
    expect(t128 / t64).toBeLessThan(1.02);
    expect(t128 / t64).toBeGreaterThan(0.95);
  });

  it('per-request speed falls as the batch grows', () => {
    const finishMs = (n: number): number => {
      const h = harness();
      for (let i = 0; i < n; i++) h.submit(`r${i}`, 500);
      h.clock.runUntilIdle();
      return Math.max(...h.finished.map((f) => f.atMs));
    };
    const one = finishMs(1);
    const sixteen = finishMs(16);
    const sixtyFour = finishMs(64);
    expect(one).toBeLessThan(sixteen);
    expect(sixteen).toBeLessThan(sixtyFour);
  });

  it('recomputes every completion time when the batch size changes', () => {
    const h = harness();
    h.submit('short', 100);
    h.submit('long', 1000);
    h.clock.runUntilIdle();
    const perRequestAt2 = batchThroughput(2, BASE) / 2;
    const shortEndMs = (100 / perRequestAt2) * 1000;
    // The long one decoded 100 tokens by then, then runs alone at 80 tokens/s.
    const longEndMs = shortEndMs + (900 / 80) * 1000;
    const byId = new Map(h.finished.map((f) => [f.id, f.atMs]));
    expect(byId.get('short')).toBeCloseTo(shortEndMs, 0);
    expect(byId.get('long')).toBeCloseTo(longEndMs, 0);
  });

  it('queues beyond the slot limit and starts waiting requests in FIFO order', () => {
    const h = harness({ maxRunningRequests: 3 });
    for (let i = 0; i < 8; i++) h.submit(`r${i}`, 100 * (i + 1));
    expect(h.model.snapshot()).toMatchObject({ running: 3, queued: 5 });
    expect(h.started).toEqual(['r0', 'r1', 'r2']);
    h.clock.runUntilIdle();
    expect(h.started).toEqual(['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7']);
    expect(h.finished.map((f) => f.id).sort()).toEqual(['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7']);
    expect(h.model.occupancy().maxRunningObserved).toBe(3);
  });

  it('prefills the uncached prompt before decoding', () => {
    const h = harness();
    h.submit('cold', 80, 20_000, 0);
    h.submit('warm', 80, 20_000, 19_000);
    expect(h.model.snapshot().decoding).toBe(0);
    h.clock.advanceTo(100);
    // warm: 1000 uncached tokens = 50 ms of prefill; cold: 1 s.
    expect(h.model.progress('warm')?.phase).toBe('decode');
    expect(h.model.progress('cold')?.phase).toBe('prefill');
    h.clock.runUntilIdle();
    const byId = new Map(h.finished.map((f) => [f.id, f.atMs]));
    expect(byId.get('cold')).toBeGreaterThan(1000);
    expect(byId.get('warm')).toBeLessThan(byId.get('cold') ?? 0);
  });

  it('divides every duration by timeScale', () => {
    const h = harness({ timeScale: 100 });
    h.submit('a', 800, 2000);
    h.clock.runUntilIdle();
    // (2000 / 20000 s prefill + 800 / 80 s decode) / 100
    expect(h.finished[0]?.atMs).toBeCloseTo((0.1 + 10) * 10, 0);
  });

  it('aborts a decoding request with its partial output and frees its slot', () => {
    const h = harness({ maxRunningRequests: 1 });
    h.submit('a', 1000);
    h.submit('b', 40);
    expect(h.model.progress('b')).toEqual({ phase: 'queued', generatedTokens: 0 });
    h.clock.advanceTo(2000);
    expect(h.model.progress('a')).toEqual({ phase: 'decode', generatedTokens: 160 });
    expect(h.model.abort('a')).toEqual({ phase: 'decode', generatedTokens: 160 });
    expect(h.model.snapshot()).toMatchObject({ running: 1, queued: 0 });
    expect(h.model.abort('a')).toBeUndefined();
    h.clock.runUntilIdle();
    expect(h.finished).toEqual([{ id: 'b', atMs: expect.closeTo(2500, 0) as unknown as number, tokens: 40 }]);
  });

  it('aborts a queued request without touching the running ones', () => {
    const h = harness({ maxRunningRequests: 1 });
    h.submit('a', 80);
    h.submit('b', 80);
    expect(h.model.abort('b')).toEqual({ phase: 'queued', generatedTokens: 0 });
    h.clock.runUntilIdle();
    expect(h.finished.map((f) => f.id)).toEqual(['a']);
  });

  it('keeps a time-weighted record of running requests', () => {
    const h = harness({ maxRunningRequests: 4 });
    h.model.resetOccupancy();
    h.submit('a', 800); // 10 s alone...
    h.clock.advanceTo(5000);
    expect(h.model.occupancy().meanRunning).toBeCloseTo(1, 6);
    h.model.abort('a');
    h.clock.advanceTo(10_000);
    // one running for 5 s, none for 5 s
    expect(h.model.occupancy()).toMatchObject({ windowMs: 10_000, maxRunningObserved: 1 });
    expect(h.model.occupancy().meanRunning).toBeCloseTo(0.5, 6);
  });

  it('finishes a request with zero output tokens right after its prefill', () => {
    const h = harness();
    h.submit('z', 0, 2000);
    h.clock.runUntilIdle();
    expect(h.finished).toEqual([{ id: 'z', atMs: expect.closeTo(100, 0) as unknown as number, tokens: 0 }]);
  });

  it('handles thousands of requests with one timer', () => {
    const h = harness({ maxRunningRequests: 256, timeScale: 1000 });
    for (let i = 0; i < 5000; i++) h.submit(`r${i}`, 50 + (i % 200));
    expect(h.clock.pendingTimers()).toBe(1);
    h.clock.runUntilIdle();
    expect(h.finished).toHaveLength(5000);
    expect(h.model.snapshot()).toMatchObject({ running: 0, queued: 0 });
    expect(h.model.occupancy().maxRunningObserved).toBe(256);
  });
});

describe('output model', () => {
  const pool: TokenPool = { words: [100, 101, 102, 103], punctuation: [11, 13], newlines: [198] };
  const plan = (rid: string, maxNewTokens: number, extra: Partial<Parameters<typeof planOutput>[0]> = {}) =>
    planOutput({
      spec: { distribution: 'lognormal', mean: 500, sigma: 0.8 },
      seed: 1,
      rid,
      promptTokens: 10,
      maxNewTokens,
      minNewTokens: 0,
      ignoreEos: false,
      stopTokenIds: [],
      eosTokenId: 151645,
      ...extra,
    });

  it('is deterministic for (seed, rid, prompt length)', () => {
    expect(plan('x', 100_000)).toEqual(plan('x', 100_000));
    const lengths = new Set(Array.from({ length: 20 }, (_, i) => plan(`r${i}`, 100_000).outputTokens));
    expect(lengths.size).toBeGreaterThan(10);
    const p = plan('x', 100_000);
    expect(completionIds(p, pool, 1, 'x', 10, p.outputTokens)).toEqual(
      completionIds(p, pool, 1, 'x', 10, p.outputTokens),
    );
    expect(completionIds(p, pool, 2, 'x', 10, 50)).not.toEqual(completionIds(p, pool, 1, 'x', 10, 50));
  });

  it('ends on the EOS (counted) unless capped by max_new_tokens', () => {
    const p = plan('x', 100_000);
    expect(p.finishReason).toEqual({ type: 'stop', matched: 151645 });
    const ids = completionIds(p, pool, 1, 'x', 10, p.outputTokens);
    expect(ids).toHaveLength(p.outputTokens);
    expect(ids.at(-1)).toBe(151645);
    expect(ids.slice(0, -1).every((id) => [...pool.words, ...pool.punctuation, ...pool.newlines].includes(id))).toBe(
      true,
    );
    const capped = plan('x', 3);
    expect(capped).toMatchObject({ outputTokens: 3, finishReason: { type: 'length', length: 3 } });
    expect(completionIds(capped, pool, 1, 'x', 10, 3)).not.toContain(151645);
    expect(plan('x', 64, { ignoreEos: true })).toMatchObject({
      outputTokens: 64,
      finishReason: { type: 'length', length: 64 },
    });
    // The EOS drawn exactly at max_new_tokens: SGLang checks the length first.
    const exact = plan('x', p.outputTokens);
    expect(exact).toMatchObject({
      outputTokens: p.outputTokens,
      finishReason: { type: 'length', length: p.outputTokens },
    });
    expect(completionIds(exact, pool, 1, 'x', 10, exact.outputTokens).at(-1)).toBe(151645);
    expect(plan('x', 100_000, { stopTokenIds: [13] }).finishReason).toEqual({ type: 'stop', matched: 13 });
  });

  it('draws lognormal lengths with the requested mean', () => {
    const rng = mulberry32(42);
    const n = 20_000;
    let sum = 0;
    for (let i = 0; i < n; i++) sum += sampleOutputLength({ distribution: 'lognormal', mean: 2700, sigma: 0.8 }, rng);
    expect(sum / n).toBeGreaterThan(2700 * 0.95);
    expect(sum / n).toBeLessThan(2700 * 1.05);
    expect(sampleOutputLength({ distribution: 'fixed', mean: 77 }, rng)).toBe(77);
    for (let i = 0; i < 100; i++) {
      const v = sampleOutputLength({ distribution: 'uniform', mean: 10, min: 5, max: 15 }, rng);
      expect(v).toBeGreaterThanOrEqual(5);
      expect(v).toBeLessThanOrEqual(15);
    }
  });
});

describe('faults and prefix cache', () => {
  it('injects faults at the configured rates, burst503 first', () => {
    const f = new FaultInjector(3, { burst503: 2 });
    expect([f.next(), f.next(), f.next()]).toEqual(['unavailable', 'unavailable', 'none']);
    f.set({ errorRate: 0.25, dropRate: 0.25 });
    const counts = new Map<string, number>();
    for (let i = 0; i < 4000; i++) {
      const k = f.next();
      counts.set(k, (counts.get(k) ?? 0) + 1);
    }
    expect(counts.get('error')).toBeGreaterThan(850);
    expect(counts.get('drop')).toBeGreaterThan(850);
    expect(counts.get('none')).toBeGreaterThan(1800);
    expect(counts.has('hang')).toBe(false);
    f.clear();
    expect(f.next()).toBe('none');
    expect(() => validateFaults({ errorRate: 1.5 })).toThrow(RangeError);
    expect(() => validateFaults({ errorRate: 0.6, hangRate: 0.6 })).toThrow(RangeError);
  });

  it('reports a shared prompt prefix as cached, in whole blocks', () => {
    const cache = new PrefixCache(16);
    const system = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(cache.lookupAndInsert([...system, 500, 501])).toBe(0);
    expect(cache.lookupAndInsert([...system, 900, 901, 902])).toBe(96);
    expect(cache.lookupAndInsert([7, ...system])).toBe(0);
    cache.clear();
    expect(cache.lookupAndInsert([...system, 500, 501])).toBe(0);
  });
});
