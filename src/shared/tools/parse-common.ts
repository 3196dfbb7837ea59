/**
 * What the per-family parsers share: the ids tokenmill gives calls, the one-line failure reason,
 * and the special tokens a decoded turn may still end with.
 */
import type { ParsedTurn, ToolCall } from './types.js';

/** The longest failure reason {@link callFailure} returns. */
export const MAX_REASON_CHARS = 200;

/** The id of a call whose format writes none: `call_<turn>_<i>`, `i` 0-based. */
export function generatedCallId(turn: number, index: number): string {
  return `call_${String(turn)}_${String(index)}`;
}

/** A {@link ToolCall} in the OpenAI shape. */
export function toolCall(id: string, name: string, args: ToolCall['function']['arguments']): ToolCall {
  return { id, type: 'function', function: { name, arguments: args } };
}

/** `text` on one line (whitespace runs folded), at most `maxChars` long. */
export function oneLine(text: string, maxChars: number): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length <= maxChars ? flat : `${flat.slice(0, maxChars - 1)}…`;
}

/** The failure of call `callNumber` (1-based), on one line, bounded by {@link MAX_REASON_CHARS}. */
export function callFailure(callNumber: number, why: string): ParsedTurn {
  return { ok: false, reason: oneLine(`call ${String(callNumber)}: ${why}`, MAX_REASON_CHARS) };
}

/** A short quote of `text` for a reason. */
export function quote(text: string, maxChars = 40): string {
  return JSON.stringify(oneLine(text, maxChars));
}

/**
 * Special tokens a decoded turn may end with after its calls: `<|…|>` (Llama's `<|eom_id|>`,
 * Qwen's `<|endoftext|>`), DeepSeek's `<｜…｜>`, and the bracketed and `</s>` forms of EOS.
 */
const SPECIAL_AT_END = /(?:<\|[^|<>\s]{1,64}\|>|<｜[^｜<>\s]{1,64}｜>|\[EOS\]|\[EOT\]|<\/s>)$/;

/** `text` without the whitespace and special tokens it ends with. */
export function withoutTrailingSpecials(text: string): string {
  let end = text.length;
  for (;;) {
    const trimmed = text.slice(0, end).trimEnd();
    const m = SPECIAL_AT_END.exec(trimmed.slice(-70));
    if (m === null) return trimmed;
    end = trimmed.length - m[0].length;
  }
}

/** Whether `text` holds nothing but whitespace and special tokens. */
export function onlyTrailingSpecials(text: string): boolean {
  return withoutTrailingSpecials(text) === '';
}
