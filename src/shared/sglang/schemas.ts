/**
 * Request and response shapes of SGLang's HTTP API (docs/design.md, SGLang's HTTP API as tokenmill
 * uses it), parsed with zod.
 *
 * Strict about what tokenmill needs (output ids, token counts, finish reason), tolerant of
 * everything else: objects keep unknown keys, and keys that only some versions send (0.4.x had
 * no `weight_version`, 0.5.x added `num_retractions`, `cached_tokens_details`, …) are optional.
 * The `parse*` functions never throw: they return the value, or one line that names the
 * offending field (`meta_info.completion_tokens: expected number, got undefined`).
 */
import { z } from 'zod';
import { isRecord } from '../util/index.js';

// ---------------------------------------------------------------------------------------------
// Sampling parameters (request side)

/**
 * SGLang's `sampling_params` besides `max_new_tokens`, which a request gives as `maxNewTokens`.
 * Unknown keys are passed through untouched, so new SGLang parameters work without a change here.
 */
export const SglangSamplingOptionsSchema = z.looseObject({
  temperature: z.number().nonnegative().optional(),
  top_p: z.number().optional(),
  top_k: z.number().int().optional(),
  min_p: z.number().optional(),
  stop: z.union([z.string(), z.array(z.string())]).optional(),
  stop_token_ids: z.array(z.number().int()).optional(),
  ignore_eos: z.boolean().optional(),
  skip_special_tokens: z.boolean().optional(),
  no_stop_trim: z.boolean().optional(),
  min_new_tokens: z.number().int().nonnegative().optional(),
  repetition_penalty: z.number().optional(),
  frequency_penalty: z.number().optional(),
  presence_penalty: z.number().optional(),
  n: z.number().int().positive().optional(),
});
/** Sampling parameters besides the token limit; see {@link SglangSamplingOptionsSchema}. */
export type SglangSamplingOptions = z.infer<typeof SglangSamplingOptionsSchema>;

/**
 * SGLang's `sampling_params` for `/generate` as sent: the options and `max_new_tokens`.
 * `/v1/chat/completions` gets the same values, with `max_new_tokens` sent as `max_tokens`.
 */
export const SglangSamplingParamsSchema = SglangSamplingOptionsSchema.extend({
  max_new_tokens: z.number().int().nonnegative(),
});
/** SGLang sampling parameters; see {@link SglangSamplingParamsSchema}. */
export type SglangSamplingParams = z.infer<typeof SglangSamplingParamsSchema>;

// ---------------------------------------------------------------------------------------------
// Finish reason

/**
 * `meta_info.finish_reason` exactly as SGLang sends it (extra keys kept, e.g. an abort's
 * `status_code` / `err_type`). `matched` is the stop token id (a list in some versions), the
 * stop string, or null.
 */
export const FinishReasonSchema = z.discriminatedUnion('type', [
  z.looseObject({ type: z.literal('length'), length: z.number().int().nonnegative() }),
  z.looseObject({
    type: z.literal('stop'),
    matched: z.union([z.number().int(), z.string(), z.array(z.number().int()), z.null()]),
  }),
  z.looseObject({ type: z.literal('abort'), message: z.unknown().optional() }),
]);
/** Why a generation ended; see {@link FinishReasonSchema}. */
export type FinishReason = z.infer<typeof FinishReasonSchema>;

// ---------------------------------------------------------------------------------------------
// POST /generate

/** `meta_info` of a `/generate` response: the keys tokenmill relies on, others kept. */
export const GenerateMetaInfoSchema = z.looseObject({
  id: z.string().optional(),
  // Null only in intermediate stream chunks; a final non-stream response always has one.
  finish_reason: FinishReasonSchema,
  prompt_tokens: z.number().int().nonnegative(),
  completion_tokens: z.number().int().nonnegative(),
  cached_tokens: z.number().int().nonnegative().optional(),
  e2e_latency: z.number().nonnegative().optional(),
  weight_version: z.unknown().optional(),
});

/** A single, non-streamed `/generate` response body. */
export const GenerateResponseSchema = z.looseObject({
  // SGLang always sends `text`; token-exact data does not need it, so its absence is tolerated.
  text: z.string().optional(),
  output_ids: z.array(z.number().int().nonnegative()),
  meta_info: GenerateMetaInfoSchema,
});
/** A `/generate` response body as sent; see {@link GenerateResponseSchema}. */
export type GenerateResponse = z.infer<typeof GenerateResponseSchema>;

