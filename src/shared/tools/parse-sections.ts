/**
 * The shape DeepSeek-V3 and Kimi K2 share: a section of calls between special tokens, each call
 * between its own begin and end tokens. This walks the section; the family reads each call's inside.
 */
import { skipWhitespace } from './json-scan.js';
import { callFailure, onlyTrailingSpecials, quote } from './parse-common.js';
import type { ParsedTurn, ToolCall } from './types.js';

/** The tokens around a section of calls and around each call. */
export interface SectionTokens {
  sectionBegin: string;
  sectionEnd: string;
  callBegin: string;
  callEnd: string;
}

/** Reads the inside of call `number` (1-based): the call, or why it does not parse. */
export type ReadCallInside = (inside: string, number: number) => ToolCall | { why: string };

/**
 * The calls of the section that starts at `begin` (the offset of `sectionBegin`), which must be
 * closed and followed by nothing but whitespace and special tokens; `content` is the text the
 * family keeps before it.
 */
export function parseSection(
  text: string,
  begin: number,
  content: string,
  tokens: SectionTokens,
  readInside: ReadCallInside,
): ParsedTurn {
  const calls: ToolCall[] = [];
  let pos = begin + tokens.sectionBegin.length;
  for (;;) {
    pos = skipWhitespace(text, pos);
    const number = calls.length + 1;
    if (text.startsWith(tokens.sectionEnd, pos)) {
      pos += tokens.sectionEnd.length;
      break;
    }
    if (pos >= text.length) {
      return calls.length === 0
        ? callFailure(1, `the section ends before its first call (no ${tokens.sectionEnd})`)
        : callFailure(calls.length, `the section is not closed (no ${tokens.sectionEnd})`);
    }
    if (!text.startsWith(tokens.callBegin, pos)) {
      return callFailure(number, `${quote(text.slice(pos))} where ${tokens.callBegin} was expected`);
    }
    const insideStart = pos + tokens.callBegin.length;
    const end = text.indexOf(tokens.callEnd, insideStart);
    if (end === -1) return callFailure(number, `${tokens.callBegin} is not closed (no ${tokens.callEnd})`);
    const inside = text.slice(insideStart, end);
    if (inside.includes(tokens.callBegin)) {
      return callFailure(number, `${tokens.callBegin} is not closed before the next one`);
    }
    const call = readInside(inside, number);
    if ('why' in call) return callFailure(number, call.why);
    calls.push(call);
    pos = end + tokens.callEnd.length;
  }
  if (calls.length === 0) return callFailure(1, 'the section holds no call');
  const rest = text.slice(pos);
  if (!onlyTrailingSpecials(rest)) return callFailure(calls.length, `text after the section: ${quote(rest)}`);
  return { ok: true, content, calls };
}
