/**
 * Parsing and validation of generation requests, with SGLang's rules and messages
 * (`io_struct.GenerateReqInput`, `TokenizerManager._validate_one_request`,
 * `SamplingParams.verify`).
 */
import { randomUUID } from 'node:crypto';

import { isRecord } from '../shared/index.js';
import { HttpReplyError, validationError } from './http-util.js';
import type { SimVersion } from './types.js';

/** What SGLang raises as `ValueError`: a 400 whose body shape depends on the route. */
export class SimValueError extends Error {}

export interface SamplingSpec {
  /** null: none given (the rest of the context). */
  maxNewTokens: number | null;
  minNewTokens: number;
  ignoreEos: boolean;
  stopTokenIds: number[];
  skipSpecialTokens: boolean;
  noStopTrim: boolean;
}

export interface GenerateItem {
  rid: string;
  inputIds: number[];
  sampling: SamplingSpec;
  /** max_new_tokens in effect: the given value, or the rest of the context. */
  maxNewTokens: number;
}

export interface ParsedGenerate {
  items: GenerateItem[];
  isBatch: boolean;
  stream: boolean;
  returnLogprob: boolean;
}

export interface ParseContext {
  encode(text: string): number[];
  vocabSize: number;
  contextLength: number;
  version: SimVersion;
}

/** A request id as SGLang makes one: uuid4 hex. */
export function newRid(): string {
  return randomUUID().replace(/-/g, '');
}

/** Formats a value roughly as Python's f-string prints it, for SGLang's messages. */
function py(value: unknown): string {
  if (typeof value === 'boolean') return value ? 'True' : 'False';
  if (value === null || value === undefined) return 'None';
  return String(value);
}

function numberField(raw: Record<string, unknown>, key: string, fallback: number): number {
  const value = raw[key];
  if (value === undefined || value === null) return fallback;
  if (typeof value !== 'number' || Number.isNaN(value)) {
    throw new SimValueError(`sampling_params.${key} must be a number, got ${JSON.stringify(value)}.`);
  }
  return value;
}

function boolField(raw: Record<string, unknown>, key: string, fallback: boolean): boolean {
  const value = raw[key];
  if (value === undefined || value === null) return fallback;
  if (typeof value !== 'boolean')
    throw new SimValueError(`sampling_params.${key} must be a boolean, got ${JSON.stringify(value)}.`);
  return value;
}

