/**
 * What follows a regenerated turn of an agentic conversation (docs/agentic.md): the calls the
 * model made, read in its family's format, and the tool results that answer them.
 *
 * - The answer enters the history with its calls as structured `tool_calls` (and the text before
 *   them as its content), so the chat template renders them as it renders calls.
 * - A call that does not parse (`tool-parse`) or names a tool the record does not define
 *   (`tool-unknown`) ends the conversation there, its turns kept.
 * - Without an executor, the source's results follow the turn only when it made the same calls
 *   (names in order, as many), each result given the id of the call it answers; a turn that
 *   diverges ends the conversation (`tool-mismatch`), so no result ever follows a call it does
 *   not answer.
 * - With `toolExecutor`, the calls are run there and its results follow instead; they are
 *   recorded once in Redis (record-tool-results-2.lua) before the next turn, so a conversation
 *   picked up again after a crash reuses them instead of calling again. A turn that answers
 *   where the source called, or calls where the source answered, still ends the conversation: the
 *   source's next turn could not follow it.
 */
import {
  answerMessage,
  answerTextWithSpecials,
  matchSourceResults,
  parseToolCalls,
  sourceCalls,
  sourceTurnStep,
  undefinedToolCall,
  type ChatMessage,
  type ChatTokenizer,
  type ConversationTurns,
  type ToolCall,
  type ToolCallFormat,
} from '../../shared/index.js';
import { executeToolCalls, ToolExecutorError, type ToolExecutorSettings } from './tool-executor.js';

/** Where a turn's tool results are recorded once (see the module comment). */
export interface ToolResultsStore {
  get(dataset: string, conversationId: string, turn: number): Promise<ChatMessage[] | undefined>;
  /** Records them unless some are recorded already; returns the recorded ones (undefined: the conversation finished). */
  record(
    dataset: string,
    conversationId: string,
    turn: number,
    results: readonly ChatMessage[],
  ): Promise<ChatMessage[] | undefined>;
}

/** The tool side of a conversation, the same for all its turns. */
export interface ConversationTools {
  format: ToolCallFormat;
  /** The record's tool schemas. */
  tools: readonly unknown[] | undefined;
  executor?: ToolExecutorSettings | undefined;
  store?: ToolResultsStore | undefined;
}

/** What a turn's answer comes to. */
export type ToolTurnOutcome =
  /** The conversation goes on: `message` enters the history, `results` (if any) after it. */
  | { kind: 'next'; message: ChatMessage; calls: ToolCall[]; results?: ChatMessage[]; origin?: 'source' | 'executor' }
  /** It ends after this turn (which is kept), for `reason`. */
  | { kind: 'end'; message: ChatMessage; reason: string };

/** Whether a conversation is agentic: its record offers tools, or its source calls them. */
export function isAgentic(messages: readonly ChatMessage[], tools: readonly unknown[] | undefined): boolean {
  if (tools !== undefined && tools.length > 0) return true;
  return messages.some(
    (m) =>
      m.role === 'tool' ||
      (m.tool_calls !== undefined && m.tool_calls.length > 0) ||
      // Hermes in text: calls as `<tool_call>` blocks, results as `<tool_response>` blocks.
      (m.role === 'assistant' && m.content.includes('<tool_call>')) ||
      (m.role === 'user' && /^\s*<tool_response>/.test(m.content)),
  );
}

/**
 * Reads turn `turn`'s answer for its calls and finds the results that follow it (see the module
 * comment). A Redis error (retryable) is thrown; everything of the conversation's own is an `end`.
 */
export async function readToolTurn(
  tok: ChatTokenizer,
  input: {
    dataset: string;
    conversationId: string;
    turn: number;
    total: number;
    outputIds: readonly number[];
    messages: readonly ChatMessage[];
    turns: ConversationTurns;
  },
  tools: ConversationTools,
): Promise<ToolTurnOutcome> {
  const { turn } = input;
  const plain = answerMessage(tok, input.outputIds);
  const parsed = parseToolCalls(tools.format, answerTextWithSpecials(tok, input.outputIds), { turn });
  if (!parsed.ok) return { kind: 'end', message: plain, reason: `tool-parse: turn ${turn}: ${parsed.reason}` };
  const { calls } = parsed;
  const message: ChatMessage =
    calls.length === 0
      ? plain
      : {
          role: 'assistant',
          content: parsed.content,
          ...(plain.reasoning_content === undefined ? {} : { reasoning_content: plain.reasoning_content }),
          tool_calls: calls,
        };
  const unknown = undefinedToolCall(calls, tools.tools, turn);
  if (unknown !== undefined) return { kind: 'end', message, reason: unknown };
  // The last turn: nothing follows it.
  if (turn >= input.total) return { kind: 'next', message, calls };

  const step = sourceTurnStep(input.messages, input.turns, turn);
  const named = step.assistant === undefined ? [] : sourceCalls(step.assistant);
  const sourceCalled = (Array.isArray(named) && named.length > 0) || step.results.length > 0;
  if (calls.length === 0 && !sourceCalled) return { kind: 'next', message, calls };

  if (tools.executor === undefined || tools.store === undefined) {
    const m = matchSourceResults(turn, calls, {
      assistant: step.assistant ?? { role: 'assistant', content: '' },
      results: step.results,
    });
    return m.ok
      ? { kind: 'next', message, calls, results: m.results, origin: 'source' }
      : { kind: 'end', message, reason: m.reason };
  }
  const names = (list: readonly { name: string }[]) => list.map((c) => c.name).join(', ');
  if (calls.length === 0)
    return {
      kind: 'end',
      message,
      reason: `tool-mismatch: turn ${turn} answered where the source called ${Array.isArray(named) ? names(named) : 'tools'}`,
    };
  if (!sourceCalled)
    return {
      kind: 'end',
      message,
      reason: `tool-mismatch: turn ${turn} called ${names(calls.map((c) => c.function))} where the source answered`,
    };
  const recorded = await tools.store.get(input.dataset, input.conversationId, turn);
  if (recorded !== undefined) return { kind: 'next', message, calls, results: recorded, origin: 'executor' };
  let results: ChatMessage[];
  try {
    results = await executeToolCalls(tools.executor, {
      dataset: input.dataset,
      conversationId: input.conversationId,
      turn,
      calls,
      tools: tools.tools,
    });
  } catch (e: unknown) {
    if (e instanceof ToolExecutorError) return { kind: 'end', message, reason: `tool-executor: ${e.message}` };
    throw e;
  }
  const kept = await tools.store.record(input.dataset, input.conversationId, turn, results);
  // Finished meanwhile by another delivery: the driver finds that out before its next turn.
  return { kind: 'next', message, calls, results: kept ?? results, origin: 'executor' };
}
