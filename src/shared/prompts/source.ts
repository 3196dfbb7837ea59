import { createHash } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { PayloadError, errorMessage } from '../errors.js';
import { BloomFilter, fastPromptId } from './id-filter.js';
import { readRawLineChunks, readRawLines } from './line-reader.js';
import type { ChatMessage } from '../tokenizer/index.js';
import { isRecord } from '../util/index.js';
import { conversationTurns } from './conversation.js';
import { functionCallToolCalls, recordTools, toolCallIds } from './tool-schemas.js';

/**
 * Reads a prompt dataset (JSONL) line by line, in one of three shapes:
 *
 * - `{"id", "messages": [{role, content}, …]}` — the chat to answer;
 * - `{"id", "conversations": [{role, content} | {from, value}, …]}` (SpecForge / ShareGPT) —
 *   the conversation up to its last user turn; the assistant turns after it are dropped;
 * - `{"id", "prompt": "…"}` — one user turn.
 *
 * Any of them may carry the tool schemas the chat template renders: `tools` or `functions`, as a
 * list or a JSON string of one (tool-schemas.ts); ShareGPT's `function_call` and `observation`
 * turns are read as an assistant turn with `tool_calls` and a `tool` turn.
 *
 * Sample ids (docs/design.md, invariant 1): the record's `id` (a string, or a number as its decimal
 * text) when present; otherwise `h:` + the first 16 hex digits of the SHA-256 of the
 * normalized messages as compact JSON (`[{"role","content"},…]`) — with the tool schemas too when
 * the record has some — so the same content always gets the same id, whatever line it is on.
 *
 * Malformed lines, and lines whose bytes are not UTF-8, are yielded as rejects with the file,
 * the 1-based line and the reason; the caller writes them to the rejects file and goes on. A
 * UTF-8 byte order mark before the first line is skipped (see `line-reader.ts`).
 */
export interface PromptRecord {
  id: string;
  line: number;
  messages: ChatMessage[];
  /** The record's tool schemas (OpenAI shape), passed to the chat template in every rendering. */
  tools?: unknown[];
}

export interface RejectedLine {
  file: string;
  line: number;
  reason: string;
  id?: string;
}

export type PromptLine = { ok: true; record: PromptRecord } | { ok: false; reject: RejectedLine };

/**
 * The sample id of a record without an `id`: a hash of its normalized messages and, when it has
 * some, its tool schemas (a record without tools keeps the id it always had).
 */
export function contentSampleId(messages: readonly ChatMessage[], tools?: readonly unknown[]): string {
  const normalized = messages.map((m) => ({ role: m.role, content: m.content }));
  const canonical = JSON.stringify(tools === undefined ? normalized : { messages: normalized, tools });
  return `h:${createHash('sha256').update(canonical).digest('hex').slice(0, 16)}`;
}

const ROLE_ALIASES: Readonly<Record<string, ChatMessage['role']>> = {
  system: 'system',
  user: 'user',
  human: 'user',
  assistant: 'assistant',
  gpt: 'assistant',
  model: 'assistant',
  tool: 'tool',
  function_call: 'assistant',
  observation: 'tool',
};

/**
 * Parses one chat message in the OpenAI / Hugging Face shape or ShareGPT's `{from, value}`
 * (human, gpt; `function_call`: an assistant turn whose value is its call as JSON, read into
 * `tool_calls` with ids from `index`, the message's place in its list; `observation`: a tool
 * turn). A null content (an assistant turn with only tool calls) becomes "", tool calls given as
 * a JSON string are parsed. Throws a {@link PayloadError} naming `where`.
 */