/** Normalizes and verifies one `sampling_params` dict as `SamplingParams(...).verify()` does. */
export function parseSamplingParams(raw: unknown): SamplingSpec {
  if (raw === undefined || raw === null) raw = {};
  if (!isRecord(raw)) throw new SimValueError('sampling_params must be a dict.');

  const temperature = numberField(raw, 'temperature', 1.0);
  const topP = numberField(raw, 'top_p', 1.0);
  let topK = numberField(raw, 'top_k', -1);
  const minP = numberField(raw, 'min_p', 0.0);
  const frequencyPenalty = numberField(raw, 'frequency_penalty', 0.0);
  const presencePenalty = numberField(raw, 'presence_penalty', 0.0);
  const repetitionPenalty = numberField(raw, 'repetition_penalty', 1.0);
  const minNewTokens = numberField(raw, 'min_new_tokens', 0);
  let maxNewTokens: number | null = 128;
  if ('max_new_tokens' in raw) {
    const value = raw.max_new_tokens;
    if (value === null) maxNewTokens = null;
    else if (typeof value !== 'number' || Number.isNaN(value)) {
      throw new SimValueError(`sampling_params.max_new_tokens must be an integer, got ${JSON.stringify(value)}.`);
    } else maxNewTokens = value;
  }

  // SamplingParams.__init__: a temperature near zero means greedy (top_k 1); -1 means all.
  if (temperature >= 0 && temperature < 1e-6) topK = 1;
  if (topK === -1) topK = 1 << 30;

  if (temperature < 0) throw new SimValueError(`temperature must be non-negative, got ${py(temperature)}.`);
  if (!(topP > 0 && topP <= 1)) throw new SimValueError(`top_p must be in (0, 1], got ${py(topP)}.`);
  if (!(minP >= 0 && minP <= 1)) throw new SimValueError(`min_p must be in [0, 1], got ${py(minP)}.`);
  if (topK < 1 || topK === -1) throw new SimValueError(`top_k must be -1 (disable), or at least 1, got ${py(topK)}.`);
  if (!(frequencyPenalty >= -2 && frequencyPenalty <= 2)) {
    throw new SimValueError(`frequency_penalty must be in [-2, 2], got ${py(frequencyPenalty)}.`);
  }
  if (!(presencePenalty >= -2 && presencePenalty <= 2)) {
    throw new SimValueError(`presence_penalty must be in [-2, 2], got ${py(presencePenalty)}.`);
  }
  if (!(repetitionPenalty >= 0 && repetitionPenalty <= 2)) {
    throw new SimValueError(`repetition_penalty must be in [0, 2], got ${py(repetitionPenalty)}.`);
  }
  if (!(minNewTokens >= 0))
    throw new SimValueError(`min_new_tokens must be in [0, max_new_tokens], got ${py(minNewTokens)}.`);
  if (maxNewTokens !== null) {
    if (maxNewTokens < 0) throw new SimValueError(`max_new_tokens must be at least 0, got ${py(maxNewTokens)}.`);
    if (!(minNewTokens <= maxNewTokens)) {
      throw new SimValueError(
        `min_new_tokens must be in [0, max_new_tokens(${py(maxNewTokens)})], got ${py(minNewTokens)}.`,
      );
    }
  }

  const stopTokenIds: number[] = [];
  const rawStopIds = raw.stop_token_ids;
  if (rawStopIds !== undefined && rawStopIds !== null) {
    if (!Array.isArray(rawStopIds))
      throw new SimValueError('sampling_params.stop_token_ids must be a list of integers.');
    for (const id of rawStopIds) {
      if (typeof id !== 'number' || !Number.isInteger(id) || id < 0) {
        throw new SimValueError(
          `sampling_params.stop_token_ids must be a list of integers, got ${JSON.stringify(id)}.`,
        );
      }
      if (!stopTokenIds.includes(id)) stopTokenIds.push(id);
    }
  }
  const stop = raw.stop;
  if (
    stop !== undefined &&
    stop !== null &&
    typeof stop !== 'string' &&
    !(Array.isArray(stop) && stop.every((s) => typeof s === 'string'))
  ) {
    throw new SimValueError('sampling_params.stop must be a string or a list of strings.');
  }

  return {
    maxNewTokens: maxNewTokens === null ? null : Math.floor(maxNewTokens),
    minNewTokens: Math.floor(minNewTokens),
    ignoreEos: boolField(raw, 'ignore_eos', false),
    stopTokenIds,
    skipSpecialTokens: boolField(raw, 'skip_special_tokens', true),
    noStopTrim: boolField(raw, 'no_stop_trim', false),
  };
}

/** `_validate_one_request`: the prompt, and the prompt plus max_new_tokens, must fit the context. */
export function validateLength(
  inputTokens: number,
  maxNewTokens: number | null,
  contextLength: number,
  version: SimVersion,
): void {
  if (inputTokens >= contextLength) {
    throw new SimValueError(
      `The input (${inputTokens} tokens) is longer than the model's context length (${contextLength} tokens).`,
    );
  }
  if (maxNewTokens === null) return;
  const total = maxNewTokens + inputTokens;
  const tooLong = version === '0.4.10' ? total >= contextLength : total > contextLength;
  if (tooLong) {
    throw new SimValueError(
      `Requested token count exceeds the model's maximum context length of ${contextLength} tokens. ` +
        `You requested a total of ${total} tokens: ${inputTokens} tokens from the input messages and ` +
        `${maxNewTokens} tokens for the completion. Please reduce the number of tokens in the input ` +
        `messages or the completion to fit within the limit.`,
    );
  }
}

function checkInputIds(ids: unknown, vocabSize: number): number[] {
  if (!Array.isArray(ids) || !ids.every((x) => typeof x === 'number' && Number.isInteger(x))) {
    throw validationError(
      "1 validation error:\n  {'type': 'int_type', 'loc': ('body', 'input_ids'), 'msg': 'Input should be a valid integer'}",
    );
  }
  const list = ids as number[];
  if (list.some((id) => id < 0 || id >= vocabSize)) {
    throw new SimValueError(
      `The input_ids [${list.join(', ')}] contains values greater than the vocab size (${vocabSize}).`,
    );
  }
  return list;
}

