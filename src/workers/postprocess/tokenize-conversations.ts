/** Conversation datasets to training rows: render once, encode once, mask by the supervised spans (see tokenize.ts). */
import { stat } from 'node:fs/promises';

import {
  EnvironmentError,
  PayloadError,
  contentSampleId,
  parseChatMessage,
  errorMessage,
  logger as componentLogger,
  type ChatMessage,
  type Logger,
} from '../../shared/index.js';
import { CONVERSATION_FINISH_REASON, type TokenizeContext, type TokenizedRow } from './tokenize-context.js';
import { isRecord, jsonLines, noteInvalid, type InvalidLine } from './tokenize-lines.js';
import { findSupervisedSpans, maskFromSpans, type CharSpan } from './tokenize-mask.js';


/** One conversation of a conversation dataset, normalized. */
export interface ConversationRecord {
  id: string;
  messages: ChatMessage[];
  /** Tool schemas for the template (`tools` of the record). */
  tools?: unknown[];
}

/**
 * Parses one line of a conversation dataset: SpecForge's `{"id", "conversations": [{"role",
 * "content", ["reasoning_content"], ["tool_calls"]}], ["tools"]}`, also with `messages` for
 * `conversations` and ShareGPT's `{"from", "value"}` messages (human, gpt). A null content
 * (an assistant turn with only tool calls) becomes "", tool calls given as a JSON string are
 * parsed, other keys are ignored. Without an `id`, the id is the content hash of
 * `contentSampleId`. Throws a {@link PayloadError} naming the problem.
 */
export function parseConversationRecord(value: unknown): ConversationRecord {
  if (!isRecord(value)) throw new PayloadError('expected a JSON object');
  const field = value.conversations !== undefined ? 'conversations' : 'messages';
  const list = value[field];
  if (!Array.isArray(list) || list.length === 0) throw new PayloadError('"conversations" must be a non-empty array of messages');
  const messages = list.map((m, i) => parseChatMessage(m, `${field}[${i}]`));
  let id: string;
  if (typeof value.id === 'string' && value.id !== '') id = value.id;
  else if (typeof value.id === 'number' && Number.isFinite(value.id)) id = String(value.id);
  else if (value.id === undefined || value.id === null) id = contentSampleId(messages);
  else throw new PayloadError(`"id" must be a non-empty string or a number, got ${JSON.stringify(value.id)}`);
  const record: ConversationRecord = { id, messages };
  if (Array.isArray(value.tools) && value.tools.length > 0) record.tools = value.tools;
  else if (value.tools !== undefined && value.tools !== null && !Array.isArray(value.tools)) {
    throw new PayloadError('"tools" must be an array');
  }
  return record;
}

/** A conversation's rendering, ids, supervised character spans and mask. */
export interface TokenizedConversation {
  text: string;
  input_ids: number[];
  loss_mask: number[];
  spans: CharSpan[];
}

/**
 * Renders `conv` once, encodes it once and masks it by the rule of the module comment. Throws a
 * `PayloadError` when the template rejects the conversation.
 */
export function tokenizeConversation(conv: ConversationRecord, ctx: TokenizeContext): TokenizedConversation {
  const { tokenizer, format } = ctx;
  const text = tokenizer.applyChatTemplate(conv.messages, {
    addGenerationPrompt: false,
    tools: conv.tools,
    templateKwargs: ctx.templateKwargs,
  });
  const ids = tokenizer.encode(text);
  const spans = findSupervisedSpans(text, format);
  return { text, input_ids: ids, loss_mask: maskFromSpans(tokenizer, text, ids, spans), spans };
}

/** The training row of one conversation ({@link tokenizeConversation}), in dataset `dataset`. */
export function conversationToRow(conv: ConversationRecord, ctx: TokenizeContext, dataset: string): TokenizedRow {
  const t = tokenizeConversation(conv, ctx);
  return {
    id: conv.id,
    dataset,
    input_ids: t.input_ids,
    loss_mask: t.loss_mask,
    num_tokens: t.input_ids.length,
    finish_reason: CONVERSATION_FINISH_REASON,
  };
}

/** Counters of {@link rowsFromConversations}; final once the generator is exhausted. */
export interface ConversationTokenizeStats {
  lines: number;
  kept: number;
  duplicates: number;
  invalid: number;
  invalidExamples: InvalidLine[];
  /** Conversations with no supervised token (no assistant turn): not yielded. */
  droppedUnsupervised: number;
  /**
   * Kept conversations whose number of supervised spans differs from their number of
   * assistant messages (a template that writes no header for some turns, or header / turn-end
   * text inside a message); worth a look when not 0.
   */
  spanCountMismatch: number;
  tokens: number;
  supervisedTokens: number;
}

export function emptyConversationStats(): ConversationTokenizeStats {
  return {
    lines: 0,
    kept: 0,
    duplicates: 0,
    invalid: 0,
    invalidExamples: [],
    droppedUnsupervised: 0,
    spanCountMismatch: 0,
    tokens: 0,
    supervisedTokens: 0,
  };
}

export interface RowsFromConversationsOptions {
  ctx: TokenizeContext;
  dataset: string;
  stats?: ConversationTokenizeStats;
  logger?: Logger;
}

/**
 * Streams the rows of a conversation dataset (JSONL), line by line. Same id rule, dedupe and
 * handling of invalid lines as {@link rowsFromGenerations}.
 */
export async function* rowsFromConversations(
  file: string,
  opts: RowsFromConversationsOptions,
): AsyncGenerator<TokenizedRow, ConversationTokenizeStats, undefined> {
  const stats = opts.stats ?? emptyConversationStats();
  const log = opts.logger ?? componentLogger('tokenize', { dataset: opts.dataset, file });
  const seen = new Set<string>();
  try {
    await stat(file);
  } catch (e: unknown) {
    throw new EnvironmentError(`conversation file ${file} cannot be read: ${errorMessage(e)}`, { cause: e });
  }
  for await (const { line, text } of jsonLines(file)) {
    stats.lines += 1;
    let tokenized: TokenizedConversation;
    let conv: ConversationRecord;
    try {
      conv = parseConversationRecord(JSON.parse(text));
      if (seen.has(conv.id)) {
        stats.duplicates += 1;
        continue;
      }
      seen.add(conv.id);
      tokenized = tokenizeConversation(conv, opts.ctx);
    } catch (e: unknown) {
      noteInvalid(stats, log, { file, line, reason: e instanceof SyntaxError ? `invalid JSON: ${e.message}` : errorMessage(e) });
      continue;
    }
    let supervised = 0;
    for (const m of tokenized.loss_mask) supervised += m;
    if (supervised === 0) {
      stats.droppedUnsupervised += 1;
      continue;
    }
    const assistants = conv.messages.filter((m) => m.role === 'assistant').length;
    if (tokenized.spans.length !== assistants) stats.spanCountMismatch += 1;
    stats.kept += 1;
    stats.tokens += tokenized.input_ids.length;
    stats.supervisedTokens += supervised;
    yield {
      id: conv.id,
      dataset: opts.dataset,
      input_ids: tokenized.input_ids,
      loss_mask: tokenized.loss_mask,
      num_tokens: tokenized.input_ids.length,
      finish_reason: CONVERSATION_FINISH_REASON,
    };
  }
  return stats;
}

