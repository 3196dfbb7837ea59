import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { PayloadError, errorMessage } from './errors.js';
import type { ChatMessage } from './tokenizer.js';

/**
 * Reads a prompt dataset (JSONL) line by line, in one of three shapes:
 *
 * - `{"id", "messages": [{role, content}, …]}` — the chat to answer;
 * - `{"id", "conversations": [{role, content} | {from, value}, …]}` (SpecForge / ShareGPT) —
 *   the conversation up to its last user turn; the assistant turns after it are dropped;
 * - `{"id", "prompt": "…"}` — one user turn.
 *
 * Sample ids (DESIGN invariant 1): the record's `id` (a string, or a number as its decimal
 * text) when present; otherwise `h:` + the first 16 hex digits of the SHA-256 of the
 * normalized messages as compact JSON (`[{"role","content"},…]`), so the same content always
 * gets the same id, whatever line it is on.
 *
 * Malformed lines are yielded as rejects with the file, the 1-based line and the reason; the
 * caller writes them to the rejects file and goes on.
 */
export interface PromptRecord {
  id: string;
  line: number;
  messages: ChatMessage[];
}

export interface RejectedLine {
  file: string;
  line: number;
  reason: string;
  id?: string;
}

export type PromptLine = { ok: true; record: PromptRecord } | { ok: false; reject: RejectedLine };

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The sample id of a record without an `id`: a hash of its normalized messages. */
export function contentSampleId(messages: readonly ChatMessage[]): string {
  const canonical = JSON.stringify(messages.map((m) => ({ role: m.role, content: m.content })));
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
};

/**
 * Parses one chat message in the OpenAI / Hugging Face shape or ShareGPT's `{from, value}`
 * (human, gpt). A null content (an assistant turn with only tool calls) becomes "", tool calls
 * given as a JSON string are parsed. Throws a {@link PayloadError} naming `where`.
 */
export function parseChatMessage(raw: unknown, where: string): ChatMessage {
  if (!isRecord(raw)) throw new PayloadError(`${where} is not an object`);
  const roleRaw = raw.role ?? raw.from;
  const role = typeof roleRaw === 'string' ? ROLE_ALIASES[roleRaw] : undefined;
  if (role === undefined) {
    throw new PayloadError(`${where}.role is ${JSON.stringify(roleRaw)}: expected system, user, assistant or tool (or ShareGPT's human, gpt)`);
  }
  const contentRaw = raw.content !== undefined ? raw.content : raw.value;
  if (contentRaw !== undefined && contentRaw !== null && typeof contentRaw !== 'string') {
    throw new PayloadError(`${where}.content must be a string or null`);
  }
  const message: ChatMessage = { role, content: contentRaw ?? '' };
  const reasoning = raw.reasoning_content;
  if (typeof reasoning === 'string') message.reasoning_content = reasoning;
  else if (reasoning !== undefined && reasoning !== null) throw new PayloadError(`${where}.reasoning_content must be a string`);
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

function normalizeMessages(raw: unknown, field: string): ChatMessage[] | string {
  if (!Array.isArray(raw)) return `"${field}" must be an array of messages`;
  const out: ChatMessage[] = [];
  for (const [i, m] of raw.entries()) {
    try {
      out.push(parseChatMessage(m, `${field}[${i}]`));
    } catch (e: unknown) {
      return errorMessage(e);
    }
  }
  return out;
}

/** Parses one JSONL line into a prompt record, or says why it cannot be one. */
export function parsePromptLine(text: string, file: string, line: number): PromptLine {
  const reject = (reason: string, id?: string): PromptLine => ({
    ok: false,
    reject: id === undefined ? { file, line, reason } : { file, line, reason, id },
  });
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e: unknown) {
    return reject(`invalid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return reject('expected a JSON object');
  const rec = value as Record<string, unknown>;

  let id: string | undefined;
  if (typeof rec.id === 'string' && rec.id.trim() !== '') id = rec.id;
  else if (typeof rec.id === 'number' && Number.isFinite(rec.id)) id = String(rec.id);
  else if (rec.id !== undefined && rec.id !== null) return reject(`"id" must be a non-empty string or a number, got ${JSON.stringify(rec.id)}`);

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

  return { ok: true, record: { id: id ?? contentSampleId(messages), line, messages } };
}

/**
 * Streams a JSONL prompt file. Blank lines are ignored; a repeated sample id is a reject
 * naming the line of its first occurrence.
 */
export async function* readPromptFile(file: string): AsyncGenerator<PromptLine> {
  const seen = new Map<string, number>();
  const rl = createInterface({ input: createReadStream(file, { encoding: 'utf8' }), crlfDelay: Infinity });
  let line = 0;
  for await (const text of rl) {
    line += 1;
    if (text.trim() === '') continue;
    const parsed = parsePromptLine(text, file, line);
    if (parsed.ok) {
      const first = seen.get(parsed.record.id);
      if (first !== undefined) {
        yield { ok: false, reject: { file, line, reason: `duplicate id "${parsed.record.id}" (first on line ${first})`, id: parsed.record.id } };
        continue;
      }
      seen.set(parsed.record.id, line);
    }
    yield parsed;
  }
}
