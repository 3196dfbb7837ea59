/**
 * The turn records of conversations regenerated turn by turn (`turns: all`), gathered per
 * conversation for the SpecForge export: one line per conversation, its whole regenerated
 * history, rather than one per turn.
 */
import type { GenerationRecord } from '../../workers/index.js';

/** Which conversation and turn a record is, and its prompt line's id (the conversation id less a `#s<j>` sample suffix). */
export interface TurnKey {
  conversationId: string;
  turn: number;
  promptId: string;
}

/** The conversation keys of a generation line, or undefined for a record that is not a turn. */
export function turnOf(text: string): TurnKey | undefined {
  if (!text.includes('"conversation_id"')) return undefined;
  const v = JSON.parse(text) as { conversation_id?: unknown; turn?: unknown };
  if (typeof v.conversation_id !== 'string' || typeof v.turn !== 'number') return undefined;
  return { conversationId: v.conversation_id, turn: v.turn, promptId: v.conversation_id.replace(/#s\d+$/, '') };
}

/** One gathered turn. */
export interface GatheredTurn {
  turn: number;
  record: GenerationRecord;
  file: string;
  line: number;
}

/** Turn records by conversation (memory: the records of one export partition). */
export class ConversationTurns {
  readonly byConversation = new Map<string, { promptId: string; turns: GatheredTurn[] }>();

  add(key: TurnKey, record: GenerationRecord, file: string, line: number): void {
    let c = this.byConversation.get(key.conversationId);
    if (c === undefined) {
      c = { promptId: key.promptId, turns: [] };
      this.byConversation.set(key.conversationId, c);
    }
    c.turns.push({ turn: key.turn, record, file, line });
  }
}
