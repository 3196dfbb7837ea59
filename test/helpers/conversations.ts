// Multi-turn conversation files for the `turns: all` tests, and checks of their records.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { expect } from 'vitest';

import {
  answerMessage,
  conversationTurns,
  parseChatMessage,
  turnHistory,
  type ChatMessage,
  type ChatTokenizer,
} from '../../src/shared/index.js';

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

/** The source conversations of a `{"id","messages"}` JSONL file, by id, as the producer parses them. */
export function readConversationFile(file: string): Map<string, ChatMessage[]> {
  const out = new Map<string, ChatMessage[]>();
  for (const line of readFileSync(file, 'utf8').trim().split('\n')) {
    const rec = JSON.parse(line) as { id: string; messages: unknown[] };
    out.set(
      rec.id,
      rec.messages.map((m, i) => parseChatMessage(m, `messages[${i}]`)),
    );
  }
  return out;
}

/**
 * Each conversation's records are turns 1, 2, … without a gap (all its turns when `complete`),
 * never carry the source's answers, and each turn k ≥ 2's prompt is the template's rendering of
 * the history of the turns before it as written (spliced: the previous turn's prompt_ids +
 * output_ids, then the rest, decoding to that rendering; else the rendering encoded). A prompt
 * built on an answer other than the one on disk fails this. Returns the number of spliced turns.
 */
export function expectTurnChains(
  tok: ChatTokenizer,
  source: ReadonlyMap<string, ChatMessage[]>,
  convs: ReadonlyMap<string, TurnRecord[]>,
  opts: {
    complete?: boolean;
    /** Check that a spliced prompt decodes to the rendering (default true; a random model's ids may not decode back). */
    decodes?: boolean;
  } = {},
): number {
  let spliced = 0;
  for (const [id, turns] of convs) {
    const messages = source.get(id);
    if (messages === undefined) throw new Error(`conversation ${id} is not in the source`);
    const shape = conversationTurns(messages);
    if (typeof shape === 'string') throw new Error(`conversation ${id}: ${shape}`);
    const n = opts.complete === true ? shape.starts.length : turns.length;
    expect(
      turns.map((t) => t.turn),
      id,
    ).toEqual(Array.from({ length: n }, (_, k) => k + 1));
    for (const t of turns) {
      expect(t.id).toBe(`${id}#t${t.turn}`);
      expect(t.turns, t.id).toBe(shape.starts.length);
      expect(tok.decode(t.prompt_ids), t.id).not.toContain(SOURCE_ANSWER);
      if (t.turn === 1) continue;
      const answers = turns.slice(0, t.turn - 1).map((p) => answerMessage(tok, p.output_ids));
      const history = turnHistory(messages, shape, t.turn, answers);
      if (t.spliced) {
        spliced += 1;
        const prev = turns[t.turn - 2] as TurnRecord;
        expect(t.prompt_ids.slice(0, prev.prompt_ids.length + prev.output_ids.length), t.id).toEqual([
          ...prev.prompt_ids,
          ...prev.output_ids,
        ]);
        if (opts.decodes !== false)
          expect(tok.decode(t.prompt_ids, { skipSpecialTokens: false }), t.id).toBe(
            tok.applyChatTemplate(history, { addGenerationPrompt: true }),
          );
      } else {
        expect(t.prompt_ids, `${t.id} rendered from the history written`).toEqual(tok.encodePrompt(history));
      }
    }
  }
  return spliced;
}