/** The useful part of one `/generate` call. */
export interface GenerateResult {
  /**
   * The completion's token ids: the last `completionTokens` ids of `output_ids` (SGLang
   * 0.5.2rc1 sent extra leading ids from the prompt's tail). A stop token (EOS or a
   * `stop_token_ids` match) is included as the last id, as SGLang counts it.
   */
  outputIds: number[];
  promptTokens: number;
  completionTokens: number;
  finishReason: FinishReason;
  /** Prompt tokens served from SGLang's prefix cache, when reported. */
  cachedTokens?: number;
  /** SGLang's own end-to-end latency in seconds, when reported. */
  e2eLatencySec?: number;
  /** Detokenized completion (a stop string is trimmed unless `no_stop_trim`). */
  text: string;
  /** How many leading ids of `output_ids` were not part of the completion (0 normally). */
  droppedLeadingIds: number;
  /** `meta_info` exactly as received. */
  metaInfo: Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------------
// POST /v1/chat/completions

/** One chat message sent to `/v1/chat/completions` (OpenAI shape; extra keys passed through). */
export interface ChatMessageInput {
  role: string;
  content?: unknown;
  [key: string]: unknown;
}

const MatchedStopSchema = z.union([z.number().int(), z.string(), z.array(z.number().int()), z.null()]);

/** A non-streamed `/v1/chat/completions` response body. */
export const ChatCompletionResponseSchema = z.looseObject({
  id: z.string().optional(),
  object: z.string().optional(),
  model: z.string().optional(),
  choices: z
    .array(
      z.looseObject({
        index: z.number().int().optional(),
        message: z.looseObject({
          role: z.string().optional(),
          content: z.string().nullish(),
          reasoning_content: z.string().nullish(),
          tool_calls: z.array(z.unknown()).nullish(),
        }),
        finish_reason: z.string(),
        matched_stop: MatchedStopSchema.optional(),
      }),
    )
    .min(1),
  usage: z.looseObject({
    prompt_tokens: z.number().int().nonnegative(),
    completion_tokens: z.number().int().nonnegative(),
    total_tokens: z.number().int().nonnegative().optional(),
  }),
});
/** A chat completion body as sent; see {@link ChatCompletionResponseSchema}. */
export type ChatCompletionResponse = z.infer<typeof ChatCompletionResponseSchema>;

/** OpenAI-style finish reason of a chat completion. */
export type ChatFinishReason = 'stop' | 'length' | 'abort' | 'tool_calls' | (string & {});

/** The useful part of one `/v1/chat/completions` call (its first choice). */
export interface ChatResult {
  content: string;
  /** Separated reasoning (`--reasoning-parser`), or null. */
  reasoningContent: string | null;
  toolCalls: unknown[];
  finishReason: ChatFinishReason;
  /** The stop token id or string that ended the completion, when SGLang reports it. */
  matchedStop: number | string | number[] | null;
  promptTokens: number;
  completionTokens: number;
  /** The response body as received. */
  raw: Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------------
// Info endpoints

/** `GET /model_info` (old `/get_model_info`); fields beyond `model_path` vary by version. */
export const ModelInfoSchema = z.looseObject({
  model_path: z.string(),
  tokenizer_path: z.string().nullish(),
  is_generation: z.boolean().optional(),
  preferred_sampling_params: z.unknown().optional(),
  weight_version: z.unknown().optional(),
});
/** SGLang's model info, keys as SGLang names them. */
export type ModelInfo = z.infer<typeof ModelInfoSchema>;

/**
 * `GET /server_info` (old `/get_server_info`): the server arguments flattened at the top level
 * plus runtime state. Everything is optional because it changes with every release.
 */
export const ServerInfoSchema = z.looseObject({
  version: z.string().optional(),
  model_path: z.string().optional(),
  // The launch argument: null (0.5.23) when the server was started without --context-length.
  context_length: z.number().int().nullish(),
  // The longest input the scheduler takes (the model's context less a few reserved tokens); always set.
  max_req_input_len: z.number().int().nullish(),
  max_total_num_tokens: z.number().int().nullish(),
  max_running_requests: z.number().int().nullish(),
  internal_states: z.array(z.looseObject({})).optional(),
});
/** SGLang's server info, keys as SGLang names them. */
export type ServerInfo = z.infer<typeof ServerInfoSchema>;

/** Load of one data-parallel rank, from `GET /get_load` (newer `/v1/loads`). */
export const LoadInfoSchema = z.looseObject({
  dp_rank: z.number().int().optional(),
  num_reqs: z.number().optional(),
  num_running_reqs: z.number().optional(),
  num_waiting_reqs: z.number().optional(),
  num_tokens: z.number().optional(),
});
/** Load of one data-parallel rank, keys as SGLang names them. */
export type LoadInfo = z.infer<typeof LoadInfoSchema>;

// ---------------------------------------------------------------------------------------------
// Parsing

/** Outcome of a `parse*` function: the value, or a one-line description naming the field. */
export type ParseOutcome<T> = { ok: true; value: T } | { ok: false; problem: string };

/** Formats a dotted path with indices, e.g. `choices[0].message.content`. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const key of path) {
    if (typeof key === 'number') out += `[${key}]`;
    else out += out === '' ? String(key) : `.${String(key)}`;
  }
  return out === '' ? '(root)' : out;
}

function describeValue(value: unknown): string {
  if (value === undefined) return 'undefined';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'string') return value.length > 40 ? `string "${value.slice(0, 40)}…"` : `string "${value}"`;
  if (typeof value === 'number' || typeof value === 'boolean') return `${typeof value} ${String(value)}`;
  return typeof value;
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let cur: unknown = root;
  for (const key of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[key];
  }
  return cur;
}

/**
 * Describes zod issues as `path: expected X, got Y` lines (at most `maxIssues`), reading the
 * offending values from `input` so that a missing key reads `got undefined`.
 */
export function describeIssues(error: z.ZodError, input: unknown, maxIssues = 3): string {
  const lines = error.issues.slice(0, maxIssues).map((issue) => {
    const path = formatPath(issue.path);
    const got = describeValue(valueAt(input, issue.path));
    if (issue.code === 'invalid_type') return `${path}: expected ${issue.expected}, got ${got}`;
    if (issue.code === 'invalid_union') {
      const branches = issue.errors;
      const expected = branches.every((b) => b.length === 1 && b[0]?.code === 'invalid_type' && b[0].path.length === 0)
        ? branches.map((b) => (b[0] as { expected: string }).expected).join(' | ')
        : undefined;
      if (expected !== undefined) return `${path}: expected ${expected}, got ${got}`;
      return `${path}: ${issue.message}, got ${got}`;
    }
    return `${path}: ${issue.message} (got ${got})`;
  });
  const more = error.issues.length > maxIssues ? ` (+${error.issues.length - maxIssues} more)` : '';
  return lines.join('; ') + more;
}

function parseWith<S extends z.ZodType>(schema: S, body: unknown): ParseOutcome<z.infer<S>> {
  const r = schema.safeParse(body);
  return r.success ? { ok: true, value: r.data } : { ok: false, problem: describeIssues(r.error, body) };
}

/**
 * Parses a `/generate` body into a {@link GenerateResult}. The completion is the last
 * `completion_tokens` ids of `output_ids`; fewer ids than `completion_tokens` is an error.
 */
export function parseGenerateResponse(body: unknown): ParseOutcome<GenerateResult> {
  const fast = plainGenerateResponse(body);
  const parsed = fast === undefined ? parseWith(GenerateResponseSchema, body) : { ok: true as const, value: fast };
  if (!parsed.ok) return parsed;
  const { output_ids: allIds, meta_info: meta, text } = parsed.value;
  const completionTokens = meta.completion_tokens;
  if (allIds.length < completionTokens) {
    return {
      ok: false,
      problem: `output_ids: has ${allIds.length} ids, fewer than meta_info.completion_tokens (${completionTokens})`,
    };
  }
  const dropped = allIds.length - completionTokens;
  const result: GenerateResult = {
    // slice(start) rather than slice(-n): slice(-0) would return every id.
    outputIds: allIds.slice(dropped),
    promptTokens: meta.prompt_tokens,
    completionTokens,
    finishReason: meta.finish_reason,
    text: text ?? '',
    droppedLeadingIds: dropped,
    metaInfo: meta,
  };
  if (meta.cached_tokens !== undefined) result.cachedTokens = meta.cached_tokens;
  if (meta.e2e_latency !== undefined) result.e2eLatencySec = meta.e2e_latency;
  return { ok: true, value: result };
}

const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

function isFinishReason(v: unknown): v is FinishReason {
  if (!isRecord(v)) return false;
  if (v.type === 'length') return isCount(v.length);
  if (v.type === 'stop') {
    const m = v.matched;
    return (
      m === null ||
      typeof m === 'string' ||
      Number.isSafeInteger(m) ||
      (Array.isArray(m) && m.every((x) => Number.isSafeInteger(x)))
    );
  }
  return v.type === 'abort';
}

/**
 * The body as a {@link GenerateResponse} when it plainly is one, checked by hand (a response
 * per request: zod's walk of every output id costs more than the rest of its handling); else
 * undefined, and zod parses it and names what is wrong. Accepts nothing that
 * {@link GenerateResponseSchema} refuses.
 */
export function plainGenerateResponse(body: unknown): GenerateResponse | undefined {
  if (!isRecord(body)) return undefined;
  const ids = body.output_ids;
  const meta = body.meta_info;
  if (!Array.isArray(ids) || !isRecord(meta) || (body.text !== undefined && typeof body.text !== 'string'))
    return undefined;
  for (let i = 0; i < ids.length; i += 1) if (!isCount(ids[i])) return undefined;
  if (!isCount(meta.prompt_tokens) || !isCount(meta.completion_tokens) || !isFinishReason(meta.finish_reason))
    return undefined;
  if (meta.id !== undefined && typeof meta.id !== 'string') return undefined;
  if (meta.cached_tokens !== undefined && !isCount(meta.cached_tokens)) return undefined;
  if (meta.e2e_latency !== undefined && !(Number.isFinite(meta.e2e_latency) && (meta.e2e_latency as number) >= 0))
    return undefined;
  return body as GenerateResponse;
}

/** Parses a `/v1/chat/completions` body into a {@link ChatResult} (first choice). */
export function parseChatResponse(body: unknown): ParseOutcome<ChatResult> {
  const parsed = parseWith(ChatCompletionResponseSchema, body);
  if (!parsed.ok) return parsed;
  const choice = parsed.value.choices[0];
  if (choice === undefined) return { ok: false, problem: 'choices: expected at least one choice' };
  return {
    ok: true,
    value: {
      content: choice.message.content ?? '',
      reasoningContent: choice.message.reasoning_content ?? null,
      toolCalls: choice.message.tool_calls ?? [],
      finishReason: choice.finish_reason,
      matchedStop: choice.matched_stop ?? null,
      promptTokens: parsed.value.usage.prompt_tokens,
      completionTokens: parsed.value.usage.completion_tokens,
      raw: parsed.value,
    },
  };
}

/** Parses a `/model_info` body. */
export function parseModelInfo(body: unknown): ParseOutcome<ModelInfo> {
  return parseWith(ModelInfoSchema, body);
}

/** Parses a `/server_info` body. */
export function parseServerInfo(body: unknown): ParseOutcome<ServerInfo> {
  return parseWith(ServerInfoSchema, body);
}

/**
 * Parses a load body into one entry per data-parallel rank: `/get_load` sends a list,
 * `/v1/loads` an object with a `loads` list, and some versions a single object.
 */
export function parseLoad(body: unknown): ParseOutcome<LoadInfo[]> {
  if (Array.isArray(body)) return parseWith(z.array(LoadInfoSchema), body);
  if (body !== null && typeof body === 'object' && Array.isArray((body as { loads?: unknown }).loads)) {
    const inner = parseWith(z.array(LoadInfoSchema), (body as { loads: unknown[] }).loads);
    if (inner.ok) return inner;
    return { ok: false, problem: inner.problem.startsWith('[') ? `loads${inner.problem}` : `loads: ${inner.problem}` };
  }
  const single = parseWith(LoadInfoSchema, body);
  return single.ok ? { ok: true, value: [single.value] } : single;
}
