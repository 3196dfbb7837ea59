/**
 * Calls in the Llama 3.1 / 3.2 JSON format (SGLang's `llama3` parser): the message is a JSON
 * object `{"name": …, "parameters": {…}}` (`"arguments"` is read too), optionally after
 * `<|python_tag|>`, several separated by `;`. The turn may still end with `<|eom_id|>`.
 *
 * A message is a call only when, after the optional `<|python_tag|>`, it is nothing but such
 * objects: prose that contains JSON is content, and so is a JSON answer that is no call (an
 * object without `"parameters"`). A message that opens like a call (`{"name": …`) or follows
 * `<|python_tag|>` but does not parse is a broken call. Content is the text before
 * `<|python_tag|>`, as SGLang gives it.
 *
 * The arguments are an object: Llama 3.1's template renders a call as
 * `{"name": "` + name + `", "parameters": ` + (arguments | tojson) + `}`.
 */
import { scanJsonObject, skipWhitespace } from './json-scan.js';
import { callFailure, generatedCallId, quote, toolCall, withoutTrailingSpecials } from './parse-common.js';
import type { ParsedTurn, ToolCall } from './types.js';

const PYTHON_TAG = '<|python_tag|>';

type ObjectsRead = { objects: Record<string, unknown>[] } | { failure: ParsedTurn };

/** The `;`-separated JSON objects that make up `text` (whitespace around them allowed). */
function readObjects(text: string): ObjectsRead {
  const objects: Record<string, unknown>[] = [];
  let pos = skipWhitespace(text, 0);
  while (pos < text.length) {
    const number = objects.length + 1;
    const scanned = scanJsonObject(text, pos);
    if ('kind' in scanned) {
      const why =
        scanned.kind === 'unterminated' ? 'the text ends inside its JSON' : `not valid JSON (${scanned.detail})`;
      return { failure: callFailure(number, why) };
    }
    objects.push(scanned.value);
    pos = skipWhitespace(text, scanned.end);
    if (pos >= text.length) break;
    if (text[pos] !== ';') return { failure: callFailure(number, `text after it: ${quote(text.slice(pos))}`) };
    pos = skipWhitespace(text, pos + 1);
  }
  if (objects.length === 0) return { failure: callFailure(1, `nothing after ${PYTHON_TAG}`) };
  return { objects };
}

function argumentsOf(obj: Record<string, unknown>): unknown {
  return obj.parameters ?? obj.arguments;
}

function isCallShaped(obj: Record<string, unknown>): boolean {
  const args = argumentsOf(obj);
  return typeof obj.name === 'string' && args !== null && typeof args === 'object' && !Array.isArray(args);
}

function toCalls(objects: Record<string, unknown>[], turn: number): ToolCall[] | ParsedTurn {
  const calls: ToolCall[] = [];
  for (const [i, obj] of objects.entries()) {
    const name = obj.name;
    if (typeof name !== 'string' || name === '') return callFailure(i + 1, 'no function name');
    const args = argumentsOf(obj);
    if (args === undefined) return callFailure(i + 1, `${name} has no "parameters"`);
    if (!isCallShaped(obj)) return callFailure(i + 1, `the parameters of ${name} are not a JSON object`);
    calls.push(toolCall(generatedCallId(turn, i), name, args as Record<string, unknown>));
  }
  return calls;
}

/** Reads a Llama 3 JSON-format turn (see the file's comment). */
export function parseLlama3(text: string, turn: number): ParsedTurn {
  const body = withoutTrailingSpecials(text);
  const tag = body.indexOf(PYTHON_TAG);
  if (tag !== -1) {
    const read = readObjects(body.slice(tag + PYTHON_TAG.length));
    if ('failure' in read) return read.failure;
    const calls = toCalls(read.objects, turn);
    return Array.isArray(calls) ? { ok: true, content: body.slice(0, tag), calls } : calls;
  }
  const message = body.trim();
  if (!message.startsWith('{')) return { ok: true, content: text, calls: [] };
  const opensLikeCall = /^\{\s*"name"\s*:/.test(message);
  const read = readObjects(message);
  if ('failure' in read) return opensLikeCall ? read.failure : { ok: true, content: text, calls: [] };
  const [first] = read.objects;
  if (first === undefined || typeof first.name !== 'string' || argumentsOf(first) === undefined) {
    return { ok: true, content: text, calls: [] };
  }
  const calls = toCalls(read.objects, turn);
  return Array.isArray(calls) ? { ok: true, content: '', calls } : calls;
}