/** Parses a /generate body into one item per prompt (one for a single request). */
export function parseGenerate(body: unknown, ctx: ParseContext): ParsedGenerate {
  if (!isRecord(body)) {
    throw validationError(
      "1 validation error:\n  {'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary or object to extract fields from'}",
    );
  }
  const text = body.text ?? null;
  const inputIds = body.input_ids ?? null;
  if ((text === null) === (inputIds === null)) {
    throw new SimValueError('Either text, input_ids or input_embeds should be provided.');
  }

  let prompts: Array<{ text?: string; ids?: unknown }>;
  let isBatch: boolean;
  if (text !== null) {
    if (typeof text === 'string') {
      prompts = [{ text }];
      isBatch = false;
    } else if (Array.isArray(text) && text.every((t) => typeof t === 'string')) {
      prompts = (text as string[]).map((t) => ({ text: t }));
      isBatch = true;
    } else {
      throw validationError(
        "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'text'), 'msg': 'Input should be a valid string'}",
      );
    }
  } else {
    if (!Array.isArray(inputIds)) {
      throw validationError(
        "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'input_ids'), 'msg': 'Input should be a valid list'}",
      );
    }
    isBatch = inputIds.length > 0 && Array.isArray(inputIds[0]);
    prompts = isBatch ? (inputIds as unknown[]).map((ids) => ({ ids })) : [{ ids: inputIds }];
  }
  if (isBatch && prompts.length === 0) throw new SimValueError('The batch is empty.');
  const n = prompts.length;

  // Request ids: a string becomes rid_0…rid_{n-1} for a batch; a list must match the batch.
  let rids: string[];
  const rid = body.rid ?? null;
  if (rid === null) rids = prompts.map(() => newRid());
  else if (typeof rid === 'string') rids = isBatch ? prompts.map((_, i) => `${rid}_${i}`) : [rid];
  else if (Array.isArray(rid) && rid.every((r) => typeof r === 'string')) {
    if (!isBatch) {
      if (rid.length !== 1) throw new SimValueError('The rid should be a string for a single request.');
      rids = [rid[0] as string];
    } else {
      if (rid.length !== n)
        throw new SimValueError('The specified rids length mismatch with the batch_size for batch processing.');
      rids = rid as string[];
    }
  } else {
    throw validationError(
      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'rid'), 'msg': 'Input should be a valid string'}",
    );
  }
  if (new Set(rids).size !== rids.length) {
    throw new SimValueError(
      `Duplicate request IDs detected within the request: [${rids.map((r) => `'${r}'`).join(', ')}]`,
    );
  }

  const rawSampling = body.sampling_params;
  let samplingList: unknown[];
  if (Array.isArray(rawSampling)) {
    if (!isBatch && rawSampling.length === 1) samplingList = rawSampling;
    else if (rawSampling.length !== n) {
      throw new SimValueError('The length of sampling_params does not match the batch size.');
    } else samplingList = rawSampling;
  } else {
    samplingList = prompts.map(() => rawSampling);
  }

  const items: GenerateItem[] = prompts.map((prompt, i) => {
    const ids = prompt.text !== undefined ? ctx.encode(prompt.text) : checkInputIds(prompt.ids, ctx.vocabSize);
    const sampling = parseSamplingParams(samplingList[i]);
    validateLength(ids.length, sampling.maxNewTokens, ctx.contextLength, ctx.version);
    return {
      rid: rids[i] ?? newRid(),
      inputIds: ids,
      sampling,
      maxNewTokens: sampling.maxNewTokens ?? Math.max(0, ctx.contextLength - ids.length),
    };
  });

  const stream = body.stream ?? false;
  if (typeof stream !== 'boolean') {
    throw validationError(
      "1 validation error:\n  {'type': 'bool_type', 'loc': ('body', 'stream'), 'msg': 'Input should be a valid boolean'}",
    );
  }
  return { items, isBatch, stream, returnLogprob: body.return_logprob === true };
}

// --- /v1/chat/completions ---

export interface ChatTemplateMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
  reasoning_content?: string;
  tool_calls?: unknown[];
  name?: string;
  tool_call_id?: string;
}

