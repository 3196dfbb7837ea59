// SglangClient against the SGLang simulator (real HTTP over loopback), plus a few literal
// node:http servers for response shapes the simulator does not produce.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';

import { CancelledError, TimeoutError, UnavailableError, UpstreamHttpError } from '../../src/shared/errors.js';
import {
  EndpointMisconfiguredError,
  SglangBadRequestError,
  SglangClient,
  type SglangClientOptions,
  SglangResponseFormatError,
} from '../../src/shared/sglang/index.js';
import { type SimulatorHandle, type SimulatorOptions } from '../../src/sim/index.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';

// ---------------------------------------------------------------------------------------------
// helpers

/** Polls `cond` until it holds or `timeoutMs` passes (then fails with `what`). */
async function waitFor(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Marks promises as handled, so that ones a failed test never awaits do not surface later. */
function handled<T extends Promise<unknown>>(ps: T[]): T[] {
  for (const p of ps) p.catch(() => undefined);
  return ps;
}
function handledOne<T>(p: Promise<T>): Promise<T> {
  p.catch(() => undefined);
  return p;
}

/** Resolves with what `p` rejected with; fails the test if it resolved. */
async function rejectionOf(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e: unknown) {
    return e;
  }
  throw new Error('expected the promise to reject, but it resolved');
}

const clients: SglangClient[] = [];
function client(endpoint: string, options: Partial<SglangClientOptions> = {}): SglangClient {
  const c = new SglangClient({
    endpoint,
    concurrency: 8,
    requestTimeoutMs: 30_000,
    logger: quietLogger(),
    ...options,
  });
  clients.push(c);
  return c;
}

const { startSim: sim } = useHarness({ simDefaults: { seed: 7 } });

/** A literal HTTP server: every request is recorded, `handle` answers (or never does). */
interface LiteralServer {
  url: string;
  seen: Array<{ method: string; url: string; body: string }>;
  close(): Promise<void>;
}
async function literalServer(
  handle: (req: IncomingMessage, res: ServerResponse, body: string) => void,
): Promise<LiteralServer> {
  const seen: LiteralServer['seen'] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      seen.push({ method: req.method ?? '', url: req.url ?? '', body });
      handle(req, res, body);
    });
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
const literals: LiteralServer[] = [];
async function literal(
  handle: (req: IncomingMessage, res: ServerResponse, body: string) => void,
): Promise<LiteralServer> {
  const s = await literalServer(handle);
  literals.push(s);
  return s;
}

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

const prompt = (n: number): number[] => Array.from({ length: n }, (_, i) => 100 + (i % 1000));

// Every simulator this file needs, started in parallel (each loads a real tokenizer).
const FAST: SimulatorOptions = {
  timeScale: 1000,
  contextLength: 4096,
  outputLength: { distribution: 'fixed', mean: 20 },
};
let fast: SimulatorHandle;
let rc1: SimulatorHandle;
let old: SimulatorHandle;
let slow: SimulatorHandle;
let flaky: SimulatorHandle;
beforeAll(async () => {
  [fast, rc1, old, slow, flaky] = await Promise.all([
    sim(FAST),
    sim({ ...FAST, version: '0.5.2rc1' }),
    sim({ ...FAST, version: '0.4.10' }),
    // 4000-token completions at 80 tok/s: far longer than any test waits.
    sim({ timeScale: 1, maxRunningRequests: 64, outputLength: { distribution: 'fixed', mean: 4000 } }),
    // Its own, for the outage.
    sim(FAST),
  ]);
});

afterAll(async () => {
  await Promise.allSettled(clients.map((c) => c.destroy()));
  await Promise.allSettled(literals.map((s) => s.close()));
});

// ---------------------------------------------------------------------------------------------
// the simulator, fast: 20-token completions, 1000x simulated time

