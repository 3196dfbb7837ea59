/**
 * Calls in the Kimi K2 format (SGLang's `kimi_k2` parser):
 * `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>`.
 *
 * The call's id is the model's own `functions.NAME:IDX`. Content is the text before the section,
 * as it is (SGLang does not trim it; Kimi's template prints the content right before the
 * section). The arguments are kept as the text the model wrote: Kimi K2's template prints a
 * string argument as it is and serializes an object with `tojson`.
 */
import { parseJsonObject } from './json-scan.js';
import { quote, toolCall } from './parse-common.js';
import { parseSection, type SectionTokens } from './parse-sections.js';
import type { ParsedTurn, ToolCall } from './types.js';

const TOKENS: SectionTokens = {
  sectionBegin: '<|tool_calls_section_begin|>',
  sectionEnd: '<|tool_calls_section_end|>',
  callBegin: '<|tool_call_begin|>',
  callEnd: '<|tool_call_end|>',
};
const ARGUMENT_BEGIN = '<|tool_call_argument_begin|>';
const ID_PREFIX = 'functions.';
/** `NAME:IDX`, after `functions.` (SGLang also reads an id without it). */
const NAME_INDEX = /^(\S+):(\d+)$/;

function readInside(inside: string): ToolCall | { why: string } {
  const at = inside.indexOf(ARGUMENT_BEGIN);
  if (at === -1) return { why: `no ${ARGUMENT_BEGIN}` };
  const id = inside.slice(0, at).trim();
  const m = NAME_INDEX.exec(id.startsWith(ID_PREFIX) ? id.slice(ID_PREFIX.length) : id);
  const name = m?.[1];
  if (name === undefined) return { why: `id ${quote(id)} is not functions.NAME:IDX` };
  const raw = inside.slice(at + ARGUMENT_BEGIN.length);
  const parsed = parseJsonObject(raw);
  if ('error' in parsed) return { why: `the arguments of ${name} are ${parsed.error}` };
  return toolCall(id, name, raw);
}

/** Reads a Kimi K2-format turn (see the file's comment). */
export function parseKimiK2(text: string): ParsedTurn {
  const begin = text.indexOf(TOKENS.sectionBegin);
  if (begin === -1) return { ok: true, content: text, calls: [] };
  return parseSection(text, begin, text.slice(0, begin), TOKENS, readInside);
}
