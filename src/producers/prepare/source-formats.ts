/**
 * The formats of a source and how a row of each becomes chat turns:
 *
 * - `openai`: a list of `{role, content}` turns (`messages`, or `conversations` when the row has
 *   no `messages`); content given as a list of parts has its text parts joined by `\n`;
 * - `sharegpt`: a list of `{from, value}` turns (`conversations`), with ShareGPT's and
 *   LLaMA-Factory's role names (`human`, `gpt`, `observation`, `function_call`, …) mapped;
 * - `alpaca`: `instruction` + `\n\n` + `input` (when not empty) as one user turn, `output`
 *   (or `response`) as the assistant turn;
 * - `prompt`: one text column as one user turn.
 *
 * `fields` renames the columns and keys, `roles` maps more role names. Keys of a turn other
 * than its role and content (`tool_calls`, `name`, …) are kept unless null. A `function_call`
 * turn's value (`{"name", "arguments"}` as JSON) becomes the assistant turn's `tool_calls`, and
 * the `observation` turns after it get their calls' ids. A row's `tools` (or `functions`) column
 * is its tool schemas. A row that does not fit is malformed, with the reason naming the column or
 * turn; nothing here throws for a row.
 */
import {
  errorMessage,
  functionCallToolCalls,
  isRecord,
  recordTools,
  toolCallIds,
  type PromptSource,
} from '../../shared/index.js';
import { excerptOfValue, jsonText } from './source-raw.js';
import type { ChatRole, SourceFormat, SourceMessage } from './source-types.js';

/** Where a row's fields are, once the format is known: {@link resolveLayout} fills it from the config and the first rows. */
export interface SourceLayout {
  format: SourceFormat;
  /** `openai` / `sharegpt`: the column of the turns and the keys of a turn. */
  messages: string;
  role: string;
  content: string;
  /** `prompt`: the text column. */
  prompt: string;
  /** `alpaca`: the instruction and input columns, and the output columns tried in order. */
  instruction: string;
  input: string;
  output: readonly string[];
  /** The system-prompt column; `explicit` when configured (then a row must have it). */
  system: { column: string; explicit: boolean };
  /** The id column; `explicit` when configured (then a row must have a usable one). */
  id: { column: string; explicit: boolean };
  /** Role names of the source → chat roles (the known ones, then `roles` of the config). */
  roles: Readonly<Record<string, ChatRole>>;
}

/** Role names seen in public chat datasets, mapped to chat roles; `roles` of the config adds to them and wins. */
export const KNOWN_ROLES: Readonly<Record<string, ChatRole>> = {
  system: 'system',
  developer: 'system',
  user: 'user',
  human: 'user',
  assistant: 'assistant',
  gpt: 'assistant',
  chatgpt: 'assistant',
  bing: 'assistant',
  bard: 'assistant',
  model: 'assistant',
  function_call: 'assistant',
  tool: 'tool',
  function: 'tool',
  observation: 'tool',
  ipython: 'tool',
};

/** The default columns and keys of each format. */
const TURN_KEYS: Readonly<Record<'openai' | 'sharegpt', { messages: string; role: string; content: string }>> = {
  openai: { messages: 'messages', role: 'role', content: 'content' },
  sharegpt: { messages: 'conversations', role: 'from', content: 'value' },
};

/** Columns of a single prompt text that `auto` recognizes, in the order they are named in messages. */
export const PROMPT_COLUMNS = ['prompt', 'question', 'problem', 'text', 'query'] as const;

/** Output columns of an `alpaca` row, tried in order. */
export const ALPACA_OUTPUT_COLUMNS = ['output', 'response'] as const;

/**
 * The layout of a format given the config's `field`, `fields` and `roles`. Without
 * `fields.messages`, `turnsColumn` (the list column found in the first rows) is used.
 */