export interface ParsedChat {
  item: GenerateItem;
  model: string;
  stream: boolean;
  includeUsage: boolean;
}

export interface ChatParseContext {
  render(
    messages: ChatTemplateMessage[],
    tools: unknown[] | undefined,
    templateKwargs: Record<string, unknown> | undefined,
  ): number[];
  vocabSize: number;
  contextLength: number;
  version: SimVersion;
  servedModelName: string;
}

function chatContent(value: unknown, index: number): string {
  if (typeof value === 'string') return value;
  if (value === null || value === undefined) return '';
  if (Array.isArray(value)) {
    return value
      .map((part) => {
        if (isRecord(part) && part.type === 'text' && typeof part.text === 'string') return part.text;
        throw validationError(
          `1 validation error:\n  {'type': 'union_tag_invalid', 'loc': ('body', 'messages', ${index}, 'content'), 'msg': 'unsupported content part'}`,
        );
      })
      .join('');
  }
  throw validationError(
    `1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', ${index}, 'content'), 'msg': 'Input should be a valid string'}`,
  );
}

/** Parses a /v1/chat/completions body and renders its prompt with the chat template. */
export function parseChat(body: unknown, ctx: ChatParseContext): ParsedChat {
  if (!isRecord(body)) {
    throw validationError(
      "1 validation error:\n  {'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary'}",
    );
  }
  const rawMessages = body.messages;
  if (!Array.isArray(rawMessages)) {
    throw validationError(
      "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}",
    );
  }
  const messages: ChatTemplateMessage[] = rawMessages.map((m, i) => {
    if (!isRecord(m) || typeof m.role !== 'string') {
      throw validationError(
        `1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages', ${i}, 'role'), 'msg': 'Field required'}`,
      );
    }
    const role = m.role === 'developer' ? 'system' : m.role;
    if (role !== 'system' && role !== 'user' && role !== 'assistant' && role !== 'tool') {
      throw validationError(
        `1 validation error:\n  {'type': 'union_tag_invalid', 'loc': ('body', 'messages', ${i}), 'msg': "Input tag '${m.role}' found using 'role' does not match any of the expected tags"}`,
      );
    }
    const out: ChatTemplateMessage = { role, content: chatContent(m.content, i) };
    if (typeof m.reasoning_content === 'string') out.reasoning_content = m.reasoning_content;
    if (Array.isArray(m.tool_calls)) out.tool_calls = m.tool_calls;
    if (typeof m.name === 'string') out.name = m.name;
    if (typeof m.tool_call_id === 'string') out.tool_call_id = m.tool_call_id;
    return out;
  });
  if (messages.length === 0) throw new SimValueError('messages must not be empty.');

  const kwargs = isRecord(body.chat_template_kwargs) ? body.chat_template_kwargs : undefined;
  const tools = Array.isArray(body.tools) ? body.tools : undefined;
  const ids = ctx.render(messages, tools, kwargs);

  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? null;
  const sampling = parseSamplingParams({
    temperature: body.temperature,
    top_p: body.top_p,
    top_k: body.top_k,
    min_p: body.min_p,
    frequency_penalty: body.frequency_penalty,
    presence_penalty: body.presence_penalty,
    repetition_penalty: body.repetition_penalty,
    min_new_tokens: body.min_tokens,
    max_new_tokens: maxTokens,
    stop: body.stop,
    stop_token_ids: body.stop_token_ids,
    ignore_eos: body.ignore_eos,
    skip_special_tokens: body.skip_special_tokens,
    no_stop_trim: body.no_stop_trim,
  });
  validateLength(ids.length, sampling.maxNewTokens, ctx.contextLength, ctx.version);

  const rid = typeof body.rid === 'string' && body.rid !== '' ? body.rid : newRid();
  const streamOptions = isRecord(body.stream_options) ? body.stream_options : {};
  return {
    item: {
      rid,
      inputIds: ids,
      sampling,
      maxNewTokens: sampling.maxNewTokens ?? Math.max(0, ctx.contextLength - ids.length),
    },
    model: typeof body.model === 'string' && body.model !== '' ? body.model : ctx.servedModelName,
    stream: body.stream === true,
    includeUsage: streamOptions.include_usage === true,
  };
}

export { HttpReplyError };
