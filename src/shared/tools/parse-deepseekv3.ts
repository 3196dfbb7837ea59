/**
 * Calls in the DeepSeek-V3 format (SGLang's `deepseekv3` parser):
 * `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>`
 * (several separated by `\n`), then `<｜tool▁calls▁end｜>`.
 *
 * Content is the text before the section, trimmed, as SGLang gives it. The arguments are kept as
 * the JSON text between the fences: DeepSeek-V3's template concatenates
 * `'```json\n' + arguments + '\n```'`, which needs a string and prints it as it is.
 */
import { parseJsonObject } from './json-scan.js';
import { generatedCallId, quote, toolCall } from './parse-common.js';
import { parseSection, type SectionTokens } from './parse-sections.js';
import type { ParsedTurn, ToolCall } from './types.js';

const TOKENS: SectionTokens = {
  sectionBegin: '<｜tool▁calls▁begin｜>',
  sectionEnd: '<｜tool▁calls▁end｜>',
  callBegin: '<｜tool▁call▁begin｜>',
  callEnd: '<｜tool▁call▁end｜>',
};
const SEP = '<｜tool▁sep｜>';
/** After the separator: the name on its line, then the arguments in a json code block. */
const BODY = /^([^\n]*)\n```json\n([\s\S]*)\n```$/;

function readInside(inside: string, number: number, turn: number): ToolCall | { why: string } {
  const sep = inside.indexOf(SEP);
  if (sep === -1) return { why: `no ${SEP} in ${quote(inside)}` };
  const type = inside.slice(0, sep).trim();
  if (type !== 'function') return { why: `type ${quote(type)} where "function" was expected` };
  const body = BODY.exec(inside.slice(sep + SEP.length));
  if (body === null) return { why: 'not NAME then a ```json code block' };
  const name = (body[1] ?? '').trim();
  if (name === '') return { why: 'no function name' };
  const raw = body[2] ?? '';
  const parsed = parseJsonObject(raw);
  if ('error' in parsed) return { why: `the arguments of ${name} are ${parsed.error}` };
  return toolCall(generatedCallId(turn, number - 1), name, raw);
}

/** Reads a DeepSeek-V3-format turn (see the file's comment). */
export function parseDeepSeekV3(text: string, turn: number): ParsedTurn {
  const begin = text.indexOf(TOKENS.sectionBegin);
  if (begin === -1) return { ok: true, content: text, calls: [] };
  return parseSection(text, begin, text.slice(0, begin).trim(), TOKENS, (inside, number) =>
    readInside(inside, number, turn),
  );
}