export function layoutOf(
  format: SourceFormat,
  source: PromptSource,
  found: { turnsColumn?: string | undefined; prompt?: string | undefined } = {},
): SourceLayout {
  const f = source.fields ?? {};
  const keys = format === 'sharegpt' ? TURN_KEYS.sharegpt : TURN_KEYS.openai;
  return {
    format,
    messages: f.messages ?? found.turnsColumn ?? keys.messages,
    role: f.role ?? keys.role,
    content: f.content ?? keys.content,
    prompt: source.field ?? f.prompt ?? found.prompt ?? 'prompt',
    instruction: f.instruction ?? 'instruction',
    input: f.input ?? 'input',
    output: ALPACA_OUTPUT_COLUMNS,
    system: { column: f.system ?? 'system', explicit: f.system !== undefined },
    id: { column: f.id ?? 'id', explicit: f.id !== undefined },
    roles: { ...KNOWN_ROLES, ...(source.roles ?? {}) },
  };
}

/** The columns of a row's tool schemas, read when present. */
const TOOL_COLUMNS = ['tools', 'functions'] as const;

/** The columns a conversion reads: those it cannot do without, and those it reads when present. */
export interface WantedColumns {
  required: string[];
  optional: string[];
}

/** The columns {@link convertRow} reads with `layout`; a reader may leave the others out. */
export function wantedColumns(layout: SourceLayout): WantedColumns {
  const required: string[] = [];
  const optional: string[] = [];
  (layout.id.explicit ? required : optional).push(layout.id.column);
  (layout.system.explicit ? required : optional).push(layout.system.column);
  optional.push(...TOOL_COLUMNS);
  switch (layout.format) {
    case 'openai':
    case 'sharegpt':
      required.push(layout.messages);
      break;
    case 'alpaca':
      required.push(layout.instruction);
      optional.push(layout.input, ...layout.output);
      break;
    case 'prompt':
      required.push(layout.prompt);
      break;
  }
  return { required, optional };
}

/** A row converted: its id (when it has one) and turns, or why it cannot be. */
export type ConvertedRow =
  | { ok: true; id?: string; messages: SourceMessage[]; tools?: unknown[] }
  | { ok: false; reason: string; excerpt?: string };

/** Thrown inside the conversion of one row; caught by {@link convertRow} and turned into a malformed row. */
class RowProblemError extends Error {}

/** `a string`, `a list`, `null`…: the type of a value, for reasons. */
export function typeName(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'bigint') return 'a number';
  return `a ${typeof value}`;
}

/** Column names of a row, for reasons: `id, conversations`. */
function columnList(row: Record<string, unknown>): string {
  const keys = Object.keys(row);
  return keys.length === 0 ? 'none' : keys.join(', ');
}

/** Turns one row into chat turns following `layout`; a row that does not fit comes back malformed, with why. */
export function convertRow(value: unknown, layout: SourceLayout): ConvertedRow {
  if (!isRecord(value))
    return {
      ok: false,
      reason: `the row is ${typeName(value)}, not an object of columns`,
      excerpt: excerptOfValue(value),
    };
  try {
    const id = rowId(value, layout);
    const turns = rowTurns(value, layout);
    const messages = withSystem(value, layout, turns);
    if (messages.length === 0)
      throw new RowProblemError(
        `${layout.format === 'openai' || layout.format === 'sharegpt' ? `"${layout.messages}"` : 'the row'} has no turns`,
      );
    const tools = recordTools(value);
    if (!tools.ok) throw new RowProblemError(tools.reason);
    return {
      ok: true,
      ...(id === undefined ? {} : { id }),
      messages,
      ...(tools.tools === undefined ? {} : { tools: tools.tools }),
    };
  } catch (e: unknown) {
    if (e instanceof RowProblemError) return { ok: false, reason: e.message, excerpt: excerptOfValue(value) };
    throw e;
  }
}

