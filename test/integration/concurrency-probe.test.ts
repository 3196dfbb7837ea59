// The load probe of `sglang.concurrency: auto` against a server shaped like SGLang 0.5.23 on a
// real loopback socket: `/get_load` answers 404 (the route is `/v1/loads`), and `/metrics`
// answers 200 without the request gauges for a moment after a start or a restart. The probe
// must keep reading (from `/v1/loads`) and go back to `/metrics` once it has the gauges again,
// never giving up on it for good.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ServerLoadProbe } from '../../src/workers/inference/concurrency-probe.js';

/** What the fake server answers; the test changes it between readings. */
const state = { gauges: false, running: 3, queued: 1, hits: [] as string[] };
let server: Server;
let url: string;

beforeAll(async () => {
  server = createServer((req, res) => {
    state.hits.push(req.url ?? '');
    if (req.url === '/metrics') {
      const body = state.gauges
        ? `sglang:num_running_reqs{tp_rank="0"} ${state.running}\nsglang:num_queue_reqs{tp_rank="0"} ${state.queued}\nsglang:generation_tokens_total{tp_rank="0"} 1234\n`
        : '# HELP python_gc_objects_collected_total Objects collected during gc\n';
      res.writeHead(200, { 'content-type': 'text/plain' }).end(body);
    } else if (req.url === '/v1/loads') {
      const loads = [
        { dp_rank: 0, num_reqs: state.running + state.queued, num_waiting_reqs: state.queued, num_tokens: 10 },
      ];
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ loads }));
    } else {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe('ServerLoadProbe on a server that is still starting (SGLang 0.5.23 routes)', () => {
  it('reads /v1/loads where /get_load is 404, and returns to /metrics once the gauges appear', async () => {
    let clock = 0;
    const probe = new ServerLoadProbe(url, { metricsRetryMs: 1_000, now: () => clock });
    state.gauges = false;
    state.hits.length = 0;

    const first = await probe.read();
    expect(first).toMatchObject({ running: 3, queued: 1, generationTokensTotal: null });
    expect(state.hits).toEqual(['/metrics', '/get_load', '/v1/loads']);
    expect(probe.readsMetrics).toBe(false);

    // Within the retry interval: the load route that answered, and nothing else.
    state.hits.length = 0;
    clock += 500;
    await probe.read();
    expect(state.hits).toEqual(['/v1/loads']);

    // The server is up now: after the interval the gauges are read again.
    state.gauges = true;
    state.running = 7;
    state.hits.length = 0;
    clock += 600;
    const back = await probe.read();
    expect(back).toMatchObject({ running: 7, queued: 1, generationTokensTotal: 1234 });
    expect(state.hits).toEqual(['/metrics']);
    expect(probe.readsMetrics).toBe(true);

    // A restart: the gauges vanish for a moment, and come back.
    state.gauges = false;
    state.hits.length = 0;
    clock += 10;
    expect(await probe.read()).toMatchObject({ running: 7, generationTokensTotal: null });
    expect(state.hits).toEqual(['/metrics', '/v1/loads']);
    state.gauges = true;
    clock += 1_000;
    expect((await probe.read()).generationTokensTotal).toBe(1234);
  });

  it("with the default retry, a restarted server's gauges are read again within a second, then the wait doubles up to 30 s", async () => {
    let clock = 0;
    const probe = new ServerLoadProbe(url, { now: () => clock });
    state.gauges = false;
    state.hits.length = 0;
    await probe.read();
    expect(state.hits).toEqual(['/metrics', '/get_load', '/v1/loads']);
    // Retries of /metrics after 1 s, then 2 s, 4 s, … while the gauges stay missing.
    const retriedAt: number[] = [];
    for (let t = 0; t < 70_000; t += 250) {
      clock = t;
      state.hits.length = 0;
      await probe.read();
      if (state.hits.includes('/metrics')) retriedAt.push(t);
    }
    expect(retriedAt.slice(0, 5)).toEqual([1_000, 3_000, 7_000, 15_000, 31_000]);
    expect(retriedAt[5]).toBe(61_000);
    // The gauges back (the server scheduled its first batch): read at the next retry, and the wait starts from 1 s again.
    state.gauges = true;
    clock = 91_000;
    expect((await probe.read()).generationTokensTotal).toBe(1234);
    state.gauges = false;
    clock = 91_010;
    await probe.read();
    state.gauges = true;
    state.hits.length = 0;
    clock = 92_010;
    expect((await probe.read()).generationTokensTotal).toBe(1234);
    expect(state.hits).toEqual(['/metrics']);
  });

  it('names the endpoint and the routes when no route has a reading', async () => {
    const probe = new ServerLoadProbe(`${url}/nothing-here`);
    await expect(probe.read()).rejects.toThrow(
      /nothing-here: no load reading .*\/get_load and \/v1\/loads answered 404/,
    );
  });
});