export function parseChatMessage(raw: unknown, where: string, index = 0): ChatMessage {
  if (!isRecord(raw)) throw new PayloadError(`${where} is not an object`);
  const roleRaw = raw.role ?? raw.from;
  const role = typeof roleRaw === 'string' ? ROLE_ALIASES[roleRaw] : undefined;
  if (role === undefined) {
    throw new PayloadError(
      `${where}.role is ${JSON.stringify(roleRaw)}: expected system, user, assistant or tool (or ShareGPT's human, gpt, function_call, observation)`,
    );
  }
  const contentRaw = raw.content !== undefined ? raw.content : raw.value;
  if (contentRaw !== undefined && contentRaw !== null && typeof contentRaw !== 'string') {
    throw new PayloadError(`${where}.content must be a string or null`);
  }
  if (roleRaw === 'function_call' && raw.tool_calls === undefined) {
    const calls = functionCallToolCalls(contentRaw ?? '', index, where);
    return { role, content: '', tool_calls: calls };
  }
  const message: ChatMessage = { role, content: contentRaw ?? '' };
  const reasoning = raw.reasoning_content;
  if (typeof reasoning === 'string') message.reasoning_content = reasoning;
  else if (reasoning !== undefined && reasoning !== null)
    throw new PayloadError(`${where}.reasoning_content must be a string`);
  let toolCalls = raw.tool_calls;
  if (typeof toolCalls === 'string') {
    try {
      toolCalls = JSON.parse(toolCalls) as unknown;
    } catch (e: unknown) {
      throw new PayloadError(`${where}.tool_calls is a string that is not JSON: ${errorMessage(e)}`, { cause: e });
    }
  }
  if (Array.isArray(toolCalls)) {
    if (toolCalls.length > 0) message.tool_calls = toolCalls;
  } else if (toolCalls !== undefined && toolCalls !== null) {
    throw new PayloadError(`${where}.tool_calls must be an array`);
  }
  if (typeof raw.name === 'string') message.name = raw.name;
  if (typeof raw.tool_call_id === 'string') message.tool_call_id = raw.tool_call_id;
  return message;
}

/**
 * Parses a list of chat messages ({@link parseChatMessage} each, named `<field>[i]`); an
 * `observation` turn without a `tool_call_id` gets the id of the call it answers, in order, of
 * the `function_call` turn before it. Throws a {@link PayloadError} naming the message.
 */
export function parseChatMessages(raw: readonly unknown[], field: string): ChatMessage[] {
  const out: ChatMessage[] = [];
  // The ids of the last function_call turn's calls not yet answered by an observation turn.
  let unanswered: string[] = [];
  for (const [i, m] of raw.entries()) {
    const message = parseChatMessage(m, `${field}[${i}]`, i);
    const from = isRecord(m) ? (m.role ?? m.from) : undefined;
    if (from === 'function_call') unanswered = toolCallIds(message.tool_calls);
    else if (from === 'observation' && message.tool_call_id === undefined) {
      const id = unanswered.shift();
      if (id !== undefined) message.tool_call_id = id;
    } else if (message.role !== 'tool') unanswered = [];
    out.push(message);
  }
  return out;
}

function normalizeMessages(raw: unknown, field: string): ChatMessage[] | string {
  if (!Array.isArray(raw)) return `"${field}" must be an array of messages`;
  try {
    return parseChatMessages(raw, field);
  } catch (e: unknown) {
    return errorMessage(e);
  }
}

/** How a prompt file is read: `turns` of the dataset (`last`: the chat to answer; `all`: whole conversations). */
export interface PromptParseOptions {
  turns?: 'last' | 'all';
}