function rowId(row: Record<string, unknown>, layout: SourceLayout): string | undefined {
  const { column, explicit } = layout.id;
  const v = row[column];
  if (typeof v === 'string' && v !== '') return v;
  if ((typeof v === 'number' && Number.isFinite(v)) || typeof v === 'bigint') return String(v);
  if (!explicit) return undefined;
  if (!(column in row))
    throw new RowProblemError(`no id column "${column}" (fields.id); the row has: ${columnList(row)}`);
  throw new RowProblemError(
    `id column "${column}" is ${v === '' ? 'an empty string' : typeName(v)}: expected a string or a number`,
  );
}

function rowTurns(row: Record<string, unknown>, layout: SourceLayout): SourceMessage[] {
  switch (layout.format) {
    case 'openai':
    case 'sharegpt':
      return listTurns(row, layout);
    case 'alpaca':
      return alpacaTurns(row, layout);
    case 'prompt':
      return [{ role: 'user', content: textColumn(row, layout.prompt, 'the prompt column') }];
  }
}

/** A required string column. */
function textColumn(row: Record<string, unknown>, column: string, what: string): string {
  if (!(column in row)) throw new RowProblemError(`no column "${column}" (${what}); the row has: ${columnList(row)}`);
  const v = row[column];
  if (typeof v !== 'string') throw new RowProblemError(`column "${column}" is ${typeName(v)}: expected a string`);
  if (v.trim() === '') throw new RowProblemError(`column "${column}" is empty`);
  return v;
}

function alpacaTurns(row: Record<string, unknown>, layout: SourceLayout): SourceMessage[] {
  const instruction = textColumn(row, layout.instruction, 'the instruction');
  const input = row[layout.input];
  if (input !== undefined && input !== null && typeof input !== 'string') {
    throw new RowProblemError(`column "${layout.input}" is ${typeName(input)}: expected a string`);
  }
  const user = typeof input === 'string' && input.trim() !== '' ? `${instruction}\n\n${input}` : instruction;
  const turns: SourceMessage[] = [{ role: 'user', content: user }];
  const outColumn = layout.output.find((c) => row[c] !== undefined && row[c] !== null);
  if (outColumn !== undefined) {
    const out = row[outColumn];
    if (typeof out !== 'string')
      throw new RowProblemError(`column "${outColumn}" is ${typeName(out)}: expected a string`);
    if (out !== '') turns.push({ role: 'assistant', content: out });
  }
  return turns;
}

function listTurns(row: Record<string, unknown>, layout: SourceLayout): SourceMessage[] {
  const col = layout.messages;
  if (!(col in row)) throw new RowProblemError(`no column "${col}" (the turns); the row has: ${columnList(row)}`);
  const list = row[col];
  if (!Array.isArray(list)) throw new RowProblemError(`column "${col}" is ${typeName(list)}: expected a list of turns`);
  const turns: SourceMessage[] = [];
  // The ids of the last function_call turn's calls not yet answered by an observation turn.
  let unanswered: string[] = [];
  for (const [i, turn] of list.entries()) {
    const message = convertTurn(turn, `${col}[${i}]`, layout, i);
    const name = isRecord(turn) ? turn[layout.role] : undefined;
    if (typeof name === 'string' && name.toLowerCase() === 'function_call')
      unanswered = toolCallIds(Array.isArray(message.tool_calls) ? message.tool_calls : undefined);
    else if (typeof name === 'string' && name.toLowerCase() === 'observation' && message.tool_call_id === undefined) {
      const id = unanswered.shift();
      if (id !== undefined) message.tool_call_id = id;
    } else if (message.role !== 'tool') unanswered = [];
    turns.push(message);
  }
  return turns;
}

