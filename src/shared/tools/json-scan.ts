/**
 * Reading one JSON object out of a longer text, as a model writes it inside a call: where it
 * ends, its value, and the exact text of each top-level member's value (a template that prints
 * the arguments as text needs them as the model wrote them, spacing and key order included).
 */
import { isRecord } from '../util/index.js';

/** A JSON object read from a text: its end offset, value and the raw text of each member's value. */
export interface ScannedObject {
  /** Offset just past the closing `}`. */
  end: number;
  value: Record<string, unknown>;
  /** The text of each top-level member's value, by key (the last one where a key repeats, as `JSON.parse`). */
  rawMembers: ReadonlyMap<string, string>;
}

/** Why no object could be read: the text ended inside it, or it is not valid JSON. */
export type ScanFailure = { kind: 'unterminated' } | { kind: 'invalid'; detail: string };

const WHITESPACE = new Set([' ', '\t', '\n', '\r']);

/** The offset of the first character at or after `pos` that is not JSON whitespace. */
export function skipWhitespace(text: string, pos: number): number {
  let i = pos;
  while (i < text.length && WHITESPACE.has(text[i] ?? '')) i++;
  return i;
}

/** Offset just past the string that opens at `pos` (a `"`), or undefined when the text ends first. */
function stringEnd(text: string, pos: number): number | undefined {
  for (let i = pos + 1; i < text.length; i++) {
    const c = text[i];
    if (c === '\\') i++;
    else if (c === '"') return i + 1;
  }
  return undefined;
}

/**
 * Offset just past the JSON value that starts at `pos`, found by matching brackets outside
 * strings (the value is not validated here), or undefined when the text ends inside it.
 */
export function valueEnd(text: string, pos: number): number | undefined {
  const first = text[pos];
  if (first === undefined) return undefined;
  if (first === '"') return stringEnd(text, pos);
  if (first !== '{' && first !== '[') {
    let i = pos;
    while (i < text.length && !/[\s,;\]}]/.test(text[i] ?? '')) i++;
    return i;
  }
  let depth = 0;
  for (let i = pos; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      const end = stringEnd(text, i);
      if (end === undefined) return undefined;
      i = end - 1;
    } else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return undefined;
}

function parseError(text: string): string | undefined {
  try {
    JSON.parse(text);
    return undefined;
  } catch (e: unknown) {
    return e instanceof Error ? e.message : String(e);
  }
}

/** The raw text of each member's value of the (already valid) object `text`. */
function rawMembersOf(text: string): Map<string, string> {
  const out = new Map<string, string>();
  let i = skipWhitespace(text, 1);
  while (i < text.length && text[i] === '"') {
    const keyEnd = stringEnd(text, i) ?? text.length;
    const key = JSON.parse(text.slice(i, keyEnd)) as string;
    const start = skipWhitespace(text, skipWhitespace(text, keyEnd) + 1);
    const end = valueEnd(text, start) ?? text.length;
    out.set(key, text.slice(start, end));
    i = skipWhitespace(text, skipWhitespace(text, end) + 1);
  }
  return out;
}

/** Reads the JSON object that starts at `pos` (a `{`, no leading whitespace). */
export function scanJsonObject(text: string, pos: number): ScannedObject | ScanFailure {
  if (text[pos] !== '{') {
    return { kind: 'invalid', detail: pos >= text.length ? 'nothing after the tag' : 'not a JSON object' };
  }
  const end = valueEnd(text, pos);
  if (end === undefined) return { kind: 'unterminated' };
  const slice = text.slice(pos, end);
  const error = parseError(slice);
  if (error !== undefined) return { kind: 'invalid', detail: error };
  const value: unknown = JSON.parse(slice);
  if (!isRecord(value)) return { kind: 'invalid', detail: 'not a JSON object' };
  return { end, value, rawMembers: rawMembersOf(slice) };
}

/** `text` parsed as a JSON object, or why it is not one. */
export function parseJsonObject(text: string): { value: Record<string, unknown> } | { error: string } {
  const error = parseError(text);
  if (error !== undefined) return { error: `not valid JSON (${error})` };
  const value: unknown = JSON.parse(text);
  return isRecord(value) ? { value } : { error: 'not a JSON object' };
}
