/**
 * The SGLang simulator over real HTTP on loopback, seen by a plain fetch (undici) client:
 * every route's shape, the 400s, abort, determinism, version profiles, each fault mode, the
 * load model's saturation, and the `tokenmill sim` CLI.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterEach, describe, expect, it } from 'vitest';

import { batchThroughput, startSimulator } from '../../src/sim/index.js';
import { useHarness } from '../helpers/fixture.js';

const EOS = 151645; // <|im_end|>
const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

interface Reply {
  status: number;
  text: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- response bodies are asserted field by field
  json: any;
  headers: Headers;
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
  return { status: res.status, text, json, headers: res.headers };
}

function post(url: string, body: unknown, contentType = 'application/json', signal?: AbortSignal): Promise<Reply> {
  return call(url, {
    method: 'POST',
    body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'content-type': contentType },
    ...(signal === undefined ? {} : { signal }),
  });
}

async function waitFor(what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The error code behind a failed fetch (ECONNREFUSED, ECONNRESET, …). */
async function fetchErrorCode(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
  } catch (e: unknown) {
    const cause = (e as { cause?: { code?: string } }).cause;
    return cause?.code ?? (e as { name?: string }).name ?? 'unknown';
  }
  return 'no error';
}

function sseEvents(text: string): string[] {
  return text
    .split('\n\n')
    .filter((chunk) => chunk.startsWith('data: '))
    .map((chunk) => chunk.slice('data: '.length));
}

const gen = (ids: number[], sampling: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) => ({
  input_ids: ids,
  sampling_params: sampling,
  ...extra,
});

const { sim } = useHarness({
  sim: {
    timeScale: 20,
    maxRunningRequests: 4,
    contextLength: 4096,
    outputLength: { distribution: 'fixed', mean: 32 },
  },
});

afterEach(() => {
  sim.clearFaults();
});

