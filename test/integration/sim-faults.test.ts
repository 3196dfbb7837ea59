/**
 * The simulator's fault modes for the fault suite and the bad-input catalogue, over real HTTP:
 * first-try 503s, poison prompts that crash the server, a status for every route, an outage
 * until cleared, bad answer shapes, and SGLang's --api-key — each seen by a plain fetch and by
 * SglangClient (which error class each one becomes).
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { UnavailableError, UpstreamHttpError } from '../../src/shared/errors.js';
import {
  EndpointMisconfiguredError,
  SglangClient,
  type SglangClientOptions,
  SglangResponseFormatError,
} from '../../src/shared/sglang/index.js';
import { BAD_ANSWERS, type SimulatorHandle, type SimulatorOptions, startSimulator } from '../../src/sim/index.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';

interface Reply {
  status: number;
  text: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- bodies are asserted field by field
  json: any;
}

async function call(url: string, init: RequestInit = {}): Promise<Reply> {
  const res = await fetch(url, init);
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, text, json };
}

const post = (url: string, body: unknown, headers: Record<string, string> = {}): Promise<Reply> =>
  call(url, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json', ...headers },
  });

const gen = (rid: string, maxNewTokens = 4) => ({
  input_ids: [1, 2, 3],
  sampling_params: { max_new_tokens: maxNewTokens },
  rid,
});

/** The error code behind a failed fetch (ECONNREFUSED, ECONNRESET, …), or 'no error'. */
async function fetchErrorCode(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
  } catch (e: unknown) {
    const cause = (e as { cause?: { code?: string } }).cause;
    return cause?.code ?? (e as { name?: string }).name ?? 'unknown';
  }
  return 'no error';
}

async function waitFor(what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

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
  const c = new SglangClient({ endpoint, concurrency: 4, requestTimeoutMs: 10_000, logger: quietLogger(), ...options });
  clients.push(c);
  return c;
}
const generate = (c: SglangClient, rid: string) => c.generate({ inputIds: [1, 2, 3], maxNewTokens: 4, rid });

const FAST: SimulatorOptions = {
  timeScale: 1000,
  contextLength: 4096,
  outputLength: { distribution: 'fixed', mean: 8 },
  seed: 11,
};
const { sim, startSim } = useHarness({ sim: FAST });
let keyed: SimulatorHandle;

beforeAll(async () => {
  keyed = await startSim({ ...FAST, apiKey: 'sk-sim-key' });
});

afterAll(async () => {
  await Promise.allSettled(clients.map((c) => c.destroy()));
});

afterEach(() => {
  sim.clearFaults();
  keyed.clearFaults();
});

describe('firstTry503Rate', () => {
  it("refuses the first request of a seeded fraction of sample ids with SGLang's queue-full 503, then serves them", async () => {
    sim.setFaults({ firstTry503Rate: 0.3 });
    const ids = Array.from({ length: 40 }, (_, i) => `B1/s${i}`);
    const first = await Promise.all(ids.map((id) => post(`${sim.url}/generate`, gen(`${id}#a`))));
    const refused = ids.filter((_, i) => first[i]?.status === 503);
    expect(refused.length).toBeGreaterThanOrEqual(4);
    expect(refused.length).toBeLessThanOrEqual(22);
    expect(first.every((r) => r.status === 200 || r.status === 503)).toBe(true);
    expect(first.find((r) => r.status === 503)?.json).toEqual({
      object: 'error',
      message: 'The request queue is full.',
      type: '503',
      param: null,
      code: 503,
    });
    // Second tries (another nonce) all succeed, the refused ones included.
    const second = await Promise.all(ids.map((id) => post(`${sim.url}/generate`, gen(`${id}#b`))));
    expect(second.map((r) => r.status)).toEqual(ids.map(() => 200));

    // The same seed picks the same sample ids, whatever the order of arrival.
    const again = await startSimulator(FAST);
    try {
      again.setFaults({ firstTry503Rate: 0.3 });
      const replay = [];
      for (const id of [...ids].reverse())
        replay.push({ id, status: (await post(`${again.url}/generate`, gen(`${id}#c`))).status });
      expect(
        replay
          .filter((r) => r.status === 503)
          .map((r) => r.id)
          .sort(),
      ).toEqual([...refused].sort());
    } finally {
      await again.stop();
    }
  });

  it('is a retryable UpstreamHttpError 503 for SglangClient', async () => {
    sim.setFaults({ firstTry503Rate: 1 });
    const e = await rejectionOf(generate(client(sim.url), 'B1/x#1'));
    expect(e).toBeInstanceOf(UpstreamHttpError);
    expect((e as UpstreamHttpError).status).toBe(503);
    expect((e as UpstreamHttpError).retryable).toBe(true);
    expect((await generate(client(sim.url), 'B1/x#2')).completionTokens).toBeGreaterThan(0);
  });
});

