/**
 * The tokenize step of post-processing: turns a dataset's generation records, or an existing
 * conversation dataset, into training rows `{id, dataset, input_ids, loss_mask, num_tokens,
 * finish_reason}` for EAGLE-3 / DFlash drafter trainers (reference/training-data.md).
 *
 * ## Generation records (token-exact)
 * A record holds the prompt's ids as sent to SGLang (the conversation rendered with
 * `add_generation_prompt=True` and encoded once) and SGLang's `output_ids`. The row is
 * `prompt_ids + output_ids + suffix`, mask 0 on the prompt and 1 on the output and the suffix,
 * where `suffix` is what the chat template writes after the end-of-turn token of an assistant
 * turn ({@link assistantTurnSuffix}; `\n` for Qwen-style templates, nothing for DeepSeek-V3).
 * Nothing is re-tokenized: the row holds exactly the ids the target model read and wrote.
 * Only this generation is supervised: assistant turns inside the prompt are context (0).
 * By finish reason ({@link recordToRow}):
 * - `stop` and the output ends with the template's end-of-turn token (`<|im_end|>`): kept, with
 *   the suffix — the same ids and mask as rendering the finished conversation gives;
 * - `stop` on anything else — a stop string, a `stop_token_ids` entry, or another end token
 *   such as Qwen's `<|endoftext|>`: kept exactly as generated, with no suffix (the template
 *   writes its suffix only after its own end-of-turn token, and appending one would put ids in
 *   the data that the model did not produce); counted in `stopWithoutEndOfTurn`;
 * - `length` (truncated, no end-of-turn token): dropped, unless `keepTruncated`, then kept with
 *   no suffix and `finish_reason` `"length"`;
 * - `abort`: always dropped.
 *
 * Qwen3 note: rendering a finished conversation whose last assistant message has no reasoning
 * inserts an empty `<think>\n\n</think>\n\n` block after the assistant header. tokenmill
 * records what the model generated after the generation prompt it was given: with thinking on,
 * the model writes its own `<think>…</think>` block and the row equals the rendering (the
 * template would only drop newlines the model put around its reasoning or before its answer); with
 * `enable_thinking: false`, the empty block is part of the generation prompt (mask 0), and the
 * row again equals the rendering, with the block unsupervised as in conversation rows. A
 * thinking-mode output that skipped the block is kept as generated, and then differs from the
 * re-rendered conversation by exactly that block.
 *
 * ## Conversations ({@link conversationToRow})
 * The whole conversation is rendered once with the chat template (`add_generation_prompt`
 * false) and encoded once (`add_special_tokens` false, literal special-token text becomes the
 * special token, as in transformers). The loss mask is 1 exactly on the tokens that cover at
 * least one character of a supervised span, where the supervised spans are found in the
 * rendered text from the template's own {@link AssistantTurnFormat} (derived by rendering probe
 * conversations, see tokenize-template.ts):
 * - each occurrence of the assistant header (`<|im_start|>assistant\n`) opens a span just after
 *   it; the span runs through the first turn end after that (`<|im_end|>\n`: the end-of-turn
 *   token and what the template writes after it), inclusive, or to the end of the text;
 * - an ignorable prefix that the template inserts right after the header of a turn without
 *   reasoning (Qwen3's empty `<think>\n\n</think>\n\n`) is not supervised;
 * - everything else — system, user and tool turns, assistant headers, the BOS — is 0.
 * So for Qwen the supervised tokens of a turn are its reasoning block when present, the
 * content, tool calls, `<|im_end|>` and `\n`. A token that straddles a span boundary (Qwen's
 * pre-tokenizer can merge the header's `\n` with a leading newline of the content) is 1.
 * The rule works on the rendered text, as SpecForge's `GeneralParser` does, so: assistant
 * content holding the literal turn end (`<|im_end|>\n`) ends its span there; text in any turn
 * holding the literal header opens a span; and templates that write no header before an
 * assistant turn (DeepSeek-V3 after tool outputs) leave that turn unsupervised. The parity test
 * (test/integration/tokenize-python.test.ts) checks ids and mask against an independent
 * Python implementation on transformers' offsets.
 */
