// Endpoint health beyond the worker process: each inference worker's EndpointPool publishes its
// endpoints' state to Redis (on change and periodically); status, the progress line and the stall
// watchdog read it. Real simulator over HTTP, real Redis. A worker that stops withdraws its
// view; one that can no longer reach Redis has its view expire.
import type { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { formatProgressLine } from '../../src/cli/progress.js';
import { RunKeys, readEndpointHealth, readRunStatus, type EndpointHealthSummary } from '../../src/shared/index.js';
import { EndpointPool } from '../../src/workers/inference/endpoint-pool.js';
import { waitFor } from '../helpers/pipeline.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';

const INTERVAL_MS = 100;

const { redis, sim } = useHarness({ redis: true, sim: { timeScale: 100, seed: 3 } });

function pool(conn: Redis, keys: RunKeys, workerId: string): EndpointPool {
  return new EndpointPool({
    endpoints: [sim.url],
    concurrency: 4,
    requestTimeoutMs: 10_000,
    healthCheckIntervalMs: 50,
    probeInitialMs: 50,
    probeMaxMs: 100,
    publish: { redis: conn, keys, workerId, intervalMs: INTERVAL_MS },
    logger: quietLogger(),
  });
}

describe('endpoint health published by the inference workers', () => {
  it('goes down and up with the server, refreshes, and is withdrawn on stop or expires when a worker goes silent', async () => {
    const keys = new RunKeys(redis.prefix, 'health');
    const reader = redis.connection('client');
    const health = (): Promise<EndpointHealthSummary> => readEndpointHealth(reader, keys, [sim.url]);
    const connA = redis.connection('client');
    const connB = redis.connection('client');
    const a = pool(connA, keys, 'host-a:1');
    const b = pool(connB, keys, 'host-b:2');
    try {
      await Promise.all([a.start(), b.start()]);
      // Published at start, by both workers.
      expect(await health()).toMatchObject({
        total: 1,
        healthy: 1,
        reported: 1,
        endpoints: [{ url: sim.url, up: true, reason: null, workers: 2 }],
      });

      // Refreshed periodically: a report outlives its own expiry (three intervals).
      const first = JSON.parse((await reader.hget(keys.endpointHealth(), `host-a:1 ${sim.url}`)) ?? '{}') as {
        updatedMs: number;
        expiresMs: number;
      };
      expect(first.expiresMs - first.updatedMs).toBe(3 * INTERVAL_MS);
      await waitFor(async () => {
        const now = JSON.parse((await reader.hget(keys.endpointHealth(), `host-a:1 ${sim.url}`)) ?? '{}') as {
          updatedMs: number;
        };
        return now.updatedMs > first.expiresMs;
      }, 'a refreshed report');
      expect((await health()).healthy).toBe(1);

      // The server turns unhealthy: the workers' health checks take it out, and say why.
      sim.setFaults({ unhealthy: true });
      const down = await waitFor(async () => {
        const h = await health();
        return h.healthy === 0 && h.reported === 1 ? h : undefined;
      }, 'the endpoint reported down');
      expect(down?.endpoints[0]).toMatchObject({
        up: false,
        reason: `GET /health on ${sim.url} answered 503`,
        workers: 2,
      });

      // The progress line of `run` says why nothing moves.
      const cfg = {
        run: 'health',
        datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 1000 }],
        sglang: { endpoints: [sim.url] },
      } as never;
      await reader.hset(keys.stats('alpha'), 'status', 'in_progress');
      const line = formatProgressLine(await readRunStatus(reader, keys, cfg), 12);
      expect(line).toBe(
        `[12s] generate: 0/1 datasets completed, 0 tokens, 0 in flight, 0 tok/s, ETA unknown; waiting: 0/1 endpoints healthy (GET /health on ${sim.url} answered 503)`,
      );

      // Healthy again: back in rotation, with a new "since".
      const downSince = down?.endpoints[0]?.sinceMs ?? 0;
      sim.clearFaults();
      const up = await waitFor(async () => {
        const h = await health();
        return h.healthy === 1 ? h : undefined;
      }, 'the endpoint reported up again');
      expect(up?.endpoints[0]?.sinceMs).toBeGreaterThan(downSince);
      expect(formatProgressLine(await readRunStatus(reader, keys, cfg), 13)).not.toMatch(/waiting/);

      // One worker stops cleanly: its view is withdrawn at once, the other's stays.
      await a.stop();
      expect(await reader.hexists(keys.endpointHealth(), `host-a:1 ${sim.url}`)).toBe(0);
      expect((await health()).endpoints[0]).toMatchObject({ up: true, workers: 1 });

      // The other can no longer reach Redis (as if killed or cut off): its view expires.
      connB.disconnect();
      await waitFor(async () => (await health()).reported === 0, "the silent worker's view expired");
      expect(await health()).toMatchObject({ healthy: 0, reported: 0, endpoints: [{ up: null, workers: 0 }] });
    } finally {
      await a.stop();
      await b.stop();
    }
  });

  it('an endpoint is healthy while any live worker has it in rotation', async () => {
    const keys = new RunKeys(redis.prefix, 'mixed');
    const conn = redis.connection('client');
    const now = Date.now();
    const url = 'http://127.0.0.1:1';
    await conn.hset(
      keys.endpointHealth(),
      `w1 ${url}`,
      JSON.stringify({
        url,
        up: false,
        reason: 'connect ECONNREFUSED',
        sinceMs: now - 5_000,
        worker: 'w1',
        updatedMs: now,
        expiresMs: now + 10_000,
      }),
      `w2 ${url}`,
      JSON.stringify({
        url,
        up: true,
        reason: null,
        sinceMs: now - 9_000,
        worker: 'w2',
        updatedMs: now,
        expiresMs: now + 10_000,
      }),
      // Long dead (expired ten minutes ago and more): deleted by the reader.
      `w3 ${url}`,
      JSON.stringify({
        url,
        up: true,
        reason: null,
        sinceMs: 0,
        worker: 'w3',
        updatedMs: 0,
        expiresMs: now - 11 * 60_000,
      }),
      'garbage',
      'not json',
    );
    const h = await readEndpointHealth(conn, keys, [url, 'http://127.0.0.1:2/']);
    expect(h).toMatchObject({ total: 2, healthy: 1, reported: 1 });
    expect(h.endpoints).toEqual([
      { url, up: true, reason: null, sinceMs: now - 9_000, workers: 2 },
      { url: 'http://127.0.0.1:2/', up: null, reason: null, sinceMs: null, workers: 0 },
    ]);
    expect((await conn.hkeys(keys.endpointHealth())).sort()).toEqual([`w1 ${url}`, `w2 ${url}`]);
  });
});
