/**
 * The turns of a conversation regenerated turn by turn (`datasets[].turns: all`): where each
 * request goes, and which conversations cannot be regenerated that way.
 *
 * A turn starts at each assistant message that follows a user or tool message, and at the end
 * when the conversation ends with a user or tool message. Turn k's history is every message
 * before its start, with the source's system, user and tool messages as they are and, in place
 * of each earlier turn's assistant message, the answer regenerated for it; an assistant message
 * that directly follows another (a continuation in the source) belongs to the turn before it and
 * is never sent. The source's assistant content is never sent.
 */
import type { ChatMessage } from '../tokenizer/index.js';

/** Where turn k (1-based, index k − 1) starts in the source messages. */
export interface ConversationTurns {
  /** Index in the messages of each turn's start: its source assistant message, or `messages.length` for an open end. */
  starts: number[];
}

/** The id of turn `turn` (1-based) of conversation `conversationId`: unique per conversation and turn. */
export function turnSampleId(conversationId: string, turn: number): string {
  return `${conversationId}#t${turn}`;
}

/**
 * The turns of `messages`, or why the conversation cannot be regenerated turn by turn (the
 * reason names the message by its index in the record's list).
 */
export function conversationTurns(messages: readonly ChatMessage[], field = 'messages'): ConversationTurns | string {
  if (!messages.some((m) => m.role === 'user')) return 'the conversation has no user turn';
  const starts: number[] = [];
  let seenUser = false;
  let prev: ChatMessage['role'] | undefined;
  for (const [i, m] of messages.entries()) {
    switch (m.role) {
      case 'system':
        break;
      case 'user':
        if (prev === 'user') return `${field}[${i - 1}] and ${field}[${i}] are two user turns in a row`;
        if (m.content.trim() === '') return `${field}[${i}] is an empty user turn`;
        seenUser = true;
        break;
      case 'tool':
        if (prev !== 'assistant' && prev !== 'tool')
          return `${field}[${i}] is a tool turn with no assistant turn before it`;
        break;
      case 'assistant':
        if (!seenUser) return `${field}[${i}] is an assistant turn before any user turn`;
        if (prev === 'user' || prev === 'tool') starts.push(i);
        break;
    }
    if (m.role !== 'system') prev = m.role;
  }
  if (prev === 'user' || prev === 'tool') starts.push(messages.length);
  return { starts };
}

/** The source's side of turn `turn` (1-based): its assistant message and the results that answer its calls. */
export interface SourceTurnStep {
  /** The source's assistant message of the turn (undefined for an open end). */
  assistant: ChatMessage | undefined;
  /**
   * The source messages after it that carry tool results, before the next turn: its `tool`
   * messages, or a `user` message made of `<tool_response>` blocks (Hermes results in text).
   */
  results: ChatMessage[];
  /** Where each of {@link results} sits in the source messages. */
  indices: number[];
}

/** The source's assistant message of turn `turn` and the tool results that follow it (see {@link SourceTurnStep}). */
export function sourceTurnStep(
  messages: readonly ChatMessage[],
  turns: ConversationTurns,
  turn: number,
): SourceTurnStep {
  const start = turns.starts[turn - 1];
  if (start === undefined) throw new RangeError(`turn ${turn} of a conversation of ${turns.starts.length}`);
  const end = turns.starts[turn] ?? messages.length;
  const step: SourceTurnStep = { assistant: messages[start], results: [], indices: [] };
  for (let i = start + 1; i < end; i += 1) {
    const m = messages[i] as ChatMessage;
    if (
      m.role === 'tool' ||
      (m.role === 'user' && /^\s*<tool_response>/.test(m.content) && step.results.length === 0)
    ) {
      step.results.push(m);
      step.indices.push(i);
      if (m.role === 'user') break;
    } else if (m.role !== 'assistant' || step.results.length > 0) {
      break;
    }
  }
  return step;
}

/**
 * Turn `turn`'s history (1-based): the messages before its start, each earlier turn's source
 * assistant message replaced by `regenerated[j]` and the source's continuation assistant
 * messages left out. Where `results[j]` is given, it takes the place of the source's tool
 * results of turn j + 1 (see {@link sourceTurnStep}): the results matched to, or executed for,
 * the calls that turn's regenerated answer made.
 */
export function turnHistory(
  messages: readonly ChatMessage[],
  turns: ConversationTurns,
  turn: number,
  regenerated: readonly ChatMessage[],
  results: readonly (readonly ChatMessage[] | undefined)[] = [],
): ChatMessage[] {
  const end = turns.starts[turn - 1];
  if (end === undefined) throw new RangeError(`turn ${turn} of a conversation of ${turns.starts.length}`);
  const replaced = new Map<number, readonly ChatMessage[] | null>();
  for (const [j, r] of results.entries()) {
    if (r === undefined || j + 1 >= turn) continue;
    const step = sourceTurnStep(messages, turns, j + 1);
    const at = step.indices[0];
    if (at === undefined) {
      // The source answered where the regenerated turn called: its results go right after the answer.
      replaced.set(turns.starts[j] as number, r);
    } else {
      for (const i of step.indices) replaced.set(i, null);
      replaced.set(at, r);
    }
  }
  const out: ChatMessage[] = [];
  let j = 0;
  for (let i = 0; i < end; i += 1) {
    const m = messages[i] as ChatMessage;
    if (m.role === 'assistant') {
      if (turns.starts[j] === i) {
        const answer = regenerated[j];
        if (answer === undefined) throw new RangeError(`turn ${j + 1} has no regenerated answer`);
        out.push(answer);
        j += 1;
        const after = replaced.get(i);
        if (after !== undefined && after !== null) out.push(...after);
      }
      continue;
    }
    const r = replaced.get(i);
    if (r === undefined) out.push(m);
    else if (r !== null) out.push(...r);
  }
  return out;
}