import { createReadStream } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { createInterface } from 'node:readline';

import {
  EnvironmentError,
  FinishReasonSchema,
  PayloadError,
  contentSampleId,
  parseChatMessage,
  errorMessage,
  logger as componentLogger,
  type ChatMessage,
  type ChatTokenizer,
  type FinishReason,
  type HfRow,
  type Logger,
} from '../../shared/index.js';
import { findSupervisedSpans, maskFromSpans, type CharSpan } from './tokenize-mask.js';
import { deriveAssistantTurnFormat, type AssistantTurnFormat } from './tokenize-template.js';

export { deriveAssistantTurnFormat, type AssistantTurnFormat, type TurnFormatOptions } from './tokenize-template.js';
export { findSupervisedSpans, maskFromSpans, type CharSpan } from './tokenize-mask.js';

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
  templateKwargs?: Record<string, unknown>;
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
  opts: { keepTruncated?: boolean; templateKwargs?: Record<string, unknown> } = {},
): TokenizeContext {
  const format =
    opts.templateKwargs === undefined
      ? defaultFormat(tokenizer)
      : deriveAssistantTurnFormat(tokenizer, { templateKwargs: opts.templateKwargs });
  return { tokenizer, format, keepTruncated: opts.keepTruncated ?? false, templateKwargs: opts.templateKwargs };
}

// ---------------------------------------------------------------------------------------------
// Generation records

/** One line of `<run>/<dataset>/generations/*.jsonl` (the keys this step reads; others ignored). */
export interface GenerationRecord {
  id: string;
  dataset?: string;
  prompt_ids: number[];
  output_ids: number[];
  prompt_tokens?: number;
  completion_tokens?: number;
  finish_reason: FinishReason;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function tokenIds(value: unknown, field: string, vocabSize: number): number[] {
  if (!Array.isArray(value)) throw new PayloadError(`${field} must be an array of token ids`);
  for (let i = 0; i < value.length; i++) {
    const id: unknown = value[i];
    if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw new PayloadError(`${field}[${i}] is ${JSON.stringify(id)}: expected a token id in [0, ${vocabSize})`);
    }
  }
  return value as number[];
}

/**
 * Checks a parsed generations line. Throws a {@link PayloadError} naming the problem: a missing
 * id, ids that are not token ids of the tokenizer (`vocabSize`), counts that disagree with the
 * id lists, an unknown finish reason.
 */
export function parseGenerationRecord(value: unknown, vocabSize: number): GenerationRecord {
  if (!isRecord(value)) throw new PayloadError('expected a JSON object');
  const { id, dataset, prompt_tokens: promptTokens, completion_tokens: completionTokens } = value;
  if (typeof id !== 'string' || id === '') throw new PayloadError(`"id" must be a non-empty string, got ${JSON.stringify(id)}`);
  if (dataset !== undefined && typeof dataset !== 'string') throw new PayloadError('"dataset" must be a string');
  const promptIds = tokenIds(value.prompt_ids, 'prompt_ids', vocabSize);
  const outputIds = tokenIds(value.output_ids, 'output_ids', vocabSize);
  if (promptIds.length === 0) throw new PayloadError('prompt_ids is empty');
  if (promptTokens !== undefined && promptTokens !== promptIds.length) {
    throw new PayloadError(`prompt_tokens is ${JSON.stringify(promptTokens)} but prompt_ids has ${promptIds.length} ids`);
  }
  if (completionTokens !== undefined && completionTokens !== outputIds.length) {
    throw new PayloadError(`completion_tokens is ${JSON.stringify(completionTokens)} but output_ids has ${outputIds.length} ids`);
  }
  const finish = FinishReasonSchema.safeParse(value.finish_reason);
  if (!finish.success) {
    throw new PayloadError(`finish_reason ${JSON.stringify(value.finish_reason)} is not one of SGLang's (stop, length, abort)`);
  }
  const record: GenerationRecord = { id, prompt_ids: promptIds, output_ids: outputIds, finish_reason: finish.data };
  if (dataset !== undefined) record.dataset = dataset;
  return record;
}

