/**
 * Calls in the Hermes format (Qwen3, Qwen2.5, Hermes; SGLang's `hermes` / `qwen25` parsers):
 * `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, several in a row for parallel calls.
 *
 * Content is the text before the first `<tool_call>`, trimmed, as SGLang's parsers give it. The
 * arguments are kept as the JSON text the model wrote: Qwen3's template prints a string
 * argument as it is (`{"name": "` + name + `", "arguments": ` + arguments + `}`) and serializes
 * an object with `tojson`, so the text renders the call back exactly as it was written.
 */
import { scanJsonObject, skipWhitespace } from './json-scan.js';
import { callFailure, generatedCallId, onlyTrailingSpecials, quote, toolCall } from './parse-common.js';
import type { ParsedTurn, ToolCall } from './types.js';

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

/** One `<tool_call>` block at `pos`: the call and the offset after `</tool_call>`, or why it does not parse. */
function readCall(
  text: string,
  pos: number,
  number: number,
  turn: number,
): { call: ToolCall; end: number } | { failure: ParsedTurn } {
  const start = skipWhitespace(text, pos + OPEN.length);
  if (start >= text.length) return { failure: callFailure(number, `${OPEN} is not closed`) };
  const scanned = scanJsonObject(text, start);
  if ('kind' in scanned) {
    return {
      failure: callFailure(
        number,
        scanned.kind === 'unterminated'
          ? `${OPEN} is not closed (the text ends inside its JSON)`
          : `not valid JSON (${scanned.detail})`,
      ),
    };
  }
  const name = scanned.value.name;
  if (typeof name !== 'string' || name === '') return { failure: callFailure(number, 'no function name') };
  const args = scanned.value.arguments;
  if (args !== undefined && (args === null || typeof args !== 'object' || Array.isArray(args))) {
    return { failure: callFailure(number, `the arguments of ${name} are not a JSON object`) };
  }
  const after = skipWhitespace(text, scanned.end);
  if (!text.startsWith(CLOSE, after)) {
    return {
      failure: callFailure(
        number,
        after >= text.length
          ? `${OPEN} is not closed`
          : `${quote(text.slice(after))} after its JSON instead of ${CLOSE}`,
      ),
    };
  }
  const raw = scanned.rawMembers.get('arguments') ?? '{}';
  return { call: toolCall(generatedCallId(turn, number - 1), name, raw), end: after + CLOSE.length };
}

/** Reads a Hermes-format turn (see the file's comment). */
export function parseHermes(text: string, turn: number): ParsedTurn {
  const first = text.indexOf(OPEN);
  if (first === -1) return { ok: true, content: text, calls: [] };
  const calls: ToolCall[] = [];
  let pos = first;
  for (;;) {
    const next = skipWhitespace(text, pos);
    if (!text.startsWith(OPEN, next)) {
      if (onlyTrailingSpecials(text.slice(next))) break;
      return callFailure(calls.length, `text after it: ${quote(text.slice(next))}`);
    }
    const read = readCall(text, next, calls.length + 1, turn);
    if ('failure' in read) return read.failure;
    calls.push(read.call);
    pos = read.end;
  }
  return { ok: true, content: text.slice(0, first).trim(), calls };
}