describe('native /generate', () => {
  it('answers a single request in SGLang 0.5.4 shape, ending on the EOS', async () => {
    const r = await post(`${sim.url}/generate`, gen([1, 2, 3], { max_new_tokens: 100 }, { rid: 'single-1' }));
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toContain('application/json');
    expect(Object.keys(r.json).sort()).toEqual(['meta_info', 'output_ids', 'text']);
    const meta = r.json.meta_info;
    expect(meta).toMatchObject({
      id: 'single-1',
      finish_reason: { type: 'stop', matched: EOS },
      prompt_tokens: 3,
      completion_tokens: 32,
      cached_tokens: 0,
      weight_version: 'default',
      num_retractions: 0,
      reasoning_tokens: 0,
    });
    expect(meta.e2e_latency).toBeGreaterThan(0);
    expect(typeof meta.response_sent_to_client_ts).toBe('number');
    const ids: number[] = r.json.output_ids;
    expect(ids).toHaveLength(32);
    expect(ids.at(-1)).toBe(EOS);
    // Every other id is an ordinary token (below Qwen3's first added token).
    expect(ids.slice(0, -1).every((id) => Number.isInteger(id) && id >= 0 && id < 151643)).toBe(true);
    // text is the decoded completion, EOS trimmed.
    const detok = await post(`${sim.url}/detokenize`, { tokens: ids.slice(0, -1) });
    expect(detok.json.text).toBe(r.json.text);
    expect(r.json.text.length).toBeGreaterThan(0);
  });

  it('caps at max_new_tokens with finish_reason length', async () => {
    const r = await post(`${sim.url}/generate`, gen([5, 6, 7], { max_new_tokens: 5 }));
    expect(r.json.meta_info.finish_reason).toEqual({ type: 'length', length: 5 });
    expect(r.json.output_ids).toHaveLength(5);
    expect(r.json.output_ids).not.toContain(EOS);
    expect(r.json.meta_info.completion_tokens).toBe(5);
    const zero = await post(`${sim.url}/generate`, gen([5, 6, 7], { max_new_tokens: 0 }));
    expect(zero.json.meta_info.finish_reason).toEqual({ type: 'length', length: 0 });
    expect(zero.json.output_ids).toEqual([]);
  });

  it('honours ignore_eos and stop_token_ids', async () => {
    const ignore = await post(`${sim.url}/generate`, gen([1, 2], { max_new_tokens: 50, ignore_eos: true }));
    expect(ignore.json.meta_info.finish_reason).toEqual({ type: 'length', length: 50 });
    expect(ignore.json.output_ids).toHaveLength(50);
    const stop = await post(`${sim.url}/generate`, gen([1, 2], { max_new_tokens: 100, stop_token_ids: [13] }));
    expect(stop.json.meta_info.finish_reason).toEqual({ type: 'stop', matched: 13 });
    expect(stop.json.output_ids.at(-1)).toBe(13);
  });

  it('tokenizes text input and accepts any content type (curl sends form-urlencoded)', async () => {
    const text = 'The capital city of France is';
    const tok = await post(`${sim.url}/tokenize`, { prompt: text });
    const r = await post(
      `${sim.url}/generate`,
      { text, sampling_params: { max_new_tokens: 8 } },
      'application/x-www-form-urlencoded',
    );
    expect(r.status).toBe(200);
    expect(r.json.meta_info.prompt_tokens).toBe(tok.json.count);
    expect(r.json.output_ids).toHaveLength(8);
  });

  it('answers a batch in request order, rid string -> rid_i, or a list', async () => {
    const r = await post(`${sim.url}/generate`, {
      input_ids: [[1, 2, 3], [4, 5], [6]],
      sampling_params: { max_new_tokens: 4 },
      rid: 'bat',
    });
    expect(r.status).toBe(200);
    expect(Array.isArray(r.json)).toBe(true);
    expect(
      r.json.map((x: { meta_info: { id: string; prompt_tokens: number }; output_ids: number[] }) => x.meta_info.id),
    ).toEqual(['bat_0', 'bat_1', 'bat_2']);
    expect(
      r.json.map(
        (x: { meta_info: { id: string; prompt_tokens: number }; output_ids: number[] }) => x.meta_info.prompt_tokens,
      ),
    ).toEqual([3, 2, 1]);
    const list = await post(`${sim.url}/generate`, {
      text: ['a', 'b'],
      sampling_params: [{ max_new_tokens: 2 }, { max_new_tokens: 3 }],
      rid: ['x1', 'x2'],
    });
    expect(
      list.json.map((x: { meta_info: { id: string; prompt_tokens: number }; output_ids: number[] }) => [
        x.meta_info.id,
        x.output_ids.length,
      ]),
    ).toEqual([
      ['x1', 2],
      ['x2', 3],
    ]);
    const dup = await post(`${sim.url}/generate`, { input_ids: [[1], [2]], rid: ['same', 'same'] });
    expect(dup.status).toBe(400);
    expect(dup.json.error.message).toContain('Duplicate request IDs');
  });

  it('streams cumulative text and output_ids, then [DONE]', async () => {
    const r = await post(
      `${sim.url}/generate`,
      gen([1, 2, 3], { max_new_tokens: 200, ignore_eos: true }, { stream: true, rid: 'st' }),
    );
    expect(r.status).toBe(200);
    const events = sseEvents(r.text);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks.length).toBeGreaterThanOrEqual(1);
    let previous = 0;
    for (const chunk of chunks) {
      expect(chunk.meta_info.id).toBe('st');
      expect(chunk.output_ids.length).toBeGreaterThanOrEqual(previous);
      expect(chunk.meta_info.completion_tokens).toBe(chunk.output_ids.length);
      previous = chunk.output_ids.length;
    }
    const last = chunks.at(-1);
    expect(last.meta_info.finish_reason).toEqual({ type: 'length', length: 200 });
    expect(last.output_ids).toHaveLength(200);
    for (const chunk of chunks.slice(0, -1)) expect(chunk.meta_info.finish_reason).toBeNull();
    for (const chunk of chunks) expect(last.output_ids.slice(0, chunk.output_ids.length)).toEqual(chunk.output_ids);

    const batch = await post(`${sim.url}/generate`, {
      input_ids: [[1], [2]],
      sampling_params: { max_new_tokens: 3 },
      stream: true,
    });
    const batchEvents = sseEvents(batch.text);
    expect(batchEvents.at(-1)).toBe('[DONE]');
    const finals = batchEvents
      .slice(0, -1)
      .map((e) => JSON.parse(e))
      .filter((c) => c.meta_info.finish_reason !== null);
    expect(finals.map((c) => c.index).sort()).toEqual([0, 1]);
  });

  it('rejects bad requests with 400 and SGLang messages', async () => {
    const cases: Array<[unknown, string]> = [
      [gen([1], { top_p: 1.5 }), 'top_p must be in (0, 1], got 1.5.'],
      [gen([1], { temperature: -1 }), 'temperature must be non-negative, got -1.'],
      [gen([1], { max_new_tokens: -1 }), 'max_new_tokens must be at least 0, got -1.'],
      [gen([1], { top_k: 0 }), 'top_k must be -1 (disable), or at least 1, got 0.'],
      [
        gen(Array.from({ length: 4096 }, () => 1)),
        "The input (4096 tokens) is longer than the model's context length (4096 tokens).",
      ],
      [gen([999_999]), 'contains values greater than the vocab size'],
      [{ sampling_params: {} }, 'Either text, input_ids or input_embeds should be provided.'],
    ];
    for (const [body, message] of cases) {
      const r = await post(`${sim.url}/generate`, body);
      expect(r.status, message).toBe(400);
      expect(Object.keys(r.json)).toEqual(['error']);
      expect(r.json.error.message).toContain(message);
    }
    const total = await post(
      `${sim.url}/generate`,
      gen(
        Array.from({ length: 4000 }, () => 1),
        { max_new_tokens: 200 },
      ),
    );
    expect(total.status).toBe(400);
    expect(total.json.error.message).toMatch(
      /^Requested token count exceeds the model's maximum context length of 4096 tokens\. You requested a total of 4200 tokens: 4000 tokens from the input messages and 200 tokens/,
    );
    const notJson = await post(`${sim.url}/generate`, '{"input_ids": [1,');
    expect(notJson.status).toBe(400);
  });

  it('rejects a rid already in flight', async () => {
    const first = post(`${sim.url}/generate`, gen([1, 2], { max_new_tokens: 3000, ignore_eos: true }, { rid: 'dup' }));
    await waitFor('dup running', () => sim.stats().running === 1);
    const second = await post(`${sim.url}/generate`, gen([1, 2], {}, { rid: 'dup' }));
    expect(second.status).toBe(400);
    expect(second.json.error.message).toBe('Duplicate request ID detected: dup');
    await post(`${sim.url}/abort_request`, { rid: 'dup' });
    expect((await first).json.meta_info.finish_reason.type).toBe('abort');
  });
});

