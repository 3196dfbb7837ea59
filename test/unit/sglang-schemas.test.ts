import { errors as undiciErrors } from 'undici';
import { describe, expect, it } from 'vitest';

import {
  CancelledError,
  ConfigError,
  TimeoutError,
  UnavailableError,
  UpstreamHttpError,
} from '../../src/shared/errors.js';
import { SglangClient } from '../../src/shared/sglang/client.js';
import {
  EndpointMisconfiguredError,
  SglangBadRequestError,
  classifyResponse,
  isEndpointLevelStatus,
  classifyTransportError,
  errorCode,
  sglangErrorMessage,
} from '../../src/shared/sglang/errors.js';
import {
  GenerateResponseSchema,
  SglangSamplingParamsSchema,
  formatPath,
  plainGenerateResponse,
  parseChatResponse,
  parseGenerateResponse,
  parseLoad,
  parseModelInfo,
  parseServerInfo,
} from '../../src/shared/sglang/schemas.js';

const ctx = { endpoint: 'http://10.0.0.5:30000', route: 'POST /generate' };

/** A 0.5.x `/generate` body, as SGLang sends it (extra keys included). */
function body05(overrides: { output_ids?: unknown; meta?: Record<string, unknown> } = {}): Record<string, unknown> {
  return {
    text: ' Paris.',
    output_ids: overrides.output_ids ?? [12095, 13, 151645],
    meta_info: {
      id: 'ds1/42',
      finish_reason: { type: 'stop', matched: 151645 },
      prompt_tokens: 14,
      weight_version: 'default',
      total_retractions: 0,
      completion_tokens: 3,
      cached_tokens: 8,
      cached_tokens_details: { device: 8, host: 0 },
      e2e_latency: 0.0561,
      response_sent_to_client_ts: 1757000000.1,
      spec_accept_length: 2.4,
      ...overrides.meta,
    },
  };
}

function problemOf(outcome: { ok: boolean; problem?: string }): string {
  expect(outcome.ok).toBe(false);
  return outcome.problem ?? '';
}

describe('plainGenerateResponse (the hand check before zod)', () => {
  it('takes only bodies zod takes, and takes the plain ones as they are', () => {
    const metas: Record<string, unknown>[] = [
      {},
      { finish_reason: { type: 'length', length: 3 } },
      { finish_reason: { type: 'length', length: -1 } },
      { finish_reason: { type: 'length' } },
      { finish_reason: { type: 'stop', matched: null } },
      { finish_reason: { type: 'stop', matched: '</s>' } },
      { finish_reason: { type: 'stop', matched: [1, 2] } },
      { finish_reason: { type: 'stop', matched: [1, 'x'] } },
      { finish_reason: { type: 'stop', matched: 1.5 } },
      { finish_reason: { type: 'stop' } },
      { finish_reason: { type: 'abort', message: 'x', status_code: 400 } },
      { finish_reason: { type: 'abort' } },
      { finish_reason: { type: 'other' } },
      { finish_reason: null },
      { finish_reason: [] },
      { prompt_tokens: -1 },
      { prompt_tokens: 1.5 },
      { prompt_tokens: '14' },
      { prompt_tokens: 2 ** 60 },
      { completion_tokens: undefined },
      { cached_tokens: undefined },
      { cached_tokens: -3 },
      { cached_tokens: null },
      { e2e_latency: -0.1 },
      { e2e_latency: '0.1' },
      { e2e_latency: undefined },
      { id: 7 },
      { id: undefined },
      { weight_version: { any: 'thing' } },
    ];
    const idLists: unknown[] = [
      [1, 2, 3],
      [],
      [1, -2, 3],
      [1, 2.5, 3],
      [1, '2', 3],
      [1, null],
      'x',
      undefined,
      [0, 2 ** 53],
    ];
    const bodies: unknown[] = [
      null,
      [],
      'x',
      3,
      {},
      { ...body05(), text: 5 },
      { ...body05(), text: undefined },
      { ...body05(), meta_info: [] },
    ];
    for (const meta of metas) for (const ids of idLists) bodies.push(body05({ output_ids: ids, meta }));
    let taken = 0;
    for (const body of bodies) {
      const fast = plainGenerateResponse(body);
      const zod = GenerateResponseSchema.safeParse(body);
      if (fast !== undefined) {
        taken += 1;
        expect(zod.success, JSON.stringify(body)).toBe(true);
        expect(fast).toEqual(zod.data);
      }
    }
    // Most plain bodies are taken by hand (else the check would save nothing).
    expect(taken).toBeGreaterThan(10);
    expect(plainGenerateResponse(body05())).toBeDefined();
  });
});

