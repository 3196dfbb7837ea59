/**
 * Conversation datasets to training rows: render once, encode once, mask by the supervised spans
 * (see docs/design.md, Training rows).
 */
import { stat } from 'node:fs/promises';

import {
  EnvironmentError,
  PayloadError,
  contentSampleId,
  parseChatMessages,
  recordTools,
  errorMessage,
  isRecord,
  logger as componentLogger,
  type ChatMessage,
  type Logger,
} from '../../shared/index.js';
import { CONVERSATION_FINISH_REASON, type TokenizeContext, type TokenizedRow } from './tokenize-context.js';
import { jsonLines, noteInvalid, type InvalidLine } from './tokenize-lines.js';
import { findSupervisedSpans, specForgeMask, type CharSpan } from './tokenize-mask.js';

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
 * `conversations` and ShareGPT's `{"from", "value"}` messages (human, gpt, function_call,
 * observation). A null content (an assistant turn with only tool calls) becomes "", tool calls
 * given as a JSON string are parsed, other keys are ignored. The tool schemas are read as the
 * prompt file reader reads them (`tools` or `functions`, a list or a JSON string of one).
 * Without an `id`, the id is the content hash of `contentSampleId` of the messages alone (the
 * ids rows of such a dataset always had). Throws a {@link PayloadError} naming the problem.
 */
export function parseConversationRecord(value: unknown): ConversationRecord {
  if (!isRecord(value)) throw new PayloadError('expected a JSON object');
  const field = value.conversations !== undefined ? 'conversations' : 'messages';
  const list = value[field];
  if (!Array.isArray(list) || list.length === 0)
    throw new PayloadError('"conversations" must be a non-empty array of messages');
  const messages = parseChatMessages(list, field);
  let id: string;
  if (typeof value.id === 'string' && value.id !== '') id = value.id;
  else if (typeof value.id === 'number' && Number.isFinite(value.id)) id = String(value.id);
  else if (value.id === undefined || value.id === null) id = contentSampleId(messages);
  else throw new PayloadError(`"id" must be a non-empty string or a number, got ${JSON.stringify(value.id)}`);
  const record: ConversationRecord = { id, messages };
  const tools = recordTools(value);
  if (!tools.ok) throw new PayloadError(tools.reason);
  if (tools.tools !== undefined) record.tools = tools.tools;
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
 * Renders `conv` once, encodes it once and masks it by SpecForge's rule (tokenize-mask.ts):
 * the spans the template's assistant-turn format finds in the rendered text, by prefix-encoding
 * lengths, with the template's ignorable text (Qwen3's empty think block) unsupervised wherever
 * it appears. Throws a `PayloadError` when the template rejects the conversation.
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
  return {
    text,
    input_ids: ids,
    loss_mask: specForgeMask(tokenizer, text, ids, spans, format.ignorablePrefixes),
    spans,
  };
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
 * What one line of a conversation dataset gives, before the in-order accounting of
 * {@link ConversationTally}: computed on its own for each line, so that lines can be tokenized
 * anywhere (this thread or a tokenize thread, tokenize-pool.ts) with the same result.
 */
export type ConversationLineOutcome =
  /** Not a conversation record (bad JSON, bad shape): invalid, and no id to dedupe on. */
  | { kind: 'unparsed'; reason: string }
  /** A record whose id `isKnownId` reported as seen: not tokenized, a duplicate. */
  | { kind: 'repeated'; id: string }
  /** A record whose tokenization failed (the template rejected it): invalid unless a duplicate. */
  | { kind: 'failed'; id: string; reason: string }
  | {
      kind: 'tokenized';
      id: string;
      input_ids: number[];
      loss_mask: number[];
      /** Tokens with mask 1. */
      supervised: number;
      /** Supervised spans ≠ assistant messages (see {@link ConversationTokenizeStats.spanCountMismatch}). */
      spanCountMismatch: boolean;
    };

function invalidReason(e: unknown): string {
  return e instanceof SyntaxError ? `invalid JSON: ${e.message}` : errorMessage(e);
}

/**
 * Parses and tokenizes one line (`text`, not blank) of a conversation dataset; a record whose
 * id `isKnownId` says was seen before is not tokenized. Never throws.
 */