describe('/v1/chat/completions', () => {
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Say hello.' },
  ];

  it('applies the chat template and answers in the OpenAI shape', async () => {
    const r = await post(`${sim.url}/v1/chat/completions`, { model: 'Qwen/Qwen3-8B', messages, max_tokens: 100 });
    expect(r.status).toBe(200);
    expect(r.json.id).toMatch(/^[0-9a-f]{32}$/);
    expect(r.json).toMatchObject({
      object: 'chat.completion',
      model: 'Qwen/Qwen3-8B',
      metadata: { weight_version: 'default' },
    });
    expect(typeof r.json.created).toBe('number');
    const choice = r.json.choices[0];
    expect(choice).toMatchObject({
      index: 0,
      message: { role: 'assistant', reasoning_content: null, tool_calls: null },
      logprobs: null,
      finish_reason: 'stop',
      matched_stop: EOS,
    });
    expect(typeof choice.message.content).toBe('string');
    const tok = await post(`${sim.url}/tokenize`, { messages });
    expect(r.json.usage).toEqual({
      prompt_tokens: tok.json.count,
      completion_tokens: 32,
      total_tokens: tok.json.count + 32,
      prompt_tokens_details: null,
      reasoning_tokens: 0,
    });
    const length = await post(`${sim.url}/v1/chat/completions`, { messages, max_tokens: 4 });
    expect(length.json.choices[0]).toMatchObject({ finish_reason: 'length', matched_stop: null });
  });

  it('streams chunks, then [DONE]', async () => {
    const r = await post(`${sim.url}/v1/chat/completions`, {
      messages,
      max_tokens: 300,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    });
    const events = sseEvents(r.text);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    expect(chunks.every((c) => c.object === 'chat.completion.chunk')).toBe(true);
    const finish = chunks.find((c) => c.choices[0]?.finish_reason !== null && c.choices.length > 0);
    expect(finish.choices[0].finish_reason).toBe('length');
    expect(chunks.at(-1).usage.completion_tokens).toBe(300);
  });

  it('answers errors in the OpenAI shape, and rejects a non-JSON content type', async () => {
    const form = await post(`${sim.url}/v1/chat/completions`, { messages }, 'application/x-www-form-urlencoded');
    expect(form.status).toBe(400);
    expect(form.json).toMatchObject({ object: 'error', code: 400, param: null });
    expect(form.json.message).toContain("Only 'application/json' is allowed");
    const tooLong = await post(`${sim.url}/v1/chat/completions`, { messages, max_tokens: 5000 });
    expect(tooLong.status).toBe(400);
    expect(tooLong.json).toMatchObject({ object: 'error', type: 'BadRequestError', param: null, code: 400 });
    expect(tooLong.json.message).toContain(
      "Requested token count exceeds the model's maximum context length of 4096 tokens.",
    );
    const badTopP = await post(`${sim.url}/v1/chat/completions`, { messages, top_p: 0 });
    expect(badTopP.json.message).toBe('top_p must be in (0, 1], got 0.');
  });
});