describe('parseGenerateResponse', () => {
  it('parses a 0.5.x body, keeping meta_info and the finish reason as sent', () => {
    const r = parseGenerateResponse(body05());
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.outputIds).toEqual([12095, 13, 151645]);
    expect(r.value.promptTokens).toBe(14);
    expect(r.value.completionTokens).toBe(3);
    expect(r.value.finishReason).toEqual({ type: 'stop', matched: 151645 });
    expect(r.value.cachedTokens).toBe(8);
    expect(r.value.e2eLatencySec).toBeCloseTo(0.0561);
    expect(r.value.text).toBe(' Paris.');
    expect(r.value.droppedLeadingIds).toBe(0);
    expect(r.value.metaInfo['spec_accept_length']).toBe(2.4);
    expect(r.value.metaInfo['cached_tokens_details']).toEqual({ device: 8, host: 0 });
  });

  it('keeps the last completion_tokens ids when output_ids has extra leading ids (0.5.2rc1)', () => {
    const ids = Array.from({ length: 133 }, (_, i) => 1000 + i);
    const r = parseGenerateResponse(
      body05({ output_ids: ids, meta: { completion_tokens: 128, finish_reason: { type: 'length', length: 128 } } }),
    );
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.outputIds).toHaveLength(128);
    expect(r.value.outputIds[0]).toBe(1005);
    expect(r.value.outputIds.at(-1)).toBe(1132);
    expect(r.value.droppedLeadingIds).toBe(5);
    expect(r.value.finishReason).toEqual({ type: 'length', length: 128 });
  });

  it('returns no ids for completion_tokens 0, even with leading ids present', () => {
    const r = parseGenerateResponse(body05({ output_ids: [7, 8, 9, 10, 11], meta: { completion_tokens: 0 } }));
    expect(r.ok && r.value.outputIds).toEqual([]);
  });

  it('accepts a 0.4.x body without weight_version, e2e_latency or cached_tokens', () => {
    const r = parseGenerateResponse({
      text: 'hi',
      output_ids: [5, 6],
      meta_info: {
        id: 'r1',
        finish_reason: { type: 'length', length: 2 },
        prompt_tokens: 3,
        completion_tokens: 2,
      },
    });
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.cachedTokens).toBeUndefined();
    expect(r.value.e2eLatencySec).toBeUndefined();
    expect(r.value.outputIds).toEqual([5, 6]);
  });

  it('treats a missing text as empty: token ids are what matters', () => {
    const b = body05();
    delete b['text'];
    const r = parseGenerateResponse(b);
    expect(r.ok && r.value.text).toBe('');
  });

  it('rejects output_ids shorter than completion_tokens, naming the field', () => {
    const p = problemOf(parseGenerateResponse(body05({ output_ids: [1, 2], meta: { completion_tokens: 3 } })));
    expect(p).toBe('output_ids: has 2 ids, fewer than meta_info.completion_tokens (3)');
  });

  it('names a missing required field and what it got', () => {
    const b = body05();
    delete (b['meta_info'] as Record<string, unknown>)['completion_tokens'];
    expect(problemOf(parseGenerateResponse(b))).toBe('meta_info.completion_tokens: expected number, got undefined');
    expect(problemOf(parseGenerateResponse({ meta_info: {} }))).toContain('output_ids: expected array, got undefined');
    expect(problemOf(parseGenerateResponse(null))).toBe('(root): expected object, got null');
  });

  it('names an element of the wrong type with its index', () => {
    expect(problemOf(parseGenerateResponse(body05({ output_ids: [1, 'x', 3] })))).toBe(
      'output_ids[1]: expected number, got string "x"',
    );
  });

  it('treats a null finish_reason in a final response as an error', () => {
    expect(problemOf(parseGenerateResponse(body05({ meta: { finish_reason: null } })))).toBe(
      'meta_info.finish_reason: expected object, got null',
    );
  });

  it('rejects an unknown finish_reason type, naming meta_info.finish_reason.type', () => {
    const p = problemOf(parseGenerateResponse(body05({ meta: { finish_reason: { type: 'weird' } } })));
    expect(p).toMatch(/^meta_info\.finish_reason\.type: /);
  });

  it('accepts every stop shape: token id, token id list, string, null', () => {
    for (const matched of [151645, [151643, 151645], '</answer>', null]) {
      const r = parseGenerateResponse(body05({ meta: { finish_reason: { type: 'stop', matched } } }));
      expect(r.ok && r.value.finishReason).toEqual({ type: 'stop', matched });
    }
    const p = problemOf(parseGenerateResponse(body05({ meta: { finish_reason: { type: 'stop' } } })));
    expect(p).toBe('meta_info.finish_reason.matched: expected number | string | array | null, got undefined');
  });

  it('keeps the extra keys of an abort finish reason', () => {
    const fr = { type: 'abort', message: 'Abort before prefill', status_code: 200, err_type: null };
    const r = parseGenerateResponse(body05({ meta: { finish_reason: fr } }));
    expect(r.ok && r.value.finishReason).toEqual(fr);
  });

  it('rejects a negative completion_tokens', () => {
    expect(problemOf(parseGenerateResponse(body05({ meta: { completion_tokens: -1 } })))).toMatch(
      /^meta_info\.completion_tokens: .*got number -1/,
    );
  });
});

