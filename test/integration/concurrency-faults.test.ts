// sglang.concurrency: auto at its worst moments: controllers of many processes starting at the
// same instant (exactly one steers; a clean stop hands over at once), and a server outage while
// it steers (the value is kept, nothing is measured across the outage).
import { describe, expect, it } from 'vitest';
import { RunKeys, endpointConcurrencyKey, parseEndpointConcurrency } from '../../src/shared/index.js';
import { ConcurrencyController } from '../../src/workers/inference/concurrency-controller.js';
import { ServerLoadProbe } from '../../src/workers/inference/concurrency-probe.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';
import { waitFor } from '../helpers/pipeline.js';

const { redis, sim } = useHarness({ redis: true, sim: { timeScale: 20, maxRunningRequests: 16, seed: 9 } });

function controllers(keys: RunKeys, n: number): ConcurrencyController[] {
  return Array.from(
    { length: n },
    (_, i) =>
      new ConcurrencyController({
        redis: redis.connection('client'),
        keys,
        endpoint: sim.url,
        workerId: `host:${1000 + i}`,
        bounds: { min: 2, max: 64, maxQueued: 4 },
        start: 8,
        intervalMs: 500,
        reader: new ServerLoadProbe(sim.url),
        sampleMs: 50,
        leaseTtlMs: 1_000,
        refreshMs: 100,
        logger: quietLogger(),
      }),
  );
}

describe('sglang.concurrency: auto at its worst moments', () => {
  it('of controllers started at the same instant, exactly one steers at any time; a clean stop hands over at once', async () => {
    const keys = new RunKeys(redis.prefix, 'race');
    const all = controllers(keys, 5);
    for (const c of all) c.start();
    try {
      await waitFor(() => all.some((c) => c.steering), 'a controller steering', 10_000, 10);
      const deadline = Date.now() + 1_500;
      while (Date.now() < deadline) {
        expect(all.filter((c) => c.steering).length).toBeLessThanOrEqual(1);
        await new Promise((r) => setTimeout(r, 10));
      }
      const holder = all.findIndex((c) => c.steering);
      expect(holder).toBeGreaterThanOrEqual(0);
      const record = parseEndpointConcurrency(
        await redis.connection('client').hgetall(endpointConcurrencyKey(keys, sim.url)),
      );
      expect(record?.controller).toBe(`host:${1000 + holder}`);

      const stoppedAt = Date.now();
      await all[holder]?.stop();
      await waitFor(() => all.some((c, i) => i !== holder && c.steering), 'another controller steering', 10_000, 10);
      // Handed back, not lapsed: well within the 1 s lease TTL.
      expect(Date.now() - stoppedAt).toBeLessThan(1_000);
      expect(all.filter((c) => c.steering).length).toBe(1);
    } finally {
      await Promise.all(all.map((c) => c.stop()));
    }
  });

  it('keeps the value through a server outage: nothing is measured across it', async () => {
    const keys = new RunKeys(redis.prefix, 'outage');
    const [c] = controllers(keys, 1);
    if (c === undefined) throw new Error('no controller');
    const conn = redis.connection('client');
    await conn.hset(endpointConcurrencyKey(keys, sim.url), { cap: 24 });
    c.start();
    try {
      await waitFor(() => c.steering, 'steering', 10_000, 10);
      const before = parseEndpointConcurrency(await conn.hgetall(endpointConcurrencyKey(keys, sim.url)));
      expect(before?.cap).toBe(24);
      expect(before?.reason).toBe('resumed from the last value chosen');
      await sim.outage(2_000);
      const deadline = Date.now() + 1_900;
      while (Date.now() < deadline) {
        const r = parseEndpointConcurrency(await conn.hgetall(endpointConcurrencyKey(keys, sim.url)));
        expect(r?.cap).toBe(24);
        // Nothing measured: the record is as it was, or says the load cannot be read (kept at 24).
        if (r?.updatedMs !== before?.updatedMs)
          expect(r?.reason).toMatch(/^cannot read the server's load .*kept at 24$/);
        await new Promise((res) => setTimeout(res, 50));
      }
      // Back up, with nothing in flight: it measures again and holds (demand, not the cap, limits).
      const after = await waitFor(
        async () => {
          const r = parseEndpointConcurrency(await conn.hgetall(endpointConcurrencyKey(keys, sim.url)));
          const measured = r !== undefined && !/cannot read|readable again/.test(r.reason ?? '');
          return measured && r.updatedMs !== before?.updatedMs ? r : undefined;
        },
        'a measurement after the outage',
        15_000,
        50,
      );
      expect(after?.cap).toBe(24);
      expect(after?.reason).toMatch(/fewer requests ready/);
    } finally {
      await c.stop();
    }
  });
});