describe('other routes', () => {
  it('health, models, model and server info, load, flush, metrics, 404/405', async () => {
    for (const p of ['/health', '/health_generate']) {
      const r = await call(`${sim.url}${p}`);
      expect(r.status).toBe(200);
      expect(r.text).toBe('');
    }
    const models = await call(`${sim.url}/v1/models`);
    expect(models.json).toMatchObject({
      object: 'list',
      data: [{ id: 'Qwen/Qwen3-8B', object: 'model', owned_by: 'sglang', max_model_len: 4096 }],
    });
    expect((await call(`${sim.url}/v1/models/Qwen/Qwen3-8B`)).json.id).toBe('Qwen/Qwen3-8B');
    expect((await call(`${sim.url}/v1/models/nope`)).status).toBe(404);
    for (const p of ['/model_info', '/get_model_info']) {
      const r = await call(`${sim.url}${p}`);
      expect(r.json).toMatchObject({ model_path: 'Qwen/Qwen3-8B', is_generation: true, weight_version: 'default' });
      expect(typeof r.json.tokenizer_path).toBe('string');
    }
    for (const p of ['/server_info', '/get_server_info']) {
      const r = await call(`${sim.url}${p}`);
      expect(r.json).toMatchObject({ max_running_requests: 4, context_length: 4096, version: '0.5.4' });
      expect(r.json.max_total_num_tokens).toBeGreaterThan(0);
      expect(r.json.internal_states[0]).toMatchObject({
        last_gen_throughput: expect.any(Number),
        load: expect.any(Number),
      });
    }
    const load = await call(`${sim.url}/get_load`);
    expect(load.json).toEqual([{ dp_rank: 0, num_reqs: 0, num_waiting_reqs: 0, num_tokens: 0 }]);
    const loads = await call(`${sim.url}/v1/loads`);
    expect(loads.json.loads[0]).toMatchObject({
      dp_rank: 0,
      num_running_reqs: 0,
      num_waiting_reqs: 0,
      max_running_requests: 4,
    });
    for (const method of ['GET', 'POST']) {
      const flush = await call(`${sim.url}/flush_cache`, { method });
      expect(flush.status).toBe(200);
      expect(flush.text.startsWith('Cache flushed.\n')).toBe(true);
    }
    const metrics = await call(`${sim.url}/metrics`);
    for (const name of [
      'sglang:num_running_reqs',
      'sglang:num_queue_reqs',
      'sglang:token_usage',
      'sglang:gen_throughput',
      'sglang:generation_tokens_total',
      'sglang:prompt_tokens_total',
      'sglang:e2e_request_latency_seconds_bucket',
    ]) {
      expect(metrics.text).toContain(name);
    }
    expect(metrics.text).toMatch(/sglang:generation_tokens_total\{model_name="Qwen\/Qwen3-8B"\} [1-9]\d*/);
    const missing = await call(`${sim.url}/no_such_route`);
    expect(missing.status).toBe(404);
    expect(missing.json).toEqual({ detail: 'Not Found' });
    const wrongMethod = await call(`${sim.url}/generate`);
    expect(wrongMethod.status).toBe(405);
    expect(wrongMethod.json).toEqual({ detail: 'Method Not Allowed' });
  });

  it('tokenize and detokenize round-trip', async () => {
    const tok = await post(`${sim.url}/tokenize`, { prompt: 'hello world' });
    expect(tok.json).toEqual({ tokens: [14990, 1879], count: 2, max_model_len: 4096 });
    const detok = await post(`${sim.url}/detokenize`, { tokens: tok.json.tokens });
    expect(detok.json).toEqual({ text: 'hello world' });
    const many = await post(`${sim.url}/tokenize`, { prompt: ['a', 'b c'] });
    expect(many.json.count).toEqual([1, 2]);
    expect((await post(`${sim.url}/tokenize`, { prompt: 'x' }, 'text/plain')).status).toBe(400);
  });
});