describe('parseChatResponse', () => {
  const chatBody = (choice: Record<string, unknown> = {}, usage: unknown = undefined): Record<string, unknown> => ({
    id: '0a1b2c3d4e5f60718293a4b5c6d7e8f9',
    object: 'chat.completion',
    created: 1757000000,
    model: 'qwen/qwen3-8b',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: 'The answer is 4.', reasoning_content: '2+2=4', tool_calls: null },
        logprobs: null,
        finish_reason: 'stop',
        matched_stop: 151645,
        ...choice,
      },
    ],
    usage: usage ?? {
      prompt_tokens: 20,
      completion_tokens: 7,
      total_tokens: 27,
      prompt_tokens_details: null,
      reasoning_tokens: 3,
    },
    metadata: { weight_version: 'default' },
  });

  it('parses the first choice and the usage', () => {
    const r = parseChatResponse(chatBody());
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value).toMatchObject({
      content: 'The answer is 4.',
      reasoningContent: '2+2=4',
      toolCalls: [],
      finishReason: 'stop',
      matchedStop: 151645,
      promptTokens: 20,
      completionTokens: 7,
    });
    expect(r.value.raw['metadata']).toEqual({ weight_version: 'default' });
  });

  it('reads a null content as empty and keeps tool calls', () => {
    const call = { id: 'call_1', type: 'function', function: { name: 'f', arguments: '{}' } };
    const r = parseChatResponse(
      chatBody({ message: { role: 'assistant', content: null, tool_calls: [call] }, finish_reason: 'tool_calls' }),
    );
    expect(r.ok && r.value.content).toBe('');
    expect(r.ok && r.value.reasoningContent).toBeNull();
    expect(r.ok && r.value.toolCalls).toEqual([call]);
    expect(r.ok && r.value.finishReason).toBe('tool_calls');
  });

  it('names missing usage fields and a null finish_reason', () => {
    expect(problemOf(parseChatResponse(chatBody({}, { prompt_tokens: 3 })))).toBe(
      'usage.completion_tokens: expected number, got undefined',
    );
    expect(problemOf(parseChatResponse(chatBody({ finish_reason: null })))).toBe(
      'choices[0].finish_reason: expected string, got null',
    );
    expect(problemOf(parseChatResponse({ ...chatBody(), choices: [] }))).toMatch(/^choices: /);
  });
});

