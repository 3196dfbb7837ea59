/** What the tokenize step knows about the target's tokenizer and template, computed once per tokenizer. */
import type { ChatTokenizer, HfRow } from '../../shared/index.js';
import { deriveAssistantTurnFormat, type AssistantTurnFormat } from './tokenize-template.js';

/**
 * One training row: the Hugging Face dataset's row ({@link HfRow}); `finish_reason` is `"stop"`
 * or `"length"` for generations, {@link CONVERSATION_FINISH_REASON} for conversations.
 */
export type TokenizedRow = HfRow;

/** `finish_reason` of rows made from conversation datasets, which were not generated here. */
export const CONVERSATION_FINISH_REASON = 'conversation';

/** Everything the tokenize step needs about the target's tokenizer, computed once. */
export interface TokenizeContext {
  tokenizer: ChatTokenizer;
  format: AssistantTurnFormat;
  /** Keep generations cut by `max_new_tokens` (`finish_reason` `length`), without a suffix. */
  keepTruncated: boolean;
  /** Template variables for rendering conversations (e.g. `{ enable_thinking: false }`). */
  templateKwargs?: Record<string, unknown> | undefined;
}

const formats = new WeakMap<ChatTokenizer, AssistantTurnFormat>();

function defaultFormat(tokenizer: ChatTokenizer): AssistantTurnFormat {
  let format = formats.get(tokenizer);
  if (format === undefined) {
    format = deriveAssistantTurnFormat(tokenizer);
    formats.set(tokenizer, format);
  }
  return format;
}

/**
 * The ids the chat template writes after the end-of-turn token that closes an assistant turn
 * (Qwen3: the id of `"\n"`; DeepSeek-V3: none), read off a rendered conversation, computed once
 * per tokenizer.
 */
export function assistantTurnSuffix(tokenizer: ChatTokenizer): readonly number[] {
  return defaultFormat(tokenizer).suffixIds;
}

/** Builds the {@link TokenizeContext} of `tokenizer`. Throws an `EnvironmentError` for an unsupported template. */
export function createTokenizeContext(
  tokenizer: ChatTokenizer,
  opts: { keepTruncated?: boolean; templateKwargs?: Record<string, unknown> | undefined } = {},
): TokenizeContext {
  const format =
    opts.templateKwargs === undefined
      ? defaultFormat(tokenizer)
      : deriveAssistantTurnFormat(tokenizer, { templateKwargs: opts.templateKwargs });
  return { tokenizer, format, keepTruncated: opts.keepTruncated ?? false, templateKwargs: opts.templateKwargs };
}