describe('abort', () => {
  const long = (rid: string) =>
    post(`${sim.url}/generate`, gen([1, 2, 3], { max_new_tokens: 3000, ignore_eos: true }, { rid }));

  it('ends a running request now, with its partial output', async () => {
    sim.resetStats();
    const pending = long('ab-1');
    // Wait until it has decoded some tokens (num_tokens counts prompt + generated).
    await waitFor('decoding', async () => (await call(`${sim.url}/get_load`)).json[0].num_tokens > 3);
    const ack = await post(`${sim.url}/abort_request`, { rid: 'ab-1' });
    expect(ack.status).toBe(200);
    const r = await pending;
    expect(r.status).toBe(200);
    expect(r.json.meta_info.finish_reason).toMatchObject({ type: 'abort', message: 'Aborted' });
    const n = r.json.meta_info.completion_tokens;
    expect(n).toBeGreaterThan(0);
    expect(n).toBeLessThan(3000);
    expect(r.json.output_ids).toHaveLength(n);
    expect(sim.stats()).toMatchObject({ aborted: 1, running: 0 });
  });

  it('aborts a queued request before prefill, and abort_all ends the rest', async () => {
    const running = ['q0', 'q1', 'q2', 'q3'].map(long);
    await waitFor('4 running', () => sim.stats().running === 4);
    const queued = long('q4');
    await waitFor('1 queued', () => sim.stats().queued === 1);
    await post(`${sim.url}/abort_request`, { rid: 'q4' });
    const q = await queued;
    expect(q.json.meta_info.finish_reason).toEqual({ type: 'abort', message: 'Abort before prefill' });
    expect(q.json.output_ids).toEqual([]);
    await post(`${sim.url}/abort_request`, { abort_all: true });
    for (const r of await Promise.all(running)) expect(r.json.meta_info.finish_reason.type).toBe('abort');
    expect(sim.stats()).toMatchObject({ running: 0, queued: 0 });
  });

  it('treats a client disconnect as an abort and frees the slot', async () => {
    sim.resetStats();
    const controller = new AbortController();
    const kept = long('kept');
    const gone = post(
      `${sim.url}/generate`,
      gen([9], { max_new_tokens: 3000, ignore_eos: true }),
      'application/json',
      controller.signal,
    ).catch((e: unknown) => e);
    await waitFor('2 running', () => sim.stats().running === 2);
    controller.abort();
    expect(await gone).toBeInstanceOf(Error);
    await waitFor('disconnect seen', () => sim.stats().aborted === 1 && sim.stats().running === 1);
    await post(`${sim.url}/abort_request`, { rid: 'kept' });
    expect((await kept).json.meta_info.finish_reason.type).toBe('abort');
  });
});

