// `concurrency: auto` while the server's load cannot be read (a server restarting, or one whose
// load routes answer errors): it was silent, and `status` kept the value and reason from before
// the outage. Now a warning at once, then one every `loadFailureReportMs` (never one per
// sample), the reason in the endpoint's concurrency hash says so, and its end is said too.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RunKeys, endpointConcurrencyKey, parseEndpointConcurrency } from '../../src/shared/index.js';
import { ConcurrencyController } from '../../src/workers/inference/concurrency-controller.js';
import { ServerLoadProbe } from '../../src/workers/inference/concurrency-probe.js';
import { useHarness } from '../helpers/fixture.js';
import { waitFor } from '../helpers/pipeline.js';

const { redis } = useHarness({ redis: true });
const state = { broken: false };
let server: Server;
let url: string;

beforeAll(async () => {
  server = createServer((req, res) => {
    if (state.broken) {
      res.writeHead(500, { 'content-type': 'application/json' }).end('{"detail":"Internal Server Error"}');
    } else if (req.url === '/metrics') {
      res
        .writeHead(200, { 'content-type': 'text/plain' })
        .end('sglang:num_running_reqs 2\nsglang:num_queue_reqs 0\nsglang:generation_tokens_total 100\n');
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe('the load of the server cannot be read', () => {
  it('is logged once, then every loadFailureReportMs, shown as the reason, and its end is logged', async () => {
    const lines: { level: number; msg: string }[] = [];
    const logger = pino(
      { level: 'info' },
      new Writable({
        write: (chunk: Buffer, _e, cb) => (
          lines.push(JSON.parse(chunk.toString()) as { level: number; msg: string }),
          cb()
        ),
      }),
    );
    const keys = new RunKeys('tm-test', 'unreadable');
    const controller = new ConcurrencyController({
      redis: redis.connection('client'),
      keys,
      endpoint: url,
      workerId: 'host:1',
      bounds: { min: 2, max: 64, maxQueued: 4 },
      start: 8,
      intervalMs: 500,
      reader: new ServerLoadProbe(url),
      sampleMs: 50,
      leaseTtlMs: 1_000,
      refreshMs: 100,
      loadFailureReportMs: 1_000,
      logger,
    });
    const r = redis.connection('client');
    const reason = async (): Promise<string> =>
      parseEndpointConcurrency(await r.hgetall(endpointConcurrencyKey(keys, url)))?.reason ?? '';
    controller.start();
    try {
      await waitFor(async () => (await reason()) !== '', 'the controller steering', 10_000);
      state.broken = true;
      await waitFor(
        async () => (await reason()).startsWith("cannot read the server's load since "),
        'the reason in the hash',
        10_000,
      );
      expect(await reason()).toContain('kept at 8');
      const loadWarnings = () => lines.filter((l) => l.level === 40 && /read the server's load/.test(l.msg));
      const sinceMs = Date.now();
      await waitFor(() => loadWarnings().length >= 2, 'the second warning, a second after the first', 5_000);
      const warnings = loadWarnings();
      // ~20 samples a second: one line at once, then one a second, not one a sample.
      expect(warnings.length, JSON.stringify(warnings)).toBeLessThanOrEqual(
        2 + Math.ceil((Date.now() - sinceMs) / 1_000),
      );
      expect(warnings[0]?.msg).toBe("cannot read the server's load; the requests in flight stay as they are");
      expect(warnings[1]?.msg).toMatch(/^still cannot read the server's load \(for \d+ s\)/);
      state.broken = false;
      await waitFor(
        () => lines.some((l) => l.level === 40 && /server load readable again/.test(l.msg)),
        'the end said',
        10_000,
      );
      expect(await reason()).not.toContain('cannot read');
    } finally {
      await controller.stop();
      state.broken = false;
    }
  }, 30_000);
});
