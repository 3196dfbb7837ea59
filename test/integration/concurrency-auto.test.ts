// sglang.concurrency: auto against a real simulator, with the generation stage in this process:
// it raises while the server's queue is empty and throughput rises, steps back when the server
// queues or answers 503, and `status` shows the value it chose.
import { beforeAll, describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import {
  endpointConcurrencyKey,
  formatRunStatus,
  parseEndpointConcurrency,
  readRunStatus,
  type EndpointConcurrency,
} from '../../src/shared/index.js';
import { loadTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { waitFor, writePrompts } from '../helpers/pipeline.js';

const {
  redis,
  tmp,
  startSim: sim,
} = useHarness({
  redis: true,
  tmp: true,
  simDefaults: { timeScale: 20, seed: 3, outputLength: { distribution: 'lognormal', mean: 1500, sigma: 0.5 } },
});

beforeAll(() => {
  writePrompts(tmp.dir, 'auto', 3_000);
});

interface Running {
  ctx: RunContext;
  /** Every distinct value of the endpoint's concurrency record seen while polling. */
  seen: EndpointConcurrency[];
  current(): Promise<EndpointConcurrency | undefined>;
  stop(): Promise<void>;
}

/** Runs generation with `concurrency: auto`, polling the endpoint's record every 100 ms. */
async function runAuto(
  run: string,
  s: SimulatorHandle,
  auto: Record<string, number>,
  more: SimulatorHandle[] = [],
): Promise<Running> {
  const cfg = loadTestConfig(tmp.dir, {
    run,
    redis,
    sim: [s.url, ...more.map((m) => m.url)],
    sglang: { concurrency: 'auto', autoConcurrency: { min: 4, max: 512, intervalMs: 600, maxQueued: 4, ...auto } },
    dataset: { prompts: 'auto.jsonl', maxNewTokens: 8192, batchSize: 16 },
    output: { dir: `out-${run}` },
    workers: { shutdownGraceMs: 500 },
  });
  const ctx = await openRunContextFor(cfg);
  const handle = await startGeneration(ctx, { produce: true, infer: true });
  handle.finished.catch(() => undefined);
  const key = endpointConcurrencyKey(ctx.keys, s.url);
  const seen: EndpointConcurrency[] = [];
  const current = async (): Promise<EndpointConcurrency | undefined> =>
    parseEndpointConcurrency(await ctx.redis.hgetall(key));
  const poll = setInterval(() => {
    void current()
      .then((c) => {
        const last = seen[seen.length - 1];
        if (c !== undefined && (last === undefined || last.updatedMs !== c.updatedMs)) seen.push(c);
      })
      .catch(() => undefined);
  }, 100);
  return {
    ctx,
    seen,
    current,
    async stop() {
      clearInterval(poll);
      await handle.stop();
      await ctx.close();
    },
  };
}

/** Waits until the value has not changed for `quietMs`, and returns it. */
async function settled(r: Running, quietMs: number, timeoutMs: number): Promise<EndpointConcurrency> {
  let last: number | undefined;
  let since = Date.now();
  const value = await waitFor(
    async () => {
      const c = await r.current();
      if (c === undefined) return undefined;
      if (c.cap !== last) {
        last = c.cap;
        since = Date.now();
      }
      return Date.now() - since >= quietMs ? c : undefined;
    },
    'the chosen concurrency to settle',
    timeoutMs,
    100,
  );
  if (value === undefined) throw new Error('no concurrency record');
  return value;
}

describe('sglang.concurrency: auto against the simulator', () => {
  it("raises while the queue is empty and throughput rises, stops at the server's running limit, and status shows the value", async () => {
    const s = await sim({ maxRunningRequests: 48, singleRequestTokensPerSec: 50, peakTokensPerSec: 1_500 });
    const r = await runAuto('raise', s, { start: 8 });
    try {
      const final = await settled(r, 4_000, 90_000);
      const raises = r.seen.filter((c) => c.reason.startsWith('raised'));
      expect(raises.length).toBeGreaterThanOrEqual(5);
      // Each raise after the first was judged on a throughput that rose with the requests in flight.
      const rising = raises.map((c) => /throughput (\d+) → (\d+)/.exec(c.reason)).filter((m) => m !== null);
      expect(rising.length).toBeGreaterThanOrEqual(3);
      for (const m of rising) expect(Number(m[2])).toBeGreaterThan(Number(m[1]));
      // Enough to fill the server's 48 slots, not the 512 allowed: beyond them requests only queue.
      expect(final.cap).toBeGreaterThanOrEqual(48);
      expect(final.cap).toBeLessThanOrEqual(48 + 16);
      expect(s.stats().queued).toBeLessThanOrEqual(16);
      expect(final.controller).toMatch(/:\d+$/);

      const status = await readRunStatus(r.ctx.redis, r.ctx.keys, r.ctx.config);
      const cap = (await r.current())?.cap;
      expect(status.endpoints.endpoints[0]?.concurrency?.cap).toBe(cap);
      expect(formatRunStatus(status)).toContain(`${s.url}: concurrency auto ${cap} (`);
    } finally {
      await r.stop();
    }
  }, 150_000);

  it('goes back when more requests in flight stop raising throughput, though the server does not queue', async () => {
    // Throughput peaks near 27 decoding and falls beyond (a server short of KV cache); 128 could run.
    const s = await sim({
      maxRunningRequests: 128,
      singleRequestTokensPerSec: 50,
      peakTokensPerSec: 1_500,
      declineAboveBatch: 24,
      declinePerRequest: 0.02,
    });
    const r = await runAuto('plateau', s, { start: 8 });
    try {
      const back = await waitFor(
        async () => {
          const c = await r.current();
          return c !== undefined && c.reason.startsWith('went back') ? c : undefined;
        },
        'a step back on flat throughput',
        90_000,
        50,
      );
      expect(back?.cap).toBeGreaterThanOrEqual(16);
      expect(back?.cap).toBeLessThanOrEqual(40);
      expect(r.seen.every((c) => c.cap <= 64)).toBe(true);
      expect(r.seen.every((c) => !/queues more than|503/.test(c.reason))).toBe(true);
      expect(s.stats().queued).toBe(0);
    } finally {
      await r.stop();
    }
  }, 150_000);

  it('steps back to the running requests plus a short queue when the server queues', async () => {
    const s = await sim({ maxRunningRequests: 8 });
    const r = await runAuto('queue', s, { start: 64 });
    try {
      const back = await waitFor(
        async () => {
          const c = await r.current();
          return c !== undefined && c.cap <= 16 ? c : undefined;
        },
        'a step back',
        60_000,
        50,
      );
      expect(back?.reason).toMatch(/queues more than 4/);
      expect(back?.queued).toBeGreaterThan(4);
      const final = await settled(r, 3_000, 60_000);
      expect(final.cap).toBeGreaterThanOrEqual(8);
      expect(final.cap).toBeLessThanOrEqual(16);
    } finally {
      await r.stop();
    }
  }, 150_000);

  it('steps back when the server answers 503 (its queue is full)', async () => {
    const s = await sim({ maxRunningRequests: 8, maxQueuedRequests: 4 });
    const r = await runAuto('overload', s, { start: 64, maxQueued: 16 });
    try {
      await waitFor(() => r.seen.some((c) => /503/.test(c.reason)), 'a step back on 503', 60_000, 100);
      const after = r.seen.find((c) => /503/.test(c.reason));
      expect(after?.overloads).toBeGreaterThan(0);
      expect(after?.cap).toBeLessThan(64);
      expect(s.stats().failed).toBeGreaterThan(0);
    } finally {
      await r.stop();
    }
  }, 150_000);

  it('steers each endpoint on its own: two servers of different sizes get their own values, and each keeps to its own', async () => {
    const small = await sim({ maxRunningRequests: 6 });
    const large = await sim({ maxRunningRequests: 30 });
    const r = await runAuto('two', small, { start: 4 }, [large]);
    const capOf = async (url: string): Promise<number | undefined> =>
      parseEndpointConcurrency(await r.ctx.redis.hgetall(endpointConcurrencyKey(r.ctx.keys, url)))?.cap;
    try {
      await waitFor(
        async () => ((await capOf(large.url)) ?? 0) >= 30,
        "the large server's value to reach its running limit",
        90_000,
        100,
      );
      // Every lease on each endpoint stays within that endpoint's value (plus what a step back leaves draining).
      const deadline = Date.now() + 3_000;
      let sawBoth = false;
      while (Date.now() < deadline) {
        const [capSmall, capLarge, leasesSmall, leasesLarge] = await Promise.all([
          capOf(small.url),
          capOf(large.url),
          r.ctx.redis.zcard(r.ctx.keys.endpointLeases(small.url)),
          r.ctx.redis.zcard(r.ctx.keys.endpointLeases(large.url)),
        ]);
        expect(capSmall).toBeLessThanOrEqual(6 + 8);
        expect(leasesSmall).toBeLessThanOrEqual(6 + 8);
        expect(leasesLarge).toBeLessThanOrEqual((capLarge ?? 0) * 1.25 + 1);
        if (leasesSmall > 0 && leasesLarge > 6 + 8) sawBoth = true;
        await new Promise((res) => setTimeout(res, 100));
      }
      expect(sawBoth).toBe(true);
      expect(small.stats().maxRunningObserved).toBe(6);
      expect(large.stats().maxRunningObserved).toBeGreaterThanOrEqual(28);
    } finally {
      await r.stop();
    }
  }, 150_000);
});
