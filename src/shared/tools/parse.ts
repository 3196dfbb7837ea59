/**
 * Reading a generated turn's tool calls in its model family's format, and the arguments of a
 * call as an object whichever shape the family keeps them in.
 */
import { PayloadError } from '../errors.js';
import { parseJsonObject } from './json-scan.js';
import { parseDeepSeekV3 } from './parse-deepseekv3.js';
import { parseHermes } from './parse-hermes.js';
import { parseKimiK2 } from './parse-kimi-k2.js';
import { parseLlama3 } from './parse-llama3.js';
import type { ParsedTurn, ToolCall, ToolCallFormat } from './types.js';

/** Options of {@link parseToolCalls}. */
export interface ParseToolCallsOptions {
  /** The turn's number (1-based), for the ids of formats that write none (`call_<turn>_<i>`). */
  turn: number;
}

/**
 * The calls of a generated turn, `text` decoded with its special tokens (the end-of-turn token
 * removed; trailing specials such as `<|eom_id|>` are tolerated): the content before the first
 * call and the calls in order, or why an opened call does not parse (which call, 1-based, and
 * why, on one line of at most 200 characters). Without a call, `content` is `text` unchanged.
 *
 * `function.arguments` has the shape the family's chat template needs to render the call again
 * as the model wrote it: the JSON text for `hermes`, `deepseekv3` and `kimi_k2` (their templates
 * print a string as it is), an object for `llama3` (its template writes `arguments | tojson`).
 */
export function parseToolCalls(format: ToolCallFormat, text: string, opts: ParseToolCallsOptions): ParsedTurn {
  switch (format) {
    case 'hermes':
      return parseHermes(text, opts.turn);
    case 'llama3':
      return parseLlama3(text, opts.turn);
    case 'deepseekv3':
      return parseDeepSeekV3(text, opts.turn);
    case 'kimi_k2':
      return parseKimiK2(text);
  }
}

/**
 * A call's arguments as an object, whether the call keeps them as one or as JSON text. Throws a
 * {@link PayloadError} when the text is not a JSON object (never for a call {@link parseToolCalls} gave).
 */
export function callArgumentsObject(call: ToolCall): Record<string, unknown> {
  const args = call.function.arguments;
  if (typeof args !== 'string') return args;
  const parsed = parseJsonObject(args);
  if ('error' in parsed) {
    throw new PayloadError(`the arguments of tool call ${call.id} (${call.function.name}) are ${parsed.error}`);
  }
  return parsed.value;
}