describe('SglangClient against the simulator', () => {
  let c: SglangClient;

  beforeAll(() => {
    c = client(fast.url);
  });
  afterEach(() => {
    fast.clearFaults();
  });

  it('generates: ids and counts agree, a stop on EOS ends with the stop token', async () => {
    const r = await c.generate({
      inputIds: prompt(30),
      maxNewTokens: 100,
      samplingParams: { temperature: 0.6 },
      rid: 'eos-1',
    });
    expect(r.finishReason.type).toBe('stop');
    expect(r.completionTokens).toBe(20);
    expect(r.outputIds).toHaveLength(20);
    expect(r.promptTokens).toBe(30);
    expect(r.droppedLeadingIds).toBe(0);
    if (r.finishReason.type !== 'stop') return;
    expect(typeof r.finishReason.matched).toBe('number');
    expect(r.outputIds.at(-1)).toBe(r.finishReason.matched);
    expect(r.metaInfo['id']).toBe('eos-1');
    const seen = fast.stats().requests.find((q) => q.rid === 'eos-1');
    expect(seen).toMatchObject({ route: '/generate', promptTokens: 30, maxNewTokens: 100 });
  });

  it('generates: stops with length at max_new_tokens', async () => {
    const r = await c.generate({ inputIds: prompt(12), maxNewTokens: 5, rid: 'len-1' });
    expect(r.finishReason).toEqual({ type: 'length', length: 5 });
    expect(r.completionTokens).toBe(5);
    expect(r.outputIds).toHaveLength(5);
  });

  it('chats through /v1/chat/completions with rid and max_tokens', async () => {
    const r = await c.chat({
      messages: [{ role: 'user', content: 'What is 2+2?' }],
      maxNewTokens: 64,
      samplingParams: { temperature: 0.6, top_p: 0.95 },
      rid: 'chat-1',
      chatTemplateKwargs: { enable_thinking: false },
    });
    expect(r.finishReason).toBe('stop');
    expect(r.completionTokens).toBe(20);
    expect(r.promptTokens).toBeGreaterThan(0);
    expect(typeof r.content).toBe('string');
    expect(r.raw['object']).toBe('chat.completion');
    const seen = fast.stats().requests.find((q) => q.rid === 'chat-1');
    expect(seen).toMatchObject({ route: '/v1/chat/completions', maxNewTokens: 64 });
  });

  it('turns a prompt longer than the context into a non-retryable SglangBadRequestError', async () => {
    const e = await rejectionOf(c.generate({ inputIds: prompt(5000), maxNewTokens: 10, rid: 'long-1' }));
    expect(e).toBeInstanceOf(SglangBadRequestError);
    const bad = e as SglangBadRequestError;
    expect(bad.retryable).toBe(false);
    expect(bad.status).toBe(400);
    expect(bad.contextLengthExceeded).toBe(true);
    expect(bad.sglangMessage).toMatch(/5000 tokens.*context length.*4096/);

    const e2 = await rejectionOf(c.generate({ inputIds: prompt(4000), maxNewTokens: 500, rid: 'long-2' }));
    expect(e2).toBeInstanceOf(SglangBadRequestError);
    expect((e2 as SglangBadRequestError).contextLengthExceeded).toBe(true);
    expect((e2 as SglangBadRequestError).sglangMessage).toMatch(/context length/);
  });

  it('turns an invalid top_p into a non-retryable SglangBadRequestError naming top_p', async () => {
    const e = await rejectionOf(
      c.generate({ inputIds: prompt(10), maxNewTokens: 10, samplingParams: { top_p: 1.5 }, rid: 'topp-1' }),
    );
    expect(e).toBeInstanceOf(SglangBadRequestError);
    expect((e as SglangBadRequestError).retryable).toBe(false);
    expect((e as SglangBadRequestError).contextLengthExceeded).toBe(false);
    expect((e as SglangBadRequestError).sglangMessage).toMatch(/top_p/);
  });

  it('makes a 500 retryable with its status', async () => {
    fast.setFaults({ errorRate: 1 });
    const e = await rejectionOf(c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'err-1' }));
    expect(e).toBeInstanceOf(UpstreamHttpError);
    expect(e).not.toBeInstanceOf(SglangBadRequestError);
    expect((e as UpstreamHttpError).status).toBe(500);
    expect((e as UpstreamHttpError).retryable).toBe(true);
  });

  it('makes a 503 burst retryable, then succeeds', async () => {
    fast.setFaults({ burst503: 2 });
    for (const rid of ['b503-1', 'b503-2']) {
      const e = await rejectionOf(c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid }));
      expect(e).toBeInstanceOf(UpstreamHttpError);
      expect((e as UpstreamHttpError).status).toBe(503);
      expect((e as UpstreamHttpError).retryable).toBe(true);
    }
    const ok = await c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'b503-3' });
    expect(ok.completionTokens).toBeGreaterThan(0);
  });

  it('turns a dropped connection into UnavailableError', async () => {
    fast.setFaults({ dropRate: 1 });
    const e = await rejectionOf(c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'drop-1' }));
    expect(e).toBeInstanceOf(UnavailableError);
    expect((e as UnavailableError).endpoint).toBe(fast.url);
    fast.clearFaults();
    // The pool recovers on its own.
    const ok = await c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'drop-2' });
    expect(ok.completionTokens).toBeGreaterThan(0);
  });

  it('turns malformed JSON into a retryable SglangResponseFormatError', async () => {
    fast.setFaults({ malformedRate: 1 });
    const e = await rejectionOf(c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'bad-json-1' }));
    expect(e).toBeInstanceOf(SglangResponseFormatError);
    expect((e as SglangResponseFormatError).retryable).toBe(true);
    expect((e as SglangResponseFormatError).status).toBe(200);
    expect((e as Error).message).toMatch(/not JSON/);
  });

  it('times out a hanging request with TimeoutError and frees it on the server', async () => {
    const short = client(fast.url, { requestTimeoutMs: 300 });
    fast.setFaults({ hangRate: 1 });
    const before = fast.stats().aborted;
    const t0 = Date.now();
    const e = await rejectionOf(short.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'hang-1' }));
    const elapsedMs = Date.now() - t0;
    expect(e).toBeInstanceOf(TimeoutError);
    expect((e as TimeoutError).retryable).toBe(true);
    expect(elapsedMs).toBeGreaterThanOrEqual(290);
    expect(elapsedMs).toBeLessThan(5_000);
    await waitFor(() => fast.stats().aborted > before && fast.stats().running === 0, 'the hung request to be aborted');
  });

  it('reports unhealthy from healthGenerate while generation still works', async () => {
    expect(await c.healthGenerate()).toMatchObject({ ok: true, status: 200 });
    fast.setFaults({ unhealthy: true });
    const h = await c.healthGenerate();
    expect(h.ok).toBe(false);
    expect(h.status).toBe(503);
    expect((await c.health()).ok).toBe(false);
    fast.clearFaults();
    expect((await c.healthGenerate()).ok).toBe(true);
    expect((await c.health()).ok).toBe(true);
  });

  it('answers health checks even when every generation connection is busy', async () => {
    const small = client(fast.url, { concurrency: 2 });
    fast.setFaults({ hangRate: 1 });
    const before = fast.stats().requestsReceived;
    const controller = new AbortController();
    // A failed assertion must not leave requests running into the next test.
    onTestFinished(() => controller.abort());
    const hung = handled(
      [1, 2, 3].map((i) =>
        small.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: `busy-${i}`, signal: controller.signal }),
      ),
    );
    // Two reach the server, the third waits for a connection in the client.
    await waitFor(() => fast.stats().requestsReceived - before === 2, 'two hung requests at the server');
    expect(small.inFlight).toBe(3);
    const t0 = Date.now();
    expect((await small.healthGenerate()).ok).toBe(true);
    expect(Date.now() - t0).toBeLessThan(2_000);
    controller.abort();
    for (const e of await Promise.all(hung.map(rejectionOf))) expect(e).toBeInstanceOf(CancelledError);
    expect(small.inFlight).toBe(0);
    await waitFor(() => fast.stats().running === 0, 'the hung requests to be aborted');
  });

  it('does not send a request whose signal is already aborted', async () => {
    const before = fast.stats().requestsReceived;
    const controller = new AbortController();
    controller.abort();
    const e = await rejectionOf(
      c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'pre-aborted', signal: controller.signal }),
    );
    expect(e).toBeInstanceOf(CancelledError);
    // A request sent after it is seen first: had the aborted one been sent, it would count too.
    await c.generate({ inputIds: prompt(10), maxNewTokens: 10, rid: 'after-pre-aborted' });
    expect(fast.stats().requestsReceived - before).toBe(1);
  });

  it('reads model info, server info and load', async () => {
    const info = await c.modelInfo();
    expect(typeof info.model_path).toBe('string');
    expect(info.model_path.length).toBeGreaterThan(0);
    const server = await c.serverInfo();
    expect(server).toBeTypeOf('object');
    const load = await c.getLoad();
    expect(Array.isArray(load)).toBe(true);
  });
});

