/**
 * The calls a source conversation's assistant message made: its structured `tool_calls` (the
 * OpenAI shape, or bare `{name, arguments}` entries) or, without them, the Hermes
 * `<tool_call>{…}</tool_call>` blocks of its text (docs/agentic.md, the shapes found in datasets).
 * Only the names and ids matter here: they decide whether a regenerated turn made the same calls.
 */
import type { ChatMessage } from '../tokenizer/index.js';
import { isRecord } from '../util/index.js';
import { oneLine } from './parse-common.js';

/** A call of a source message: its tool's name, and its id when the source gives one. */
export interface SourceCall {
  name: string;
  id?: string;
}

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

function structuredCalls(entries: readonly unknown[]): SourceCall[] | string {
  const out: SourceCall[] = [];
  for (const [i, entry] of entries.entries()) {
    if (!isRecord(entry)) return `tool_calls[${String(i)}] is not an object`;
    const fn = isRecord(entry.function) ? entry.function : entry;
    const name = fn.name;
    if (typeof name !== 'string' || name === '') return `tool_calls[${String(i)}] has no function name`;
    out.push(typeof entry.id === 'string' && entry.id !== '' ? { name, id: entry.id } : { name });
  }
  return out;
}

/**
 * The name in a `<tool_call>` block: JSON's `name`, or, for the Python-dict text some Hermes
 * datasets hold (`{'name': 'f', 'arguments': {…}}`), the quoted value after the `name` key.
 */
function blockName(block: string): string | undefined {
  try {
    const value: unknown = JSON.parse(block);
    if (isRecord(value)) return typeof value.name === 'string' && value.name !== '' ? value.name : undefined;
  } catch {
    // Not JSON: read the name the way the dict text writes it.
  }
  const m = /^\{[\s\S]*?['"]name['"]\s*:\s*(['"])([^'"\n]+)\1/.exec(block);
  return m?.[2];
}

function textCalls(content: string): SourceCall[] | string {
  const out: SourceCall[] = [];
  let pos = content.indexOf(OPEN);
  while (pos !== -1) {
    const number = String(out.length + 1);
    const end = content.indexOf(CLOSE, pos + OPEN.length);
    if (end === -1) return `<tool_call> block ${number} is not closed`;
    const block = content.slice(pos + OPEN.length, end).trim();
    const name = blockName(block);
    if (name === undefined) return `<tool_call> block ${number} has no function name: ${oneLine(block, 60)}`;
    out.push({ name });
    pos = content.indexOf(OPEN, end + CLOSE.length);
  }
  return out;
}

/**
 * The calls `message` (a source assistant message) made, in order, or why they cannot be read
 * (e.g. `tool_calls[1] has no function name`). Structured `tool_calls` win; a message without
 * them is read for Hermes `<tool_call>` blocks in its text. No call: an empty list.
 */
export function sourceCalls(message: ChatMessage): SourceCall[] | string {
  const structured = message.tool_calls;
  if (structured !== undefined && structured.length > 0) return structuredCalls(structured);
  return textCalls(message.content);
}
