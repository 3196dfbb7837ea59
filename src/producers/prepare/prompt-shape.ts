/**
 * A source row's turns turned into a prompt to answer: every turn normalized as the prompt
 * file reader will read it back, and the turns after the last user turn (the answer the
 * source recorded, tool results after it) dropped.
 */
import { conversationTurns, errorMessage, parseChatMessage, type ChatMessage } from '../../shared/index.js';
import type { SourceMessage } from './source-types.js';

/** What a row's turns make: a prompt, nothing to answer (`empty`), or turns that cannot be read. */
export type ShapedPrompt =
  | { kind: 'prompt'; messages: ChatMessage[]; droppedTrailing: number }
  | { kind: 'empty'; reason: string }
  | { kind: 'malformed'; reason: string };

/**
 * The prompt of a row: its turns up to and including the last user turn, `system` and earlier
 * turns kept. A row with no user turn, or whose last user turn is blank, is `empty` (the
 * prompt file reader would reject it).
 */
export function shapePrompt(turns: readonly SourceMessage[], mode: 'last' | 'all'): ShapedPrompt {
  const messages: ChatMessage[] = [];
  for (const [i, turn] of turns.entries()) {
    try {
      messages.push(parseChatMessage(turn, `messages[${i}]`));
    } catch (e: unknown) {
      return { kind: 'malformed', reason: errorMessage(e) };
    }
  }
  if (mode === 'all') {
    // Regenerated turn by turn: the whole conversation is kept; its shape is checked here so a
    // row the producer would reject is counted now, with its reason.
    if (messages.length === 0) return { kind: 'empty', reason: 'no turns' };
    const shape = conversationTurns(messages);
    if (typeof shape === 'string')
      return shape === 'the conversation has no user turn'
        ? { kind: 'empty', reason: 'no user turn' }
        : { kind: 'malformed', reason: shape };
    return { kind: 'prompt', messages, droppedTrailing: 0 };
  }
  const lastUser = messages.map((m) => m.role).lastIndexOf('user');
  if (lastUser < 0) return { kind: 'empty', reason: messages.length === 0 ? 'no turns' : 'no user turn' };
  const kept = messages.slice(0, lastUser + 1);
  if (kept[lastUser]?.content.trim() === '') return { kind: 'empty', reason: 'the user turn to answer is empty' };
  return { kind: 'prompt', messages: kept, droppedTrailing: messages.length - kept.length };
}

/** One line of a prompt file (without its newline), with the record's tool schemas when it has some. */
export function promptLine(id: string, messages: readonly ChatMessage[], tools?: readonly unknown[]): string {
  return JSON.stringify(tools === undefined ? { id, messages } : { id, messages, tools });
}