// ---------------------------------------------------------------------------------------------
// response-shape profiles of older SGLang versions

describe('SGLang version quirks', () => {
  it('0.5.2rc1: drops the extra leading output ids and yields the same completion as 0.5.4', async () => {
    const req = { inputIds: prompt(40), maxNewTokens: 100, rid: 'quirk-1' };
    const a = await client(fast.url).generate(req);
    const b = await client(rc1.url).generate(req);
    expect(b.droppedLeadingIds).toBe(5);
    expect(b.outputIds).toHaveLength(b.completionTokens);
    expect(b.outputIds).toEqual(a.outputIds);
    expect(b.finishReason).toEqual(a.finishReason);
  });

  it('0.4.10: parses the older meta_info', async () => {
    const r = await client(old.url).generate({ inputIds: prompt(20), maxNewTokens: 50, rid: 'old-1' });
    expect(r.completionTokens).toBe(20);
    expect(r.outputIds).toHaveLength(20);
    expect(r.droppedLeadingIds).toBe(0);
    expect(r.finishReason.type).toBe('stop');
    expect('weight_version' in r.metaInfo).toBe(false);
  });

  it('rejects output_ids shorter than completion_tokens, naming the field', async () => {
    const s = await literal((_req, res) =>
      json(res, 200, {
        text: 'ab',
        output_ids: [11, 12],
        meta_info: {
          id: 'short-1',
          finish_reason: { type: 'length', length: 3 },
          prompt_tokens: 4,
          completion_tokens: 3,
        },
      }),
    );
    const e = await rejectionOf(client(s.url).generate({ inputIds: [1, 2, 3, 4], maxNewTokens: 3, rid: 'short-1' }));
    expect(e).toBeInstanceOf(SglangResponseFormatError);
    expect((e as Error).message).toMatch(/output_ids: has 2 ids, fewer than meta_info\.completion_tokens \(3\)/);
    expect((e as SglangResponseFormatError).retryable).toBe(true);
  });

  it('names a missing required field of a 200 response', async () => {
    const s = await literal((_req, res) =>
      json(res, 200, {
        text: '',
        output_ids: [1],
        meta_info: { finish_reason: { type: 'length', length: 1 }, prompt_tokens: 1 },
      }),
    );
    const e = await rejectionOf(client(s.url).generate({ inputIds: [1], maxNewTokens: 1, rid: 'm-1' }));
    expect(e).toBeInstanceOf(SglangResponseFormatError);
    expect((e as Error).message).toContain('meta_info.completion_tokens: expected number, got undefined');
  });

  it('falls back to /get_model_info when /model_info is 404', async () => {
    const s = await literal((req, res) => {
      if (req.url === '/get_model_info') json(res, 200, { model_path: 'Qwen/Qwen2.5-7B', is_generation: true });
      else json(res, 404, { detail: 'Not Found' });
    });
    const info = await client(s.url).modelInfo();
    expect(info.model_path).toBe('Qwen/Qwen2.5-7B');
    expect(s.seen.map((r) => r.url)).toEqual(['/model_info', '/get_model_info']);
  });

  it('reports a 404 on both info paths as an endpoint-level error naming the base path', async () => {
    const s = await literal((_req, res) => json(res, 404, { detail: 'Not Found' }));
    const e = await rejectionOf(client(s.url).modelInfo());
    expect(e).toBeInstanceOf(EndpointMisconfiguredError);
    expect((e as EndpointMisconfiguredError).status).toBe(404);
    expect((e as Error).message).toContain("check the endpoint's base path");
  });

  it('keeps a path prefix of the endpoint', async () => {
    const s = await literal((_req, res) => {
      res.writeHead(200);
      res.end();
    });
    expect((await client(`${s.url}/sglang/`).healthGenerate()).ok).toBe(true);
    expect(s.seen.map((r) => r.url)).toEqual(['/sglang/health_generate']);
  });
});