/** Why a generation record yields no row. */
export type DropReason = 'truncated' | 'aborted' | 'empty';

/** What {@link recordToRow} made of a record. */
export type RecordOutcome =
  | {
      status: 'kept';
      row: TokenizedRow;
      /** Whether the output ended with the template's end-of-turn token (and got the suffix). */
      closedTurn: boolean;
    }
  | { status: 'dropped'; reason: DropReason };

/**
 * The training row of one generation record (see the module comment for the rule by finish
 * reason). `dataset` defaults to the record's own. Pure; the record is assumed checked by
 * {@link parseGenerationRecord}.
 */
export function recordToRow(record: GenerationRecord, ctx: TokenizeContext, dataset?: string): RecordOutcome {
  const finish = record.finish_reason;
  if (finish.type === 'abort') return { status: 'dropped', reason: 'aborted' };
  if (finish.type === 'length' && !ctx.keepTruncated) return { status: 'dropped', reason: 'truncated' };
  const output = record.output_ids;
  if (output.length === 0) return { status: 'dropped', reason: 'empty' };
  const closedTurn = finish.type === 'stop' && output[output.length - 1] === ctx.format.endOfTurnTokenId;
  const suffix = closedTurn ? ctx.format.suffixIds : [];
  const prompt = record.prompt_ids;
  const total = prompt.length + output.length + suffix.length;
  const inputIds = new Array<number>(total);
  const lossMask = new Array<number>(total);
  let i = 0;
  for (const id of prompt) {
    inputIds[i] = id;
    lossMask[i++] = 0;
  }
  for (const id of output) {
    inputIds[i] = id;
    lossMask[i++] = 1;
  }
  for (const id of suffix) {
    inputIds[i] = id;
    lossMask[i++] = 1;
  }
  const name = dataset ?? record.dataset;
  if (name === undefined) throw new PayloadError(`record ${record.id} names no dataset`);
  return {
    status: 'kept',
    closedTurn,
    row: { id: record.id, dataset: name, input_ids: inputIds, loss_mask: lossMask, num_tokens: total, finish_reason: finish.type },
  };
}

/** A line that could not be used, for the report. */
export interface InvalidLine {
  file: string;
  /** 1-based. */
  line: number;
  reason: string;
}

/** At most this many invalid lines are kept as examples in the counters. */
const INVALID_EXAMPLES = 20;

/** Counters of {@link rowsFromGenerations}; final once the generator is exhausted. */
export interface GenerationTokenizeStats {
  files: number;
  /** Non-blank lines read. */
  lines: number;
  /** Rows yielded. */
  kept: number;
  /** Of `kept`: truncated rows kept because of `keepTruncated`. */
  keptTruncated: number;
  /** Of `kept`: stopped rows whose output does not end with the template's end-of-turn token. */
  stopWithoutEndOfTurn: number;
  droppedTruncated: number;
  droppedAborted: number;
  /** Records with no output ids. */
  droppedEmpty: number;
  /** Records whose id was already seen in this dataset (the first one wins). */
  duplicates: number;
  /** Lines that are not valid records (bad JSON, ids out of the vocabulary, ...). */
  invalid: number;
  /** The first invalid lines, with the reason. */
  invalidExamples: InvalidLine[];
  /** Sum of `num_tokens` of the rows yielded. */
  tokens: number;
  /** Sum of their loss masks. */
  supervisedTokens: number;
}

/** Fresh zeroed counters. */
export function emptyGenerationStats(): GenerationTokenizeStats {
  return {
    files: 0,
    lines: 0,
    kept: 0,
    keptTruncated: 0,
    stopWithoutEndOfTurn: 0,
    droppedTruncated: 0,
    droppedAborted: 0,
    droppedEmpty: 0,
    duplicates: 0,
    invalid: 0,
    invalidExamples: [],
    tokens: 0,
    supervisedTokens: 0,
  };
}

export interface RowsFromGenerationsOptions {
  ctx: TokenizeContext;
  /** The dataset's name, written to each row (default: each record's `dataset`). */
  dataset?: string;
  /** Counters to fill in place (also the generator's return value). */
  stats?: GenerationTokenizeStats;
  logger?: Logger;
}