function convertTurn(turn: unknown, at: string, layout: SourceLayout, index: number): SourceMessage {
  if (!isRecord(turn))
    throw new RowProblemError(
      `${at} is ${typeName(turn)}: expected an object with "${layout.role}" and "${layout.content}"`,
    );
  const roleRaw = turn[layout.role];
  if (typeof roleRaw !== 'string') {
    const keys = Object.keys(turn).join(', ');
    throw new RowProblemError(
      roleRaw === undefined
        ? `${at} has no "${layout.role}" (its keys: ${keys}); set fields.role to the key of the role`
        : `${at}.${layout.role} is ${typeName(roleRaw)}: expected a role name`,
    );
  }
  const role = roleOf(roleRaw, layout.roles);
  if (role === undefined) {
    throw new RowProblemError(
      `${at}.${layout.role} is ${jsonText(roleRaw)}: not a known role; map it with roles: {${roleRaw}: user|assistant|system|tool}`,
    );
  }
  const content = turnContent(turn, at, layout);
  const message: SourceMessage = { role, content };
  for (const [k, v] of Object.entries(turn)) {
    if (k === layout.role || k === layout.content || k === 'role' || k === 'content' || v === null || v === undefined)
      continue;
    message[k] = v;
  }
  if (roleRaw.toLowerCase() === 'function_call' && role === 'assistant' && message.tool_calls === undefined) {
    try {
      message.tool_calls = functionCallToolCalls(content, index, at);
    } catch (e: unknown) {
      throw new RowProblemError(errorMessage(e));
    }
    message.content = '';
  }
  return message;
}

/** The chat role of a source role name: the configured/known names, then the same lowercased. */
function roleOf(name: string, roles: Readonly<Record<string, ChatRole>>): ChatRole | undefined {
  if (Object.hasOwn(roles, name)) return roles[name];
  const lower = name.toLowerCase();
  return Object.hasOwn(roles, lower) ? roles[lower] : undefined;
}

function turnContent(turn: Record<string, unknown>, at: string, layout: SourceLayout): string {
  const key = layout.content;
  const v = turn[key];
  if (typeof v === 'string') return v;
  if (v === null) return '';
  if (v === undefined) {
    // An assistant turn that only calls tools has no content.
    if (Array.isArray(turn.tool_calls) || typeof turn.tool_calls === 'string') return '';
    throw new RowProblemError(
      `${at} has no "${key}" (its keys: ${Object.keys(turn).join(', ')}); set fields.content to the key of the text`,
    );
  }
  if (Array.isArray(v)) return joinTextParts(v, `${at}.${key}`);
  throw new RowProblemError(`${at}.${key} is ${typeName(v)}: expected a string or a list of text parts`);
}

/** OpenAI content parts: the text ones joined by `\n`; any other part makes the row malformed. */
function joinTextParts(parts: readonly unknown[], at: string): string {
  const texts: string[] = [];
  for (const [i, part] of parts.entries()) {
    if (typeof part === 'string') texts.push(part);
    else if (isRecord(part) && (part.type === 'text' || part.type === undefined) && typeof part.text === 'string')
      texts.push(part.text);
    else {
      const kind = isRecord(part) && typeof part.type === 'string' ? `a "${part.type}" part` : typeName(part);
      throw new RowProblemError(`${at}[${i}] is ${kind}: only text parts can be a prompt`);
    }
  }
  return texts.join('\n');
}

/** Puts the system column's text before the turns, unless the turns start with a system turn of their own. */
function withSystem(row: Record<string, unknown>, layout: SourceLayout, turns: SourceMessage[]): SourceMessage[] {
  const { column, explicit } = layout.system;
  const v = row[column];
  if (v === undefined || v === null) {
    if (explicit && !(column in row))
      throw new RowProblemError(`no system column "${column}" (fields.system); the row has: ${columnList(row)}`);
    return turns;
  }
  if (typeof v !== 'string') {
    if (!explicit) return turns;
    throw new RowProblemError(`system column "${column}" is ${typeName(v)}: expected a string`);
  }
  if (v.trim() === '') return turns;
  if (turns[0]?.role === 'system') {
    if (explicit)
      throw new RowProblemError(`the row has both a system column "${column}" (fields.system) and a system turn`);
    return turns;
  }
  return [{ role: 'system', content: v }, ...turns];
}
