// Multi-turn conversation files for the `turns: all` tests, and checks of their records.
import { writeFileSync } from 'node:fs';
import path from 'node:path';

/** The source's assistant text: it must never reach a prompt. */
export const SOURCE_ANSWER = 'SOURCE-ANSWER-NEVER-SENT';

/** `n` conversations of `turns` user turns each (with the source's answers), plus `extra` lines, as a JSONL file. */
export function writeConversations(
  dir: string,
  name: string,
  n: number,
  turns: number,
  extra: readonly object[] = [],
): string {
  const lines: string[] = [];
  for (let i = 0; i < n; i += 1) {
    const messages: object[] = i % 2 === 0 ? [{ role: 'system', content: `You are helper ${i}.` }] : [];
    for (let k = 1; k <= turns; k += 1) {
      messages.push({ role: 'user', content: `Conversation ${i}, question ${k}: tell me about topic ${i * 7 + k}.` });
      messages.push({ role: 'assistant', content: `${SOURCE_ANSWER} ${i}.${k}` });
    }
    lines.push(JSON.stringify({ id: `${name}-${i}`, messages }));
  }
  for (const e of extra) lines.push(JSON.stringify(e));
  const file = path.join(dir, `${name}.jsonl`);
  writeFileSync(file, `${lines.join('\n')}\n`);
  return file;
}

/** A generation record of a turn (the keys these tests read). */
export interface TurnRecord {
  id: string;
  conversation_id: string;
  turn: number;
  turns: number;
  spliced: boolean;
  prompt_ids: number[];
  output_ids: number[];
  prompt_tokens?: number;
  finish_reason: string;
}

/** Records grouped by conversation, each list in turn order. */
export function byConversation(records: readonly TurnRecord[]): Map<string, TurnRecord[]> {
  const out = new Map<string, TurnRecord[]>();
  for (const r of records) {
    const list = out.get(r.conversation_id) ?? [];
    list.push(r);
    out.set(r.conversation_id, list);
  }
  for (const list of out.values()) list.sort((a, b) => a.turn - b.turn);
  return out;
}