// ---------------------------------------------------------------------------------------------
// cancellation and abort_request

describe('cancellation', () => {
  it('sends /abort_request {rid} when the caller aborts, and when the deadline passes', async () => {
    const s = await literal((req, res) => {
      if (req.url === '/abort_request') json(res, 200, {});
      // /generate never answers.
    });
    const c = client(s.url, { requestTimeoutMs: 60_000 });
    const controller = new AbortController();
    // A failed assertion must not leave requests running into the next test.
    onTestFinished(() => controller.abort());
    const p = handledOne(
      c.generate({ inputIds: [1, 2], maxNewTokens: 10, rid: 'cancel-me', signal: controller.signal }),
    );
    await waitFor(() => s.seen.some((r) => r.url === '/generate'), 'the request at the server');
    controller.abort();
    expect(await rejectionOf(p)).toBeInstanceOf(CancelledError);
    await waitFor(() => s.seen.some((r) => r.url === '/abort_request'), 'abort_request');
    const abortCall = s.seen.find((r) => r.url === '/abort_request');
    expect(abortCall?.method).toBe('POST');
    expect(JSON.parse(abortCall?.body ?? '{}')).toEqual({ rid: 'cancel-me' });

    const short = client(s.url, { requestTimeoutMs: 200 });
    expect(await rejectionOf(short.generate({ inputIds: [1], maxNewTokens: 1, rid: 'too-slow' }))).toBeInstanceOf(
      TimeoutError,
    );
    await waitFor(
      () => s.seen.some((r) => r.url === '/abort_request' && r.body.includes('"too-slow"')),
      'abort_request for the timed-out request',
    );
  });

  it('abort() never throws, even against a closed port', async () => {
    const s = await literal((_req, res) => json(res, 200, {}));
    const url = s.url;
    await s.close();
    await expect(client(url).abort('x')).resolves.toBeUndefined();
  });
});