export function conversationLineOutcome(
  text: string,
  ctx: TokenizeContext,
  isKnownId?: (id: string) => boolean,
): ConversationLineOutcome {
  let conv: ConversationRecord;
  try {
    conv = parseConversationRecord(JSON.parse(text));
  } catch (e: unknown) {
    return { kind: 'unparsed', reason: invalidReason(e) };
  }
  if (isKnownId?.(conv.id) === true) return { kind: 'repeated', id: conv.id };
  let tokenized: TokenizedConversation;
  try {
    tokenized = tokenizeConversation(conv, ctx);
  } catch (e: unknown) {
    return { kind: 'failed', id: conv.id, reason: invalidReason(e) };
  }
  let supervised = 0;
  for (const m of tokenized.loss_mask) supervised += m;
  let assistants = 0;
  for (const m of conv.messages) if (m.role === 'assistant') assistants += 1;
  return {
    kind: 'tokenized',
    id: conv.id,
    input_ids: tokenized.input_ids,
    loss_mask: tokenized.loss_mask,
    supervised,
    spanCountMismatch: tokenized.spans.length !== assistants,
  };
}

/**
 * The in-order accounting of a conversation dataset's lines: counters, dedupe by id (the first
 * line of an id wins, even when its tokenization fails), invalid lines, conversations without
 * supervision. Feed it every non-blank line's outcome in file order.
 */
export class ConversationTally {
  readonly #seen = new Set<string>();
  /** Whether a line with this id was counted already (its next lines are duplicates). */
  readonly has = (id: string): boolean => this.#seen.has(id);

  constructor(
    readonly stats: ConversationTokenizeStats,
    private readonly file: string,
    private readonly dataset: string,
    private readonly log: Logger,
  ) {}

  /** Counts line `line`'s outcome; returns its row when the row is kept. */
  add(line: number, outcome: ConversationLineOutcome): TokenizedRow | undefined {
    const stats = this.stats;
    stats.lines += 1;
    if (outcome.kind === 'unparsed') {
      noteInvalid(stats, this.log, { file: this.file, line, reason: outcome.reason });
      return undefined;
    }
    if (outcome.kind === 'repeated' || this.#seen.has(outcome.id)) {
      stats.duplicates += 1;
      return undefined;
    }
    this.#seen.add(outcome.id);
    if (outcome.kind === 'failed') {
      noteInvalid(stats, this.log, { file: this.file, line, reason: outcome.reason });
      return undefined;
    }
    if (outcome.supervised === 0) {
      stats.droppedUnsupervised += 1;
      return undefined;
    }
    if (outcome.spanCountMismatch) stats.spanCountMismatch += 1;
    stats.kept += 1;
    stats.tokens += outcome.input_ids.length;
    stats.supervisedTokens += outcome.supervised;
    return {
      id: outcome.id,
      dataset: this.dataset,
      input_ids: outcome.input_ids,
      loss_mask: outcome.loss_mask,
      num_tokens: outcome.input_ids.length,
      finish_reason: CONVERSATION_FINISH_REASON,
    };
  }
}

/** Throws an `EnvironmentError` when the conversation file cannot be read. */
export async function assertConversationFile(file: string): Promise<void> {
  try {
    await stat(file);
  } catch (e: unknown) {
    throw new EnvironmentError(`conversation file ${file} cannot be read: ${errorMessage(e)}`, { cause: e });
  }
}

/**
 * Streams the rows of a conversation dataset (JSONL), line by line, on this thread. Same id
 * rule, dedupe and handling of invalid lines as {@link rowsFromGenerations}. Large files:
 * `rowsFromConversationsPooled` (tokenize-pool.ts) gives the same rows on every core.
 */
export async function* rowsFromConversations(
  file: string,
  opts: RowsFromConversationsOptions,
): AsyncGenerator<TokenizedRow, ConversationTokenizeStats, undefined> {
  const stats = opts.stats ?? emptyConversationStats();
  const log = opts.logger ?? componentLogger('tokenize', { dataset: opts.dataset, file });
  await assertConversationFile(file);
  const tally = new ConversationTally(stats, file, opts.dataset, log);
  for await (const { line, text } of jsonLines(file)) {
    const row = tally.add(line, conversationLineOutcome(text, opts.ctx, tally.has));
    if (row !== undefined) yield row;
  }
  return stats;
}