/** Parses one JSONL line into a prompt record, or says why it cannot be one. */
export function parsePromptLine(
  text: string,
  file: string,
  line: number,
  options: PromptParseOptions = {},
): PromptLine {
  const reject = (reason: string, id?: string): PromptLine => ({
    ok: false,
    reject: id === undefined ? { file, line, reason } : { file, line, reason, id },
  });
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e: unknown) {
    return reject(`invalid JSON: ${errorMessage(e)}`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return reject('expected a JSON object');
  const rec = value as Record<string, unknown>;

  let id: string | undefined;
  if (typeof rec.id === 'string' && rec.id.trim() !== '') id = rec.id;
  else if (typeof rec.id === 'number' && Number.isFinite(rec.id)) id = String(rec.id);
  else if (rec.id !== undefined && rec.id !== null)
    return reject(`"id" must be a non-empty string or a number, got ${JSON.stringify(rec.id)}`);

  const toolsRead = recordTools(rec);
  if (!toolsRead.ok) return reject(toolsRead.reason, id);
  const tools = toolsRead.tools;
  if (options.turns === 'all') return parseConversation(rec, id, reject, line, tools);
  let messages: ChatMessage[];
  if (rec.messages !== undefined) {
    const m = normalizeMessages(rec.messages, 'messages');
    if (typeof m === 'string') return reject(m, id);
    messages = m;
  } else if (rec.conversations !== undefined) {
    const m = normalizeMessages(rec.conversations, 'conversations');
    if (typeof m === 'string') return reject(m, id);
    const lastUser = m.map((x) => x.role).lastIndexOf('user');
    if (lastUser < 0) return reject('conversations has no user turn to answer', id);
    messages = m.slice(0, lastUser + 1);
  } else if (rec.prompt !== undefined) {
    if (typeof rec.prompt !== 'string') return reject('"prompt" must be a string', id);
    messages = [{ role: 'user', content: rec.prompt }];
  } else {
    return reject('expected one of "messages", "conversations" or "prompt"', id);
  }

  if (messages.length === 0) return reject('no messages', id);
  const last = messages[messages.length - 1];
  if (last?.role !== 'user') return reject(`the last message must be a user turn, got ${last?.role ?? 'none'}`, id);
  if (last.content.trim() === '') return reject('the user turn to answer is empty', id);

  return { ok: true, record: promptRecord(id, line, messages, tools) };
}

function promptRecord(
  id: string | undefined,
  line: number,
  messages: ChatMessage[],
  tools: unknown[] | undefined,
): PromptRecord {
  const record: PromptRecord = { id: id ?? contentSampleId(messages, tools), line, messages };
  if (tools !== undefined) record.tools = tools;
  return record;
}

/**
 * A record of a dataset regenerated turn by turn: the whole conversation (`messages`,
 * `conversations` or `prompt`), checked by {@link conversationTurns}.
 */
function parseConversation(
  rec: Record<string, unknown>,
  id: string | undefined,
  reject: (reason: string, id?: string) => PromptLine,
  line: number,
  tools: unknown[] | undefined,
): PromptLine {
  const field = rec.messages !== undefined ? 'messages' : 'conversations';
  let messages: ChatMessage[];
  if (rec.messages !== undefined || rec.conversations !== undefined) {
    const m = normalizeMessages(rec[field], field);
    if (typeof m === 'string') return reject(m, id);
    messages = m;
  } else if (rec.prompt !== undefined) {
    if (typeof rec.prompt !== 'string') return reject('"prompt" must be a string', id);
    messages = [{ role: 'user', content: rec.prompt }];
  } else {
    return reject('expected one of "messages", "conversations" or "prompt"', id);
  }
  const turns = conversationTurns(messages, field);
  if (typeof turns === 'string') return reject(turns, id);
  return { ok: true, record: promptRecord(id, line, messages, tools) };
}

/** What identifies one version of a file: a changed file gets a new index. */
interface FileFingerprint {
  size: number;
  mtimeMs: number;
  ino: number;
}

async function fingerprintOf(file: string): Promise<FileFingerprint> {
  const st = await stat(file);
  return { size: st.size, mtimeMs: st.mtimeMs, ino: st.ino };
}

/**
 * The ids that may occur more than once in a prompt file ("suspects"), found without holding
 * every id in memory (docs/design.md, invariant 5, applied to the producer's heap):
 *
 * 1. One read of the file puts every line's id (read by {@link fastPromptId} when the line
 *    starts with it, else from the parsed line) into a {@link BloomFilter} of about 12 bits
 *    per line (off the heap, dropped after the read). An id whose bits were all set already
 *    is a suspect. A filter has no false negatives, so every id that occurs twice is a
 *    suspect; a few unique ids are suspects too (false positives, ~0.1 %).
 * 2. A pass over the file then tracks the first line of the suspects only, exactly
 *    ({@link DuplicateTracker}): a repeated id is rejected naming its first line, and a
 *    false positive is just a unique id that was tracked — never a dropped prompt.
 *
 * Memory: the filter while building (~1.5 bytes a line, at most 128 MiB), then one map
 * entry per suspect (ids that really repeat, plus the false positives).
 */
export class PromptFileIndex {
  private constructor(
    readonly file: string,
    private readonly fingerprint: FileFingerprint,
    /** Ids that may occur more than once. */
    readonly suspects: ReadonlySet<string>,
    /** Non-blank lines read. */
    readonly lines: number,
    /** How the file's lines are parsed. */
    readonly parse: PromptParseOptions = {},
  ) {}

  /** Reads `file` once and returns its index. */
  static async build(file: string, parse: PromptParseOptions = {}): Promise<PromptFileIndex> {
    const fingerprint = await fingerprintOf(file);
    const filter = BloomFilter.forFileBytes(fingerprint.size);
    const suspects = new Set<string>();
    let lines = 0;
    for await (const chunk of readRawLineChunks(file)) {
      for (const { line, text } of chunk) {
        lines += 1;
        if (text === undefined) continue; // not UTF-8: a reject, with no id
        let id = fastPromptId(text);
        if (id === undefined) {
          const parsed = parsePromptLine(text, file, line, parse);
          if (!parsed.ok) continue;
          id = parsed.record.id;
        }
        if (filter.testAndAdd(id)) suspects.add(id);
      }
    }
    return new PromptFileIndex(file, fingerprint, suspects, lines, parse);
  }

  /** Whether the file still is the version this index was built from (size, mtime, inode). */
  async isCurrent(): Promise<boolean> {
    try {
      const now = await fingerprintOf(this.file);
      return (
        now.size === this.fingerprint.size &&
        now.mtimeMs === this.fingerprint.mtimeMs &&
        now.ino === this.fingerprint.ino
      );
    } catch {
      return false;
    }
  }

  /** A tracker for one pass over the file, from its first line. */
  tracker(): DuplicateTracker {
    return new DuplicateTracker(this.suspects);
  }
}

/** Finds repeated ids during one pass from line 1, exactly, remembering suspects only. */
export class DuplicateTracker {
  private readonly firstLines = new Map<string, number>();

  constructor(private readonly suspects: ReadonlySet<string>) {}

  /** True when `id` certainly occurs only once in the file: no tracking needed. */
  isUnique(id: string): boolean {
    return !this.suspects.has(id);
  }

  /**
   * Records a valid line's id; returns the line of its first occurrence when this one is a
   * repeat, else undefined.
   */
  firstLineOf(id: string, line: number): number | undefined {
    if (!this.suspects.has(id)) return undefined;
    const first = this.firstLines.get(id);
    if (first !== undefined) return first;
    this.firstLines.set(id, line);
    return undefined;
  }
}

/** The reject for a repeated id. */
export function duplicateReject(file: string, line: number, id: string, firstLine: number): RejectedLine {
  return { file, line, reason: `duplicate id "${id}" (first on line ${firstLine})`, id };
}

/**
 * One line of a pass over a prompt file, with as little work as its id allows:
 * - `unique`: the line starts with an id that occurs nowhere else in the file; it is not
 *   parsed yet (a caller that finds the id already committed never needs to parse it);
 * - `parsed`: a valid record, the first with its id;
 * - `rejected`: an invalid line, or a repeated id (naming its first line).
 */
export type ScannedLine =
  | { kind: 'unique'; line: number; id: string; text: string }
  | { kind: 'parsed'; record: PromptRecord }
  | { kind: 'rejected'; reject: RejectedLine };

/**
 * A pass over a prompt file from line 1, in chunks, deduplicated against `index` with memory
 * for the suspects only. Call {@link parseScannedLine} on a `unique` line to validate it.
 */
export async function* scanPromptFile(file: string, index: PromptFileIndex): AsyncGenerator<ScannedLine[]> {
  const tracker = index.tracker();
  for await (const chunk of readRawLineChunks(file)) {
    const out: ScannedLine[] = [];
    for (const { line, text, unreadable } of chunk) {
      if (unreadable !== undefined) {
        out.push({ kind: 'rejected', reject: { file, line, reason: unreadable } });
        continue;
      }
      const fast = fastPromptId(text);
      if (fast !== undefined && tracker.isUnique(fast)) {
        out.push({ kind: 'unique', line, id: fast, text });
        continue;
      }
      const parsed = parsePromptLine(text, file, line, index.parse);
      if (!parsed.ok) {
        out.push({ kind: 'rejected', reject: parsed.reject });
        continue;
      }
      const first = tracker.firstLineOf(parsed.record.id, line);
      out.push(
        first === undefined
          ? { kind: 'parsed', record: parsed.record }
          : { kind: 'rejected', reject: duplicateReject(file, line, parsed.record.id, first) },
      );
    }
    yield out;
  }
}

/** The record of a scanned line, or why it is rejected. */
export function parseScannedLine(file: string, scanned: ScannedLine, parse: PromptParseOptions = {}): PromptLine {
  switch (scanned.kind) {
    case 'unique':
      return parsePromptLine(scanned.text, file, scanned.line, parse);
    case 'parsed':
      return { ok: true, record: scanned.record };
    case 'rejected':
      return { ok: false, reject: scanned.reject };
  }
}

/**
 * Streams a JSONL prompt file. Blank lines are ignored; a repeated sample id is a reject
 * naming the line of its first occurrence. Without an `index`, one is built first (a second
 * read of the file); memory stays bounded either way (see {@link PromptFileIndex}).
 */
export async function* readPromptFile(
  file: string,
  index?: PromptFileIndex,
  parse: PromptParseOptions = index?.parse ?? {},
): AsyncGenerator<PromptLine> {
  const tracker = (index ?? (await PromptFileIndex.build(file, parse))).tracker();
  for await (const { line, text, unreadable } of readRawLines(file)) {
    if (unreadable !== undefined) {
      yield { ok: false, reject: { file, line, reason: unreadable } };
      continue;
    }
    const parsed = parsePromptLine(text, file, line, parse);
    if (parsed.ok) {
      const first = tracker.firstLineOf(parsed.record.id, line);
      if (first !== undefined) {
        yield { ok: false, reject: duplicateReject(file, line, parsed.record.id, first) };
        continue;
      }
    }
    yield parsed;
  }
}