describe('info endpoints', () => {
  it('parses model info with and without newer keys', () => {
    const r = parseModelInfo({
      model_path: 'Qwen/Qwen3-8B',
      tokenizer_path: 'Qwen/Qwen3-8B',
      is_generation: true,
      preferred_sampling_params: null,
      weight_version: 'default',
      has_image_understanding: false,
    });
    expect(r.ok && r.value.model_path).toBe('Qwen/Qwen3-8B');
    expect(r.ok && r.value['has_image_understanding']).toBe(false);
    expect(parseModelInfo({ model_path: 'm', tokenizer_path: null, is_generation: true }).ok).toBe(true);
    expect(problemOf(parseModelInfo({ tokenizer_path: 'x' }))).toBe('model_path: expected string, got undefined');
  });

  it('parses server info tolerantly', () => {
    const r = parseServerInfo({
      model_path: 'Qwen/Qwen3-8B',
      context_length: null,
      max_total_num_tokens: 500000,
      max_running_requests: 256,
      internal_states: [{ last_gen_throughput: 1234.5, load: 3 }],
      version: '0.5.4',
      tp_size: 1,
    });
    expect(r.ok && r.value.max_running_requests).toBe(256);
    expect(r.ok && r.value['tp_size']).toBe(1);
  });

  it('normalizes the three load shapes to one entry per rank', () => {
    const list = parseLoad([{ dp_rank: 0, num_reqs: 5, num_waiting_reqs: 1, num_tokens: 900 }]);
    expect(list.ok && list.value).toEqual([{ dp_rank: 0, num_reqs: 5, num_waiting_reqs: 1, num_tokens: 900 }]);
    const loads = parseLoad({
      timestamp: 1,
      dp_rank_count: 2,
      loads: [{ dp_rank: 0 }, { dp_rank: 1, num_running_reqs: 4 }],
    });
    expect(loads.ok && loads.value).toHaveLength(2);
    const single = parseLoad({ num_reqs: 2 });
    expect(single.ok && single.value).toEqual([{ num_reqs: 2 }]);
    expect(problemOf(parseLoad({ loads: [{ dp_rank: 'zero' }] }))).toBe(
      'loads[0].dp_rank: expected number, got string "zero"',
    );
  });
});

describe('SglangSamplingParamsSchema', () => {
  it('requires max_new_tokens and passes unknown parameters through', () => {
    const r = SglangSamplingParamsSchema.safeParse({ max_new_tokens: 64, temperature: 0.6, regex: '\\d+' });
    expect(r.success && r.data['regex']).toBe('\\d+');
    expect(SglangSamplingParamsSchema.safeParse({ temperature: 0.6 }).success).toBe(false);
  });
});

describe('formatPath', () => {
  it('writes keys dotted and indices bracketed', () => {
    expect(formatPath(['choices', 0, 'message', 'content'])).toBe('choices[0].message.content');
    expect(formatPath([])).toBe('(root)');
  });
});

describe('sglangErrorMessage', () => {
  it('reads every error body shape SGLang and FastAPI produce', () => {
    expect(sglangErrorMessage('{"error":{"message":"top_p must be in (0, 1], got 1.5."}}')).toBe(
      'top_p must be in (0, 1], got 1.5.',
    );
    expect(
      sglangErrorMessage(
        '{"object":"error","message":"The request queue is full.","type":"503","param":null,"code":503}',
      ),
    ).toBe('The request queue is full.');
    expect(sglangErrorMessage('{"detail":"Internal server error: CUDA out of memory"}')).toBe(
      'Internal server error: CUDA out of memory',
    );
    expect(
      sglangErrorMessage('{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}'),
    ).toBe('body.messages: Field required');
    expect(sglangErrorMessage('{"error":"boom"}')).toBe('boom');
    expect(sglangErrorMessage('Internal Server Error')).toBe('Internal Server Error');
    expect(sglangErrorMessage('   ')).toBeUndefined();
    expect(sglangErrorMessage('x'.repeat(2000))?.length).toBeLessThan(600);
  });
});

