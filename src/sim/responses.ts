/** Response bodies of the simulated SGLang, per version profile. */
import type { FinishReason } from './output-model.js';
import type { SimVersion } from './types.js';

export const WEIGHT_VERSION = 'default';

/** One request's output as the response builders need it. */
export interface ItemOutput {
  rid: string;
  promptIds: readonly number[];
  /** Completion ids so far (all of them when finished). */
  completionIds: readonly number[];
  /** null while a stream is still running. */
  finishReason: FinishReason | null;
  cachedTokens: number;
  text: string;
  /** Seconds since the request arrived (only reported once finished). */
  e2eLatencyS: number;
  /** The `spec_*` fields of a finished request decoded speculatively with ≥ 1 verify step. */
  spec?: Record<string, unknown> | undefined;
}

/**
 * `output_ids` as the version sends them: 0.5.2rc1 put the last 5 prompt ids in front of the
 * completion (133 ids for 128 completion tokens).
 */
export function outputIdsFor(version: SimVersion, out: ItemOutput): number[] {
  if (version === '0.5.2rc1') return [...out.promptIds.slice(-5), ...out.completionIds];
  return [...out.completionIds];
}

function metaInfo(version: SimVersion, out: ItemOutput, finished: boolean): Record<string, unknown> {
  const meta: Record<string, unknown> = {
    id: out.rid,
    finish_reason: out.finishReason,
    prompt_tokens: out.promptIds.length,
  };
  if (version !== '0.4.10') meta.weight_version = WEIGHT_VERSION;
  if (version === '0.5.4') {
    meta.num_retractions = 0;
    meta.reasoning_tokens = 0;
  }
  meta.completion_tokens = out.completionIds.length;
  meta.cached_tokens = out.cachedTokens;
  if (finished) {
    meta.e2e_latency = out.e2eLatencyS;
    if (out.spec !== undefined) Object.assign(meta, out.spec);
    if (version === '0.5.4') meta.response_sent_to_client_ts = Date.now() / 1000;
  }
  return meta;
}

/** Fake but well-formed logprobs: `[logprob, token_id, null]` per completion token. */
function outputLogprobs(ids: readonly number[]): Array<[number, number, null]> {
  return ids.map((id, i) => [-(((id * 2654435761 + i) >>> 0) % 1000) / 400, id, null]);
}

/** A /generate result (also one event of a stream, with `index` for batches). */
export function generateBody(
  version: SimVersion,
  out: ItemOutput,
  opts: { finished: boolean; returnLogprob?: boolean; index?: number },
): Record<string, unknown> {
  const meta = metaInfo(version, out, opts.finished);
  if (opts.returnLogprob === true) {
    meta.input_token_logprobs = out.promptIds.map((id, i) => [i === 0 ? null : -1.0, id, null]);
    meta.output_token_logprobs = outputLogprobs(out.completionIds);
  }
  const body: Record<string, unknown> = { text: out.text, output_ids: outputIdsFor(version, out), meta_info: meta };
  if (opts.index !== undefined) body.index = opts.index;
  return body;
}

/** A request aborted while it waited in the queue (`TokenizerManager._handle_abort_req`). */
export function abortBeforePrefillBody(version: SimVersion, rid: string, index?: number): Record<string, unknown> {
  const meta: Record<string, unknown> = {
    id: rid,
    finish_reason: { type: 'abort', message: 'Abort before prefill' },
    prompt_tokens: 0,
    completion_tokens: 0,
  };
  if (version !== '0.4.10') {
    meta.cached_tokens = 0;
    meta.weight_version = WEIGHT_VERSION;
  }
  const body: Record<string, unknown> = { text: '', output_ids: [], meta_info: meta };
  if (index !== undefined) body.index = index;
  return body;
}

/** The finish reason of a request aborted while running (`FINISH_ABORT()`). */
export function runningAbortReason(version: SimVersion): FinishReason {
  return {
    type: 'abort',
    message: version === '0.4.10' ? 'Unknown error' : 'Aborted',
    status_code: null,
    err_type: null,
  };
}

function chatFinish(reason: FinishReason | null): {
  finish_reason: string | null;
  matched_stop: number | string | null;
} {
  if (reason === null) return { finish_reason: null, matched_stop: null };
  if (reason.type === 'stop') return { finish_reason: 'stop', matched_stop: reason.matched };
  return { finish_reason: reason.type, matched_stop: null };
}

function usage(version: SimVersion, out: ItemOutput): Record<string, unknown> {
  const u: Record<string, unknown> = {
    prompt_tokens: out.promptIds.length,
    total_tokens: out.promptIds.length + out.completionIds.length,
    completion_tokens: out.completionIds.length,
    prompt_tokens_details: null,
  };
  if (version !== '0.4.10') u.reasoning_tokens = 0;
  return u;
}

/** A /v1/chat/completions result. */
export function chatBody(
  version: SimVersion,
  out: ItemOutput,
  model: string,
  createdS: number,
): Record<string, unknown> {
  const body: Record<string, unknown> = {
    id: out.rid,
    object: 'chat.completion',
    created: createdS,
    model,
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: out.text, reasoning_content: null, tool_calls: null },
        logprobs: null,
        ...chatFinish(out.finishReason),
      },
    ],
    usage: usage(version, out),
  };
  if (version !== '0.4.10') body.metadata = { weight_version: WEIGHT_VERSION };
  return body;
}

/** One `chat.completion.chunk` event. */
export function chatChunk(
  out: Pick<ItemOutput, 'rid'>,
  model: string,
  createdS: number,
  delta: Record<string, unknown>,
  finishReason: FinishReason | null,
): Record<string, unknown> {
  return {
    id: out.rid,
    object: 'chat.completion.chunk',
    created: createdS,
    model,
    choices: [{ index: 0, delta, logprobs: null, ...chatFinish(finishReason) }],
    usage: null,
  };
}

/** The last chunk of a stream with `stream_options.include_usage`. */
export function chatUsageChunk(
  version: SimVersion,
  out: ItemOutput,
  model: string,
  createdS: number,
): Record<string, unknown> {
  return {
    id: out.rid,
    object: 'chat.completion.chunk',
    created: createdS,
    model,
    choices: [],
    usage: usage(version, out),
  };
}