describe('determinism and versions', () => {
  it('gives the same output for the same (seed, rid, prompt length)', async () => {
    const other = await startSimulator({
      seed: 7,
      timeScale: 50,
      outputLength: { distribution: 'lognormal', mean: 40 },
    });
    const same = await startSimulator({
      seed: 0,
      timeScale: 50,
      outputLength: { distribution: 'lognormal', mean: 40 },
    });
    try {
      const ask = (url: string, rid: string) =>
        post(`${url}/generate`, gen([1, 2, 3, 4], { max_new_tokens: 1000 }, { rid }));
      const a1 = await ask(same.url, 'det');
      const a2 = await ask(same.url, 'det');
      expect(a2.json.output_ids).toEqual(a1.json.output_ids);
      expect(a2.json.text).toBe(a1.json.text);
      const lengths = new Set<number>();
      for (let i = 0; i < 8; i++) lengths.add((await ask(same.url, `det-${i}`)).json.output_ids.length);
      expect(lengths.size).toBeGreaterThan(1);
      const b = await ask(other.url, 'det');
      expect(b.json.output_ids).not.toEqual(a1.json.output_ids);
    } finally {
      await Promise.all([other.stop(), same.stop()]);
    }
  });

  it('reproduces the 0.5.2rc1 output_ids quirk and the 0.4.10 shapes', async () => {
    const rc = await startSimulator({
      version: '0.5.2rc1',
      timeScale: 50,
      outputLength: { distribution: 'fixed', mean: 20 },
    });
    const old = await startSimulator({
      version: '0.4.10',
      timeScale: 50,
      outputLength: { distribution: 'fixed', mean: 20 },
    });
    try {
      const prompt = [11, 12, 13, 14, 15, 16, 17];
      const r = await post(`${rc.url}/generate`, gen(prompt, { max_new_tokens: 128, ignore_eos: true }));
      expect(r.json.meta_info.completion_tokens).toBe(128);
      expect(r.json.output_ids).toHaveLength(133);
      expect(r.json.output_ids.slice(0, 5)).toEqual([13, 14, 15, 16, 17]);
      expect(r.json.meta_info.weight_version).toBe('default');
      expect(r.json.meta_info).not.toHaveProperty('num_retractions');

      const o = await post(`${old.url}/generate`, gen(prompt, { max_new_tokens: 64 }));
      expect(o.json.output_ids).toHaveLength(20);
      expect(Object.keys(o.json.meta_info).sort()).toEqual(
        ['cached_tokens', 'completion_tokens', 'e2e_latency', 'finish_reason', 'id', 'prompt_tokens'].sort(),
      );
      const chat = await post(`${old.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }] });
      expect(chat.json).not.toHaveProperty('metadata');
      expect((await call(`${old.url}/get_server_info`)).json.version).toBe('0.4.10');
      expect((await call(`${old.url}/get_model_info`)).json).not.toHaveProperty('weight_version');
    } finally {
      await Promise.all([rc.stop(), old.stop()]);
    }
  });
});

describe('faults, as a plain fetch client sees them', () => {
  const req = () => post(`${sim.url}/generate`, gen([1, 2, 3], { max_new_tokens: 4 }));

  it('errorRate: 500 with SGLang error body', async () => {
    sim.resetStats();
    sim.setFaults({ errorRate: 1 });
    const r = await req();
    expect(r.status).toBe(500);
    expect(r.json).toMatchObject({ object: 'error', type: '500', param: null, code: 500 });
    expect(typeof r.json.message).toBe('string');
    const chat = await post(`${sim.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'x' }] });
    expect(chat.status).toBe(500);
    expect(sim.stats()).toMatchObject({ failed: 2, requestsReceived: 2 });
  });

  it('burst503: the next N requests get 503, then normal service', async () => {
    sim.setFaults({ burst503: 2 });
    const [a, b] = [await req(), await req()];
    expect([a.status, b.status]).toEqual([503, 503]);
    expect(a.json).toMatchObject({ object: 'error', message: 'The request queue is full.', code: 503 });
    expect((await req()).status).toBe(200);
  });

  it('hangRate: no answer until the client gives up; abort_request answers a hung request', async () => {
    sim.resetStats();
    sim.setFaults({ hangRate: 1 });
    const timedOut = await post(
      `${sim.url}/generate`,
      gen([1], {}),
      'application/json',
      AbortSignal.timeout(300),
    ).catch((e: unknown) => e);
    expect((timedOut as Error).name).toBe('TimeoutError');
    await waitFor('hung request released', () => sim.stats().aborted === 1);
    const hung = post(`${sim.url}/generate`, gen([1], {}, { rid: 'hung-1' }));
    await waitFor('hung request registered', () => sim.stats().requests.some((r) => r.rid === 'hung-1'));
    await post(`${sim.url}/abort_request`, { rid: 'hung-1' });
    const r = await hung;
    expect(r.status).toBe(200);
    expect(r.json.meta_info.finish_reason.type).toBe('abort');
    expect(sim.stats().running).toBe(0);
  });

  it('dropRate: the connection is reset without a response', async () => {
    sim.setFaults({ dropRate: 1 });
    expect(['ECONNRESET', 'UND_ERR_SOCKET']).toContain(await fetchErrorCode(req()));
  });

  it('malformedRate: 200 with a truncated JSON body', async () => {
    sim.setFaults({ malformedRate: 1 });
    const res = await fetch(`${sim.url}/generate`, {
      method: 'POST',
      body: JSON.stringify(gen([1], { max_new_tokens: 4 })),
    });
    expect(res.status).toBe(200);
    await expect(res.json()).rejects.toThrow(SyntaxError);
  });

  it('unhealthy: health checks 503, generation still works', async () => {
    sim.setFaults({ unhealthy: true });
    expect((await call(`${sim.url}/health`)).status).toBe(503);
    expect((await call(`${sim.url}/health_generate`)).status).toBe(503);
    expect((await req()).status).toBe(200);
    sim.clearFaults();
    expect((await call(`${sim.url}/health`)).status).toBe(200);
  });

  it('outage: connection refused, then back on the same port', async () => {
    const url = sim.url;
    const inflight = post(`${url}/generate`, gen([1], { max_new_tokens: 3000, ignore_eos: true }));
    await waitFor('running', () => sim.stats().running === 1);
    const t0 = Date.now();
    await sim.outage(800);
    expect(await fetchErrorCode(inflight)).not.toBe('no error');
    expect(await fetchErrorCode(fetch(`${url}/health`))).toBe('ECONNREFUSED');
    expect(sim.stats().running).toBe(0);
    await waitFor('back up', async () => (await fetch(`${url}/health`).catch(() => undefined))?.status === 200);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(700);
    expect(sim.url).toBe(url);
    expect((await req()).status).toBe(200);
  });

  it('admin routes drive a simulator in another process', async () => {
    const faults = await post(`${sim.url}/_sim/faults`, { errorRate: 1 });
    expect(faults.json.errorRate).toBe(1);
    expect((await req()).status).toBe(500);
    expect((await post(`${sim.url}/_sim/faults?clear=1`, {})).json.errorRate).toBe(0);
    expect((await req()).status).toBe(200);
    await post(`${sim.url}/_sim/faults`, { errorRate: 1 });
    expect((await post(`${sim.url}/_sim/faults`, { clear: true })).json.errorRate).toBe(0);
    expect((await post(`${sim.url}/_sim/faults`, { errorRate: 7 })).status).toBe(400);

    expect((await post(`${sim.url}/_sim/reset`, {})).status).toBe(200);
    await req();
    const stats = await call(`${sim.url}/_sim/stats`);
    expect(stats.json).toMatchObject({ requestsReceived: 1, completed: 1, failed: 0, running: 0, queued: 0 });
    expect(stats.json.requests[0]).toMatchObject({ route: '/generate', promptTokens: 3, maxNewTokens: 4 });
    expect(stats.json.occupancy).toEqual({ meanRunning: expect.any(Number), windowMs: expect.any(Number) });

    const down = await post(`${sim.url}/_sim/outage`, { durationMs: 400 });
    expect(down.status).toBe(200);
    await waitFor('down', async () => (await fetchErrorCode(fetch(`${sim.url}/health`))) === 'ECONNREFUSED');
    await waitFor('back up', async () => (await fetch(`${sim.url}/health`).catch(() => undefined))?.status === 200);
  });

  it('maxQueuedRequests: 503 "The request queue is full." beyond it', async () => {
    const small = await startSimulator({ maxRunningRequests: 1, maxQueuedRequests: 1, timeScale: 20 });
    try {
      const slow = (rid: string) =>
        post(`${small.url}/generate`, gen([1], { max_new_tokens: 3000, ignore_eos: true }, { rid }));
      const a = slow('a');
      const b = slow('b');
      await waitFor('one running, one queued', () => small.stats().running === 1 && small.stats().queued === 1);
      const c = await slow('c');
      expect(c.status).toBe(503);
      expect(c.json).toMatchObject({ object: 'error', message: 'The request queue is full.', type: '503', code: 503 });
      await post(`${small.url}/abort_request`, { abort_all: true });
      await Promise.all([a, b]);
    } finally {
      await small.stop();
    }
  });
});