describe('classifyResponse', () => {
  it('returns null for 2xx', () => {
    expect(classifyResponse(200, '{}', ctx)).toBeNull();
    expect(classifyResponse(204, '', ctx)).toBeNull();
  });

  it("turns a context-length 400 into a non-retryable SglangBadRequestError with SGLang's message", () => {
    const msg = "The input (40000 tokens) is longer than the model's context length (32768 tokens).";
    const e = classifyResponse(400, JSON.stringify({ error: { message: msg } }), ctx);
    expect(e).toBeInstanceOf(SglangBadRequestError);
    expect(e).toBeInstanceOf(UpstreamHttpError);
    const bad = e as SglangBadRequestError;
    expect(bad.retryable).toBe(false);
    expect(bad.status).toBe(400);
    expect(bad.endpoint).toBe(ctx.endpoint);
    expect(bad.sglangMessage).toBe(msg);
    expect(bad.message).toContain(msg);
    expect(bad.contextLengthExceeded).toBe(true);

    const total = classifyResponse(
      400,
      JSON.stringify({
        error: {
          message:
            "Requested token count exceeds the model's maximum context length of 32768 tokens. You requested a total of 33000 tokens.",
        },
      }),
      ctx,
    ) as SglangBadRequestError;
    expect(total.contextLengthExceeded).toBe(true);
  });

  it('turns a bad-parameter 400 (native and OpenAI shapes) into a non-retryable error', () => {
    const e = classifyResponse(
      400,
      '{"error":{"message":"top_p must be in (0, 1], got 1.5."}}',
      ctx,
    ) as SglangBadRequestError;
    expect(e).toBeInstanceOf(SglangBadRequestError);
    expect(e.retryable).toBe(false);
    expect(e.contextLengthExceeded).toBe(false);
    expect(e.sglangMessage).toBe('top_p must be in (0, 1], got 1.5.');
    const openai = classifyResponse(
      400,
      '{"object":"error","message":"max_tokens must be positive","type":"BadRequestError","param":null,"code":400}',
      { endpoint: ctx.endpoint, route: 'POST /v1/chat/completions' },
    ) as SglangBadRequestError;
    expect(openai.sglangMessage).toBe('max_tokens must be positive');
  });

  it('makes 401/403/404/405/422 an endpoint-level EndpointMisconfiguredError (the prompt keeps its attempts)', () => {
    const hints: Record<number, string> = {
      401: 'check sglang.apiKey',
      403: 'check sglang.apiKey',
      404: "check the endpoint's base path",
      405: "check the endpoint's base path",
      422: 'check sglang.endpoints',
    };
    for (const status of [401, 403, 404, 405, 422]) {
      const e = classifyResponse(status, '{"detail":"Not Found"}', ctx);
      expect(e, String(status)).toBeInstanceOf(EndpointMisconfiguredError);
      expect(e).toBeInstanceOf(UnavailableError);
      expect(e).not.toBeInstanceOf(SglangBadRequestError);
      const m = e as EndpointMisconfiguredError;
      expect(m.status).toBe(status);
      expect(m.endpoint).toBe(ctx.endpoint);
      expect(m.route).toBe(ctx.route);
      expect(m.retryable).toBe(true);
      expect(m.message).toContain(`SGLang endpoint ${ctx.endpoint} answered ${status}`);
      expect(m.message).toContain(`to ${ctx.route}`);
      expect(m.message).toContain(hints[status]);
      expect(isEndpointLevelStatus(status)).toBe(true);
    }
    expect(classifyResponse(401, '{"error":"Unauthorized"}', ctx)?.message).toContain('401 Unauthorized to');
  });

  it('makes 413 fail the prompt, and 408/429 retryable', () => {
    const e = classifyResponse(413, '{"detail":"Request Entity Too Large"}', ctx);
    expect(e).toBeInstanceOf(UpstreamHttpError);
    expect(e).not.toBeInstanceOf(EndpointMisconfiguredError);
    expect(e?.retryable).toBe(false);
    expect((e as UpstreamHttpError).status).toBe(413);
    expect(e?.message).toContain('too large');
    for (const status of [408, 429]) {
      expect(classifyResponse(status, '', ctx)?.retryable).toBe(true);
      expect(classifyResponse(status, '', ctx)).not.toBeInstanceOf(EndpointMisconfiguredError);
    }
    for (const status of [400, 408, 413, 429, 500, 503]) expect(isEndpointLevelStatus(status)).toBe(false);
  });

  it('makes 5xx retryable with its status and message', () => {
    const e = classifyResponse(
      503,
      '{"object":"error","message":"The request queue is full.","type":"503","code":503}',
      ctx,
    );
    expect(e).toBeInstanceOf(UpstreamHttpError);
    expect(e?.retryable).toBe(true);
    expect((e as UpstreamHttpError).status).toBe(503);
    expect(e?.message).toContain('The request queue is full.');
    const e500 = classifyResponse(500, '', ctx) as UpstreamHttpError;
    expect(e500.retryable).toBe(true);
    expect(e500.status).toBe(500);
    expect(e500.message).toContain('(empty body)');
  });
});