// ---------------------------------------------------------------------------------------------
// slow simulator: requests stay running until aborted

describe('SglangClient against a busy simulator', () => {
  it('cancels via AbortSignal with CancelledError, and the simulator frees the request', async () => {
    slow.resetStats();
    const c = client(slow.url);
    const controller = new AbortController();
    // A failed assertion must not leave requests running into the next test.
    onTestFinished(() => controller.abort());
    const p = handledOne(
      c.generate({ inputIds: prompt(50), maxNewTokens: 8000, rid: 'slow-cancel', signal: controller.signal }),
    );
    await waitFor(() => slow.stats().running === 1, 'the request to be running');
    controller.abort();
    const e = await rejectionOf(p);
    expect(e).toBeInstanceOf(CancelledError);
    await waitFor(() => slow.stats().aborted === 1 && slow.stats().running === 0, 'the simulator to abort it');
  });

  it('keeps `concurrency` requests in flight at once, and no more', async () => {
    slow.resetStats();
    const limited = client(slow.url, { concurrency: 8 });
    const controller = new AbortController();
    // A failed assertion must not leave requests running into the next test.
    onTestFinished(() => controller.abort());
    const calls = handled(
      Array.from({ length: 16 }, (_, i) =>
        limited.generate({ inputIds: prompt(20), maxNewTokens: 8000, rid: `lim-${i}`, signal: controller.signal }),
      ),
    );
    await waitFor(() => slow.stats().running === 8, '8 running');
    // The other 8 wait for a connection in the client, not in SGLang's queue.
    expect(slow.stats().requestsReceived).toBe(8);
    expect(slow.stats().queued).toBe(0);
    expect(limited.inFlight).toBe(16);
    controller.abort();
    for (const e of await Promise.all(calls.map(rejectionOf))) expect(e).toBeInstanceOf(CancelledError);
    await waitFor(() => slow.stats().running === 0, 'all aborted');
    expect(slow.stats().maxRunningObserved).toBe(8);
  });

  it('reaches 32 running requests with concurrency 32', async () => {
    slow.resetStats();
    const wide = client(slow.url, { concurrency: 32 });
    // All 32 share one signal, as a worker's shutdown signal would: no listener pile-up.
    const warnings: string[] = [];
    const onWarning = (w: Error): void => {
      warnings.push(w.name);
    };
    process.on('warning', onWarning);
    onTestFinished(() => {
      process.off('warning', onWarning);
    });
    const controller = new AbortController();
    // A failed assertion must not leave requests running into the next test.
    onTestFinished(() => controller.abort());
    const calls = handled(
      Array.from({ length: 32 }, (_, i) =>
        wide.generate({ inputIds: prompt(20), maxNewTokens: 8000, rid: `wide-${i}`, signal: controller.signal }),
      ),
    );
    await waitFor(() => slow.stats().maxRunningObserved >= 32, '32 running at once');
    controller.abort();
    for (const e of await Promise.all(calls.map(rejectionOf))) expect(e).toBeInstanceOf(CancelledError);
    await waitFor(() => slow.stats().running === 0 && slow.stats().aborted === 32, 'all 32 aborted');
    expect(warnings).not.toContain('MaxListenersExceededWarning');
  });
});

