// Agentic conversation files for the `turns: all` tests with tools, and the checks of their
// records: every turn's prompt is the rendering (with the record's tools) of the history its
// committed turns make — their answers with their calls, and after each call exactly the results
// that answer it — and no source assistant content is ever sent.
import { writeFileSync } from 'node:fs';
import path from 'node:path';

import { expect } from 'vitest';

import {
  answerMessage,
  answerTextWithSpecials,
  conversationTurns,
  parseChatMessage,
  parseToolCalls,
  sourceTurnStep,
  turnHistory,
  type ChatMessage,
  type ChatTokenizer,
  type ToolCallFormat,
} from '../../src/shared/index.js';
import { agentPlan } from '../../src/sim/index.js';
import { SOURCE_ANSWER, type TurnRecord } from './conversations.js';

export const AGENT_TOOLS = ['run_shell', 'read_file', 'edit_file', 'submit'].map((name) => ({
  type: 'function',
  function: {
    name,
    description: `The ${name.replace('_', ' ')} tool.`,
    parameters: {
      type: 'object',
      properties: { arg: { type: 'string', description: 'What to act on.' } },
      required: ['arg'],
    },
  },
}));

/** A record of an agentic conversation file. */
export interface AgenticRecord {
  id: string;
  messages: unknown[];
  tools: unknown[];
}

/**
 * `n` agentic conversations: a user task, then the rounds of calls the simulated model's own plan
 * makes for it (`agentPlan`, so that a regeneration makes the source's calls but where the
 * simulator's rates perturb them), each answered by the source's results, then a final answer.
 * `parallel` must be the simulator's rate of parallel rounds.
 */
export function agenticRecords(name: string, n: number, parallel: number): AgenticRecord[] {
  const names = AGENT_TOOLS.map((t) => t.function.name);
  const out: AgenticRecord[] = [];
  for (let i = 0; i < n; i += 1) {
    const request = `Task ${i}: fix the failing test in module ${i % 5} (case ${i * 7}).`;
    const messages: unknown[] = [
      { role: 'system', content: 'You are a software engineering agent. Use the tools.' },
      { role: 'user', content: request },
    ];
    for (const [s, round] of agentPlan(request, names, parallel).entries()) {
      const calls = round.map((fn, j) => ({
        id: `src_${i}_${s}_${j}`,
        type: 'function',
        function: { name: fn, arguments: JSON.stringify({ arg: `${SOURCE_ANSWER} ${i}.${s}.${j}` }) },
      }));
      messages.push({ role: 'assistant', content: '', tool_calls: calls });
      for (const c of calls)
        messages.push({ role: 'tool', tool_call_id: c.id, content: `source result of ${c.function.name} ${i}.${s}` });
    }
    messages.push({ role: 'assistant', content: `${SOURCE_ANSWER} final ${i}` });
    out.push({ id: `${name}-${i}`, messages, tools: AGENT_TOOLS });
  }
  return out;
}

export function writeAgentic(dir: string, name: string, records: readonly AgenticRecord[]): string {
  const file = path.join(dir, `${name}.jsonl`);
  writeFileSync(file, `${records.map((r) => JSON.stringify(r)).join('\n')}\n`);
  return file;
}

/** A turn record of an agentic conversation (the keys these checks read). */
export interface AgenticTurnRecord extends TurnRecord {
  tool_results?: { origin: 'source' | 'executor'; messages: ChatMessage[] };
}

/**
 * Checks each conversation's turn records against its source (see the module comment). Returns
 * how many turns had results placed after their calls, by origin.
 */
export function expectAgenticChains(
  tok: ChatTokenizer,
  format: ToolCallFormat,
  source: ReadonlyMap<string, AgenticRecord>,
  convs: ReadonlyMap<string, AgenticTurnRecord[]>,
): { source: number; executor: number } {
  const placed = { source: 0, executor: 0 };
  for (const [id, turns] of convs) {
    const rec = source.get(id);
    if (rec === undefined) throw new Error(`conversation ${id} is not in the source`);
    const messages = rec.messages.map((m, i) => parseChatMessage(m, `messages[${i}]`));
    const shape = conversationTurns(messages);
    if (typeof shape === 'string') throw new Error(`conversation ${id}: ${shape}`);
    expect(
      turns.map((t) => t.turn),
      id,
    ).toEqual(Array.from({ length: turns.length }, (_, k) => k + 1));
    const answers: ChatMessage[] = [];
    const results: (ChatMessage[] | undefined)[] = [];
    for (const t of turns) {
      expect(tok.decode(t.prompt_ids), `${t.id}: no source assistant content sent`).not.toContain(SOURCE_ANSWER);
      if (t.turn > 1) {
        const prev = turns[t.turn - 2] as AgenticTurnRecord;
        const parsed = parseToolCalls(format, answerTextWithSpecials(tok, prev.output_ids), { turn: prev.turn });
        if (!parsed.ok) throw new Error(`${prev.id}: a turn followed by another has calls that do not parse`);
        const got = t.tool_results;
        if (parsed.calls.length === 0) {
          expect(got, `${t.id}: no results after a turn without calls`).toBeUndefined();
        } else {
          // Exactly the results that answer the calls made: one per call, in order, by id and name.
          expect(got, `${t.id}: results after ${prev.id}'s calls`).toBeDefined();
          const msgs = got?.messages ?? [];
          expect(
            msgs.map((m) => m.tool_call_id),
            t.id,
          ).toEqual(parsed.calls.map((c) => c.id));
          for (const [i, m] of msgs.entries())
            if (m.name !== undefined) expect(m.name, t.id).toBe(parsed.calls[i]?.function.name);
          if (got?.origin === 'source') {
            const step = sourceTurnStep(messages, shape, prev.turn);
            expect(
              msgs.map((m) => m.content),
              t.id,
            ).toEqual(step.results.map((m) => m.content));
          }
          placed[got?.origin ?? 'source'] += 1;
        }
        answers.push(
          parsed.calls.length === 0
            ? answerMessage(tok, prev.output_ids)
            : { ...answerMessage(tok, prev.output_ids), content: parsed.content, tool_calls: parsed.calls },
        );
        results.push(got?.messages);
        const history = turnHistory(messages, shape, t.turn, answers, results);
        const text = tok.applyChatTemplate(history, { addGenerationPrompt: true, tools: rec.tools });
        if (t.spliced) {
          expect(t.prompt_ids.slice(0, prev.prompt_ids.length + prev.output_ids.length), t.id).toEqual([
            ...prev.prompt_ids,
            ...prev.output_ids,
          ]);
          expect(tok.decode(t.prompt_ids, { skipSpecialTokens: false }), t.id).toBe(text);
        } else {
          expect(t.prompt_ids, `${t.id} rendered from the history written`).toEqual(tok.encode(text));
        }
      } else {
        expect(t.prompt_ids, `${t.id}: turn 1 rendered with the record's tools`).toEqual(
          tok.encodePrompt(turnHistory(messages, shape, 1, []), { tools: rec.tools }),
        );
      }
    }
  }
  return placed;
}