describe('poisonSampleIds', () => {
  it('a poison prompt drops its connection and the server is down for poisonDownMs, then back on the same port', async () => {
    const own = await startSimulator(FAST);
    try {
      const url = own.url;
      own.setFaults({ poisonSampleIds: ['bad-1'], poisonDownMs: 600 });
      expect((await post(`${url}/generate`, gen('B1/good#1'))).status).toBe(200);
      const t0 = Date.now();
      // Matched by the bare id as well as by `<dataset>/<id>`.
      expect(['ECONNRESET', 'UND_ERR_SOCKET']).toContain(
        await fetchErrorCode(post(`${url}/generate`, gen('B1/bad-1#1'))),
      );
      await waitFor('down', async () => (await fetchErrorCode(fetch(`${url}/health`))) === 'ECONNREFUSED', 2000);
      expect(await fetchErrorCode(post(`${url}/generate`, gen('B1/good#2')))).toBe('ECONNREFUSED');
      await waitFor('back up', async () => (await fetch(`${url}/health`).catch(() => undefined))?.status === 200, 5000);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(500);
      expect((await post(`${url}/generate`, gen('B1/good#3'))).status).toBe(200);
      // It crashes the server every time it is sent.
      own.setFaults({ poisonSampleIds: ['B1/bad-1'], poisonDownMs: 100 });
      const e = await rejectionOf(generate(client(url), 'B1/bad-1#2'));
      expect(e).toBeInstanceOf(UnavailableError);
      await waitFor(
        'back up again',
        async () => (await fetch(`${url}/health`).catch(() => undefined))?.status === 200,
        5000,
      );
    } finally {
      await own.stop();
    }
  });
});