/** The `*.jsonl` files of a generations folder, by name. Throws an `EnvironmentError` if it is no folder. */
export async function listGenerationFiles(dir: string): Promise<string[]> {
  try {
    if (!(await stat(dir)).isDirectory()) throw new EnvironmentError(`generations folder ${dir} is not a folder`);
  } catch (e: unknown) {
    if (e instanceof EnvironmentError) throw e;
    throw new EnvironmentError(`generations folder ${dir} cannot be read: ${errorMessage(e)}`, { cause: e });
  }
  const names = await readdir(dir);
  return names
    .filter((n) => n.endsWith('.jsonl') && !n.startsWith('.'))
    .sort()
    .map((n) => path.join(dir, n));
}

async function* jsonLines(file: string): AsyncGenerator<{ line: number; text: string }> {
  const rl = createInterface({ input: createReadStream(file, { encoding: 'utf8' }), crlfDelay: Infinity });
  let line = 0;
  try {
    for await (const text of rl) {
      line += 1;
      if (text.trim() !== '') yield { line, text };
    }
  } finally {
    rl.close();
  }
}

/** Counts an invalid line; the first ones are kept as examples and logged, the rest only counted. */
function noteInvalid(stats: { invalid: number; invalidExamples: InvalidLine[] }, log: Logger, entry: InvalidLine): void {
  stats.invalid += 1;
  if (stats.invalidExamples.length >= INVALID_EXAMPLES) return;
  stats.invalidExamples.push(entry);
  log.warn({ file: entry.file, line: entry.line, reason: entry.reason }, 'skipped an invalid line');
}

/**
 * Streams the rows of one dataset's generations folder (`<run>/<dataset>/generations`): its
 * `*.jsonl` files in name order, line by line, so files of any size take constant memory
 * (besides the set of ids seen). A sample id seen before in the folder is skipped (the first
 * wins). Invalid lines are counted and skipped, never fatal. Returns the counters, which are
 * also kept up to date in `opts.stats` when given.
 */
export async function* rowsFromGenerations(
  dir: string,
  opts: RowsFromGenerationsOptions,
): AsyncGenerator<TokenizedRow, GenerationTokenizeStats, undefined> {
  const stats = opts.stats ?? emptyGenerationStats();
  const log = opts.logger ?? componentLogger('tokenize', { dataset: opts.dataset, dir });
  const vocabSize = opts.ctx.tokenizer.vocabSize;
  const seen = new Set<string>();
  for (const file of await listGenerationFiles(dir)) {
    stats.files += 1;
    for await (const { line, text } of jsonLines(file)) {
      stats.lines += 1;
      let record: GenerationRecord;
      try {
        record = parseGenerationRecord(JSON.parse(text), vocabSize);
      } catch (e: unknown) {
        noteInvalid(stats, log, { file, line, reason: e instanceof SyntaxError ? `invalid JSON: ${e.message}` : errorMessage(e) });
        continue;
      }
      if (seen.has(record.id)) {
        stats.duplicates += 1;
        continue;
      }
      seen.add(record.id);
      let outcome: RecordOutcome;
      try {
        outcome = recordToRow(record, opts.ctx, opts.dataset);
      } catch (e: unknown) {
        noteInvalid(stats, log, { file, line, reason: errorMessage(e) });
        continue;
      }
      if (outcome.status === 'dropped') {
        if (outcome.reason === 'truncated') stats.droppedTruncated += 1;
        else if (outcome.reason === 'aborted') stats.droppedAborted += 1;
        else stats.droppedEmpty += 1;
        continue;
      }
      const { row } = outcome;
      stats.kept += 1;
      if (row.finish_reason === 'length') stats.keptTruncated += 1;
      else if (!outcome.closedTurn) stats.stopWithoutEndOfTurn += 1;
      stats.tokens += row.num_tokens;
      stats.supervisedTokens += row.num_tokens - record.prompt_ids.length;
      yield row;
    }
  }
  return stats;
}

// ---------------------------------------------------------------------------------------------
// Conversations

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