describe('classifyTransportError', () => {
  const sysError = (code: string): Error => Object.assign(new Error(`connect ${code} 127.0.0.1:1`), { code });

  it('maps connection failures to UnavailableError with the endpoint', () => {
    for (const code of ['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'EPIPE']) {
      const e = classifyTransportError(sysError(code), ctx);
      expect(e, code).toBeInstanceOf(UnavailableError);
      expect((e as UnavailableError).endpoint).toBe(ctx.endpoint);
      expect(e.retryable).toBe(true);
      expect(e.message).toContain(code);
    }
    expect(classifyTransportError(new undiciErrors.SocketError('other side closed'), ctx)).toBeInstanceOf(
      UnavailableError,
    );
    expect(classifyTransportError(new undiciErrors.ConnectTimeoutError(), ctx)).toBeInstanceOf(UnavailableError);
  });

  it('finds the code inside an AggregateError (happy eyeballs) and a cause chain', () => {
    const agg = new AggregateError([sysError('ECONNREFUSED'), sysError('ECONNREFUSED')], 'connect failed');
    expect(errorCode(agg)).toBe('ECONNREFUSED');
    expect(classifyTransportError(agg, ctx)).toBeInstanceOf(UnavailableError);
    const wrapped = new Error('fetch failed', { cause: sysError('ECONNRESET') });
    expect(classifyTransportError(wrapped, ctx)).toBeInstanceOf(UnavailableError);
  });

  it('maps undici timeouts to TimeoutError and a closed client to CancelledError', () => {
    expect(classifyTransportError(new undiciErrors.HeadersTimeoutError(), ctx)).toBeInstanceOf(TimeoutError);
    expect(classifyTransportError(new undiciErrors.BodyTimeoutError(), ctx)).toBeInstanceOf(TimeoutError);
    expect(classifyTransportError(new undiciErrors.ClientClosedError(), ctx)).toBeInstanceOf(CancelledError);
    expect(classifyTransportError(new undiciErrors.ClientDestroyedError(), ctx)).toBeInstanceOf(CancelledError);
  });

  it('maps anything else to a retryable UpstreamHttpError', () => {
    const e = classifyTransportError(new Error('Parse Error: Invalid header value char'), ctx);
    expect(e).toBeInstanceOf(UpstreamHttpError);
    expect(e).not.toBeInstanceOf(UnavailableError);
    expect(e.retryable).toBe(true);
  });
});

describe('SglangClient options', () => {
  it('rejects a bad endpoint, concurrency or timeout with a ConfigError', () => {
    expect(() => new SglangClient({ endpoint: 'not a url', concurrency: 1, requestTimeoutMs: 1000 })).toThrow(
      ConfigError,
    );
    expect(() => new SglangClient({ endpoint: 'ftp://h:1', concurrency: 1, requestTimeoutMs: 1000 })).toThrow(
      /http\(s\)/,
    );
    expect(() => new SglangClient({ endpoint: 'http://h:1', concurrency: 0, requestTimeoutMs: 1000 })).toThrow(
      /concurrency/,
    );
    expect(() => new SglangClient({ endpoint: 'http://h:1', concurrency: 2, requestTimeoutMs: 0 })).toThrow(
      /requestTimeoutMs/,
    );
  });
});