describe('statusAll', () => {
  it('401 and 404 on every generation and info route, health open unless statusAllHealth', async () => {
    sim.setFaults({ statusAll: 401 });
    const r401 = await post(`${sim.url}/generate`, gen('B1/a#1'));
    expect(r401.status).toBe(401);
    expect(r401.json).toEqual({ detail: 'Unauthorized' });
    expect((await post(`${sim.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'x' }] })).status).toBe(
      401,
    );
    expect((await call(`${sim.url}/model_info`)).status).toBe(401);
    expect((await call(`${sim.url}/health`)).status).toBe(200);
    sim.setFaults({ statusAllHealth: true });
    expect((await call(`${sim.url}/health_generate`)).status).toBe(401);

    sim.setFaults({ statusAll: 404, statusAllHealth: false });
    const r404 = await post(`${sim.url}/generate`, gen('B1/a#2'));
    expect(r404.status).toBe(404);
    expect(r404.json).toEqual({ detail: 'Not Found' });
    // Set and cleared through the admin route too.
    expect((await post(`${sim.url}/_sim/faults`, { statusAll: null })).json.statusAll).toBeNull();
    expect((await post(`${sim.url}/generate`, gen('B1/a#3'))).status).toBe(200);
    expect((await post(`${sim.url}/_sim/faults`, { statusAll: 403 })).json.statusAll).toBe(403);
    expect((await post(`${sim.url}/generate`, gen('B1/a#4'))).status).toBe(403);
  });

  it('SglangClient: EndpointMisconfiguredError naming status, URL and what to check; health then reports it', async () => {
    const c = client(sim.url);
    expect((await c.healthGenerate()).ok).toBe(true);
    sim.setFaults({ statusAll: 404 });
    const e = await rejectionOf(generate(c, 'B1/m#1'));
    expect(e).toBeInstanceOf(EndpointMisconfiguredError);
    const m = e as EndpointMisconfiguredError;
    expect(m.status).toBe(404);
    expect(m.endpoint).toBe(sim.url);
    expect(m.message).toBe(
      `SGLang endpoint ${sim.url} answered 404 Not Found to POST /generate (Not Found): check the endpoint's base path in sglang.endpoints (it should be the server's root, e.g. http://host:30000)`,
    );
    // /health itself is fine here, but the endpoint still cannot serve: health says so.
    const h = await c.healthGenerate();
    expect(h).toMatchObject({ ok: false, status: 404, misconfigured: true });
    expect(h.error).toContain("check the endpoint's base path");
    sim.setFaults({ statusAll: 401, statusAllHealth: true });
    const h401 = await c.health();
    expect(h401).toMatchObject({ ok: false, status: 401, misconfigured: true });
    expect(h401.error).toContain('answered 401 Unauthorized to GET /health');
    expect(h401.error).toContain('check sglang.apiKey');
    sim.clearFaults();
    expect((await c.healthGenerate()).ok).toBe(true);
    expect((await generate(c, 'B1/m#2')).completionTokens).toBeGreaterThan(0);
  });
});

describe('outage (until cleared)', () => {
  it('drops every connection, in flight and new, health included; the admin API stays up; clearing ends it', async () => {
    const own = await startSimulator({ ...FAST, timeScale: 1, outputLength: { distribution: 'fixed', mean: 4000 } });
    try {
      const inflight = post(`${own.url}/generate`, gen('B1/long#1', 4000));
      await waitFor('running', () => own.stats().running === 1);
      expect((await post(`${own.url}/_sim/faults`, { outage: true })).json.outage).toBe(true);
      expect(await fetchErrorCode(inflight)).not.toBe('no error');
      await waitFor('freed', () => own.stats().running === 0);
      expect(['ECONNRESET', 'UND_ERR_SOCKET']).toContain(await fetchErrorCode(fetch(`${own.url}/health`)));
      expect(['ECONNRESET', 'UND_ERR_SOCKET']).toContain(
        await fetchErrorCode(post(`${own.url}/generate`, gen('B1/x#1'))),
      );
      expect((await call(`${own.url}/_sim/stats`)).status).toBe(200);
      const e = await rejectionOf(generate(client(own.url), 'B1/x#2'));
      expect(e).toBeInstanceOf(UnavailableError);
      expect((await client(own.url).healthGenerate()).ok).toBe(false);
      await post(`${own.url}/_sim/faults`, { outage: false });
      expect((await call(`${own.url}/health`)).status).toBe(200);
      own.setFaults({ outage: true });
      expect(await fetchErrorCode(fetch(`${own.url}/health`))).not.toBe('no error');
      own.clearFaults();
      expect((await call(`${own.url}/health`)).status).toBe(200);
    } finally {
      await own.stop();
    }
  });
});

describe('bad answers', () => {
  it('each shape as a fetch sees it', async () => {
    const shapes: Record<string, (r: Reply) => void> = {
      html502: (r) => {
        expect(r.status).toBe(502);
        expect(r.text).toContain('<title>502 Bad Gateway</title>');
      },
      'wrong-shape': (r) => {
        expect(r.status).toBe(200);
        expect(r.json.output_ids).toBeUndefined();
        expect(r.json.choices).toHaveLength(1);
      },
      'no-output-ids': (r) => {
        expect(r.status).toBe(200);
        expect(r.json.output_ids).toBeUndefined();
        expect(r.json.meta_info.completion_tokens).toBeGreaterThan(0);
      },
      'negative-count': (r) => {
        expect(r.status).toBe(200);
        expect(r.json.meta_info.completion_tokens).toBe(-1);
      },
      'out-of-vocab': (r) => {
        expect(r.status).toBe(200);
        expect(r.json.output_ids[0]).toBe(999_999_999);
        expect(r.json.output_ids.length).toBe(r.json.meta_info.completion_tokens);
      },
      truncated: (r) => {
        expect(r.status).toBe(200);
        expect(r.json).toBeUndefined();
        expect(r.text.startsWith('{"text":')).toBe(true);
      },
      '413': (r) => {
        expect(r.status).toBe(413);
        expect(r.json).toEqual({ detail: 'Request Entity Too Large' });
      },
    };
    expect(Object.keys(shapes).sort()).toEqual([...BAD_ANSWERS].sort());
    for (const kind of BAD_ANSWERS) {
      sim.setFaults({ badAnswerRate: 1, badAnswer: kind });
      shapes[kind]?.(await post(`${sim.url}/generate`, gen(`B1/bad-${kind}#1`)));
    }
    sim.setFaults({ badAnswerRate: 0 });
    expect((await post(`${sim.url}/generate`, gen('B1/ok#1'))).status).toBe(200);
  });

  it('each shape as SglangClient sees it: which error class, retryable or not, naming the field', async () => {
    const c = client(sim.url);
    const expected: Record<string, { cls: new (...a: never[]) => Error; retryable: boolean; text: string }> = {
      html502: { cls: UpstreamHttpError, retryable: true, text: 'returned 502: <html>' },
      'wrong-shape': { cls: SglangResponseFormatError, retryable: true, text: 'output_ids' },
      'no-output-ids': { cls: SglangResponseFormatError, retryable: true, text: 'output_ids' },
      'negative-count': { cls: SglangResponseFormatError, retryable: true, text: 'meta_info.completion_tokens' },
      truncated: { cls: SglangResponseFormatError, retryable: true, text: 'body is not JSON' },
      '413': { cls: UpstreamHttpError, retryable: false, text: 'too large' },
    };
    // The client knows no vocabulary: an out-of-vocabulary id is refused by the worker before
    // its commit (test/integration/out-of-vocab.test.ts).
    for (const kind of BAD_ANSWERS.filter((k) => k !== 'out-of-vocab')) {
      sim.setFaults({ badAnswerRate: 1, badAnswer: kind });
      const e = await rejectionOf(generate(c, `B1/client-${kind}#1`));
      const want = expected[kind];
      expect(e, kind).toBeInstanceOf(want?.cls);
      expect(e, kind).not.toBeInstanceOf(EndpointMisconfiguredError);
      expect((e as UpstreamHttpError).retryable, kind).toBe(want?.retryable);
      expect((e as Error).message, kind).toContain(want?.text);
      expect((e as Error).message, kind).toContain(sim.url);
    }
  });

  it('rejects invalid fault values on the admin route with 400', async () => {
    for (const bad of [
      { statusAll: 200 },
      { statusAll: 'x' },
      { badAnswer: 'nope' },
      { poisonSampleIds: 'x' },
      { poisonDownMs: -1 },
      { firstTry503Rate: 2 },
      { outage: 'yes' },
      { badAnswerRate: 0.6, errorRate: 0.6 },
    ]) {
      const r = await post(`${sim.url}/_sim/faults`, bad);
      expect(r.status, JSON.stringify(bad)).toBe(400);
      expect(r.json.error.message).toMatch(/fault /);
    }
  });
});

describe('apiKey (SGLang --api-key)', () => {
  it('answers 401 {"error":"Unauthorized"} without the right bearer, like SGLang; health, metrics and /_sim/ stay open', async () => {
    const none = await post(`${keyed.url}/generate`, gen('B1/k#1'));
    expect(none.status).toBe(401);
    expect(none.json).toEqual({ error: 'Unauthorized' });
    expect((await post(`${keyed.url}/generate`, gen('B1/k#2'), { authorization: 'Bearer wrong' })).status).toBe(401);
    expect((await post(`${keyed.url}/generate`, gen('B1/k#3'), { authorization: 'Bearer sk-sim-key' })).status).toBe(
      200,
    );
    expect((await call(`${keyed.url}/model_info`)).status).toBe(401);
    expect((await call(`${keyed.url}/health`)).status).toBe(200);
    expect((await call(`${keyed.url}/health_generate`)).status).toBe(200);
    expect((await call(`${keyed.url}/metrics`)).status).toBe(200);
    expect((await call(`${keyed.url}/_sim/stats`)).status).toBe(200);
  });

  it('SglangClient sends the key on every request (generate, health, abort); without it, or with a wrong one, the endpoint is misconfigured', async () => {
    const right = client(keyed.url, { apiKey: 'sk-sim-key' });
    expect(await right.healthGenerate()).toMatchObject({ ok: true });
    expect((await generate(right, 'B1/c#1')).completionTokens).toBeGreaterThan(0);
    expect((await right.modelInfo()).model_path).toBeTruthy();

    // abort_request reaches the server with the key: a hung request is ended by it.
    keyed.resetStats();
    keyed.setFaults({ hangRate: 1 });
    const hung = generate(right, 'B1/hung#1');
    await waitFor('hung request registered', () => keyed.stats().requests.some((r) => r.rid === 'B1/hung#1'));
    await right.abort('B1/hung#1');
    const result = await hung;
    expect(result.finishReason.type).toBe('abort');
    keyed.clearFaults();

    const missing = client(keyed.url);
    // /health is exempt from the key, so a client without one looks healthy at first…
    expect((await missing.healthGenerate()).ok).toBe(true);
    const e = await rejectionOf(generate(missing, 'B1/c#2'));
    expect(e).toBeInstanceOf(EndpointMisconfiguredError);
    expect((e as EndpointMisconfiguredError).status).toBe(401);
    expect((e as Error).message).toBe(
      `SGLang endpoint ${keyed.url} answered 401 Unauthorized to POST /generate (Unauthorized): check sglang.apiKey (or SGLANG_API_KEY): the server was started with --api-key and did not accept the key sent`,
    );
    // …but once a request was refused, its health check says why.
    const h = await missing.healthGenerate();
    expect(h).toMatchObject({ ok: false, status: 401, misconfigured: true });
    expect(h.error).toContain('to GET /model_info');

    // A wrong key is caught by the first health check already.
    const wrong = client(keyed.url, { apiKey: 'sk-wrong' });
    const hw = await wrong.healthGenerate();
    expect(hw).toMatchObject({ ok: false, status: 401, misconfigured: true });
    expect(hw.error).toContain('check sglang.apiKey');
    expect(hw.error).not.toContain('sk-wrong');
    expect(hw.error).not.toContain('sk-sim-key');
  });
});