describe('continuous batching over HTTP', () => {
  it('aggregate throughput rises with concurrency, saturates at the slot limit; extra requests queue', async () => {
    const timeScale = 25;
    const config = { singleRequestTokensPerSec: 80, peakTokensPerSec: 2500 };
    const load = await startSimulator({
      ...config,
      timeScale,
      maxRunningRequests: 64,
      outputLength: { distribution: 'fixed', mean: 400 },
    });
    try {
      const rounds = 2;
      /** Output tokens per wall second with `concurrency` clients each sending `rounds` requests back to back. */
      const run = async (concurrency: number): Promise<number> => {
        const t0 = performance.now();
        let tokens = 0;
        await Promise.all(
          Array.from({ length: concurrency }, async (_, w) => {
            for (let r = 0; r < rounds; r++) {
              const res = await post(
                `${load.url}/generate`,
                gen([1, 2, 3, 4], { max_new_tokens: 1000 }, { rid: `c${concurrency}-${w}-${r}` }),
              );
              expect(res.json.output_ids).toHaveLength(400);
              tokens += res.json.meta_info.completion_tokens as number;
            }
          }),
        );
        return tokens / ((performance.now() - t0) / 1000);
      };
      await run(1); // warm-up (JIT, first connections)
      const t1 = await run(1);
      const t8 = await run(8);
      const t32 = await run(32);
      const t64 = await run(64);
      load.resetStats();
      let maxQueued = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          maxQueued = Math.max(maxQueued, load.stats().queued);
          await new Promise((r) => setTimeout(r, 5));
        }
      })();
      const t128 = await run(128);
      sampling = false;
      await sampler;

      // The server's ceilings, in tokens per wall second: client overhead only lowers what we see.
      const ceiling = (b: number): number => batchThroughput(b, config) * timeScale;
      expect(t1).toBeLessThanOrEqual(ceiling(1) * 1.02);
      expect(t8).toBeLessThanOrEqual(ceiling(8) * 1.02);
      expect(t1).toBeLessThan(t8);
      expect(t8).toBeLessThan(t32);
      expect(t32).toBeLessThan(t64 * 1.1);
      // 64 slots: twice the clients cannot beat the 64-request ceiling. (Wall-clock ratios
      // between runs are not compared: on a loaded 2-core machine they are noise.)
      expect(t128).toBeLessThanOrEqual(ceiling(64) * 1.02);
      expect(maxQueued).toBeGreaterThan(0);
      const stats = load.stats();
      expect(stats.maxRunningObserved).toBe(64);
      expect(stats.completed).toBe(128 * rounds);
      expect(stats.occupancy.meanRunning).toBeGreaterThan(32);
      expect(stats.occupancy.meanRunning).toBeLessThanOrEqual(64);
    } finally {
      await load.stop();
    }
  });
});

describe('tokenmill sim (CLI)', () => {
  let child: ChildProcess | undefined;
  afterEach(() => {
    if (child !== undefined && child.exitCode === null) child.kill('SIGKILL');
  });

  it('starts, logs its URL, serves SGLang, stops cleanly on SIGTERM', async () => {
    child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        'src/cli/main.ts',
        'sim',
        '--port',
        '0',
        '--time-scale',
        '100',
        '--output-distribution',
        'fixed',
        '--mean-output-tokens',
        '16',
      ],
      { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    const exited = new Promise<number | null>((resolve) => child?.on('exit', (code) => resolve(code)));
    await waitFor('URL on stdout', () => /listening on (http:\/\/\S+)/.test(stdout), 30_000);
    const url = /listening on (http:\/\/\S+)/.exec(stdout)?.[1] ?? '';
    const r = await post(
      `${url}/generate`,
      '{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":8}}',
      'application/x-www-form-urlencoded',
    );
    expect(r.status).toBe(200);
    expect(r.json.output_ids).toHaveLength(8);
    expect(r.json.meta_info.finish_reason).toEqual({ type: 'length', length: 8 });
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});
