/**
 * Whether a regenerated turn's calls may be answered with the source's tool results: only when
 * the turn made the same calls as the source (the same tools, in the same order, as many). The
 * results then follow, each answering the regenerated call at its place; otherwise the
 * conversation ends with a reason whose first word names the cause:
 * - `tool-mismatch:` the turn called another tool, made another number of calls, called where
 *   the source answered or answered where the source called;
 * - `tool-source:` the source's own calls cannot be read or its results do not answer them.
 */
import type { ChatMessage } from '../tokenizer/index.js';
import { sourceCalls, type SourceCall } from './source-calls.js';
import type { ToolCall } from './types.js';

/** The source's side of a turn: its assistant message and the tool results that follow it. */
export interface SourceTurn {
  assistant: ChatMessage;
  /**
   * The messages after `assistant` that answer its calls, up to the next user or assistant
   * message: `tool` messages, or, for Hermes-in-text sources, a `user` message whose content is
   * `<tool_response>` blocks.
   */
  results: readonly ChatMessage[];
}

/** What {@link matchSourceResults} gives: the results to continue with, or why the conversation ends. */
export type SourceResultsMatch = { ok: true; results: ChatMessage[] } | { ok: false; reason: string };

const RESPONSE_BLOCK = /<tool_response>/g;

/** How many calls `message` answers: its `<tool_response>` blocks, else one for a `tool` message. */
function answersIn(message: ChatMessage): number {
  const blocks = message.content.match(RESPONSE_BLOCK)?.length ?? 0;
  if (blocks > 0) return blocks;
  return message.role === 'tool' ? 1 : 0;
}

function countOf(n: number): string {
  return n === 1 ? '1 call' : `${String(n)} calls`;
}

function mismatch(turn: number, made: readonly ToolCall[], source: readonly SourceCall[]): string | undefined {
  const t = `turn ${String(turn)}`;
  if (made.length > 0 && source.length === 0) {
    return `tool-mismatch: ${t} called ${made.map((c) => c.function.name).join(', ')} where the source answered`;
  }
  if (made.length === 0 && source.length > 0) {
    return `tool-mismatch: ${t} answered where the source called ${source.map((c) => c.name).join(', ')}`;
  }
  const shared = Math.min(made.length, source.length);
  for (let i = 0; i < shared; i++) {
    const mine = made[i]?.function.name ?? '';
    const theirs = source[i]?.name ?? '';
    if (mine !== theirs) {
      const which = shared > 1 ? ` (call ${String(i + 1)})` : '';
      return `tool-mismatch: ${t} called ${mine} where the source called ${theirs}${which}`;
    }
  }
  if (made.length !== source.length) {
    return `tool-mismatch: ${t} made ${countOf(made.length)} where the source made ${String(source.length)}`;
  }
  return undefined;
}

/** `result` answering `call`: its `tool_call_id` the call's id, its `name` kept or made the call's. */
function answering(result: ChatMessage, call: ToolCall): ChatMessage {
  const out: ChatMessage = { ...result, tool_call_id: call.id };
  if (result.name !== undefined && result.tool_call_id === undefined) out.name = call.function.name;
  return out;
}

/**
 * The source's results for turn `turn` (1-based), given the calls the regenerated turn made
 * (see the file's comment). The i-th result answers the i-th call: a `tool` message answering one
 * call gets that call's `tool_call_id` (and its name, where the source named results but gave no
 * id); a message holding several `<tool_response>` blocks, or a `user` message holding them, is
 * kept whole. A turn where neither side called has no results.
 */
export function matchSourceResults(turn: number, calls: readonly ToolCall[], source: SourceTurn): SourceResultsMatch {
  const t = `turn ${String(turn)}`;
  const theirs = sourceCalls(source.assistant);
  if (typeof theirs === 'string') return { ok: false, reason: `tool-source: ${t}: ${theirs}` };
  const answers = source.results.reduce((n, m) => n + answersIn(m), 0);
  if (answers !== theirs.length) {
    return {
      ok: false,
      reason: `tool-source: ${t}: the source made ${countOf(theirs.length)} and ${String(answers)} results answer them`,
    };
  }
  const reason = mismatch(turn, calls, theirs);
  if (reason !== undefined) return { ok: false, reason };
  const results: ChatMessage[] = [];
  let next = 0;
  for (const message of source.results) {
    const n = answersIn(message);
    const call = calls[next];
    results.push(n === 1 && message.role === 'tool' && call !== undefined ? answering(message, call) : { ...message });
    next += n;
  }
  return { ok: true, results };
}