// ---------------------------------------------------------------------------------------------
// endpoint down

describe('endpoint down', () => {
  it('turns connection refused into UnavailableError, and healthGenerate into ok=false', async () => {
    const s = await literal((_req, res) => json(res, 200, {}));
    const url = s.url;
    await s.close();
    const c = client(url);
    const e = await rejectionOf(c.generate({ inputIds: [1], maxNewTokens: 1, rid: 'refused' }));
    expect(e).toBeInstanceOf(UnavailableError);
    expect((e as UnavailableError).endpoint).toBe(url);
    expect((e as Error).message).toContain('ECONNREFUSED');
    const h = await c.healthGenerate();
    expect(h.ok).toBe(false);
    expect(h.status).toBeUndefined();
    expect(h.error).toContain('ECONNREFUSED');
  });

  it('turns an outage into UnavailableError for requests in flight and new ones, then recovers', async () => {
    const s = flaky;
    const c = client(s.url);
    await c.generate({ inputIds: prompt(10), maxNewTokens: 20, rid: 'pre-outage' });
    s.setFaults({ hangRate: 1 });
    const inFlight = handledOne(c.generate({ inputIds: prompt(10), maxNewTokens: 20, rid: 'during-outage' }));
    await waitFor(() => s.stats().requests.some((r) => r.rid === 'during-outage'), 'the request at the server');
    s.clearFaults();
    await s.outage(1_500);
    expect(await rejectionOf(inFlight)).toBeInstanceOf(UnavailableError);
    const e = await rejectionOf(c.generate({ inputIds: prompt(10), maxNewTokens: 20, rid: 'in-outage' }));
    expect(e).toBeInstanceOf(UnavailableError);
    expect((await c.healthGenerate()).ok).toBe(false);
    await waitFor(async () => (await c.healthGenerate()).ok, 'the endpoint to come back');
    const r = await c.generate({ inputIds: prompt(10), maxNewTokens: 50, rid: 'post-outage' });
    expect(r.completionTokens).toBe(20);
  });
});

// ---------------------------------------------------------------------------------------------
// API key

describe('sglang.apiKey', () => {
  it('is sent as a bearer token on every request: generate, chat, health, info, abort', async () => {
    const auth: Array<{ url: string; authorization: string | undefined }> = [];
    const s = await literal((req, res) => {
      auth.push({ url: req.url ?? '', authorization: req.headers.authorization });
      if (req.url === '/generate') {
        json(res, 200, {
          text: '',
          output_ids: [5],
          meta_info: { finish_reason: { type: 'length', length: 1 }, prompt_tokens: 1, completion_tokens: 1 },
        });
      } else if (req.url === '/v1/chat/completions') {
        json(res, 200, {
          choices: [{ message: { content: 'x' }, finish_reason: 'stop' }],
          usage: { prompt_tokens: 1, completion_tokens: 1 },
        });
      } else if (req.url === '/model_info') {
        json(res, 200, { model_path: 'm' });
      } else {
        res.writeHead(200);
        res.end();
      }
    });
    const c = client(s.url, { apiKey: 'sk-test-1' });
    expect((await c.healthGenerate()).ok).toBe(true);
    await c.health();
    await c.generate({ inputIds: [1], maxNewTokens: 1, rid: 'k-1' });
    await c.chat({ messages: [{ role: 'user', content: 'x' }], maxNewTokens: 1, rid: 'k-2' });
    await c.abort('k-1');
    expect(auth.map((a) => a.url)).toEqual([
      '/model_info',
      '/health_generate',
      '/health',
      '/generate',
      '/v1/chat/completions',
      '/abort_request',
    ]);
    expect(auth.every((a) => a.authorization === 'Bearer sk-test-1')).toBe(true);
    // Without a key, no header at all, and no extra access check.
    auth.length = 0;
    await client(s.url).healthGenerate();
    expect(auth).toEqual([{ url: '/health_generate', authorization: undefined }]);
  });

  it('rejects an empty key or one with a line break', () => {
    expect(() => client('http://127.0.0.1:1', { apiKey: '' })).toThrow(/apiKey/);
    expect(() => client('http://127.0.0.1:1', { apiKey: 'a\nb' })).toThrow(/line breaks/);
  });
});
