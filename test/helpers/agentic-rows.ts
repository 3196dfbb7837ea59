// The training rows of agentic conversations (`turns: all` with tools) checked against the token
// ids: what the model generated — its calls included — is supervised, the rest is not. In a
// conversation row (every later turn spliced) each turn's output is 1, and after an output that
// ended its turn, the end-of-turn token and the template's suffix; in a turn's row of its own the
// turn's output (and its end of turn) is 1, its history 0. Found in the ids, independently of the
// spans: the system block with the `<tools>` schemas, every `<tool_response>` … `</tool_response>`
// span, every non-assistant message and every assistant header are 0.
import { expect } from 'vitest';

import type { ChatTokenizer } from '../../src/shared/index.js';

/** A turn record of an agentic conversation (the keys these checks read). */
export interface AgenticRowTurn {
  id: string;
  conversation_id: string;
  turn: number;
  turns: number;
  prompt_ids: number[];
  output_ids: number[];
  history_outputs?: [number, number][];
  finish_reason: { type: string };
}

/** A training row (the keys these checks read). */
export interface AgenticRow {
  id: string;
  input_ids: number[];
  loss_mask: number[];
}

/** What {@link expectAgenticRowMasks} found. */
export interface AgenticRowCounts {
  /** Rows of whole conversations. */
  conversationRows: number;
  /** Rows of one turn each. */
  turnRows: number;
  /** Generated outputs found supervised (every turn of a conversation row, the last of a turn's row). */
  supervisedOutputs: number;
  /** `<tool_call>` tokens at mask 1. */
  supervisedCalls: number;
  /** `<tool_response>` spans found at mask 0. */
  toolResponses: number;
  /** Rows whose system block holds the `<tools>` schemas (at mask 0). */
  toolSchemaBlocks: number;
}

function idOf(tok: ChatTokenizer, token: string): number {
  const id = tok.tokenToId(token);
  if (id === undefined) throw new Error(`the tokenizer has no token ${token}`);
  return id;
}

function allZero(mask: readonly number[], from: number, to: number): boolean {
  for (let i = from; i < to; i += 1) if (mask[i] !== 0) return false;
  return true;
}

/**
 * Checks every row of an agentic dataset against the turn records it was made of (see the module
 * comment). `records` are the dataset's generation records; a row id with `#t<k>` is that turn's
 * row, any other is the row of the conversation of that id, made of its last turn.
 * `keepTruncated` is the run's `postprocess.keepTruncated`.
 */
export function expectAgenticRowMasks(
  tok: ChatTokenizer,
  rows: readonly AgenticRow[],
  records: readonly AgenticRowTurn[],
  opts: { keepTruncated?: boolean } = {},
): AgenticRowCounts {
  const imStart = idOf(tok, '<|im_start|>');
  const imEnd = idOf(tok, '<|im_end|>');
  const toolResponse = idOf(tok, '<tool_response>');
  const toolResponseEnd = idOf(tok, '</tool_response>');
  const toolCall = idOf(tok, '<tool_call>');
  const suffix = tok.encode('\n');
  const emptyThink = tok.encode('<think>\n\n</think>\n\n');
  const assistantHeader = tok.encode('assistant\n');
  const byId = new Map(records.map((r) => [r.id, r]));
  const lastTurn = new Map(records.filter((r) => r.turn === r.turns).map((r) => [r.conversation_id, r]));
  const counts: AgenticRowCounts = {
    conversationRows: 0,
    turnRows: 0,
    supervisedOutputs: 0,
    supervisedCalls: 0,
    toolResponses: 0,
    toolSchemaBlocks: 0,
  };

  for (const row of rows) {
    const ids = row.input_ids;
    const mask = row.loss_mask;
    expect(mask, row.id).toHaveLength(ids.length);
    const isTurnRow = /#t\d+$/.test(row.id);
    const last = isTurnRow ? byId.get(row.id) : lastTurn.get(row.id);
    if (last === undefined) throw new Error(`row ${row.id} has no turn record`);
    const expected = new Array<number>(ids.length).fill(0);
    // An output at 1, less any empty think block in it (never supervised); its end of turn and
    // the template's suffix at 1 when the model ended the turn, else what follows it stays 0.
    const supervise = (start: number, output: readonly number[], what: string): void => {
      expect(ids.slice(start, start + output.length), `${row.id}: ${what} is the turn's output_ids`).toEqual(output);
      expected.fill(1, start, start + output.length);
      for (let i = 0; i + emptyThink.length <= output.length; i += 1)
        if (emptyThink.every((id, k) => output[i + k] === id))
          expected.fill(0, start + i, start + i + emptyThink.length);
      const end = start + output.length;
      if (output.at(-1) === imEnd && suffix.every((id, k) => ids[end + k] === id))
        expected.fill(1, end, end + suffix.length);
      counts.supervisedOutputs += 1;
    };
    const promptLength = last.prompt_ids.length;
    expect(ids.slice(0, promptLength), `${row.id} starts with its last turn's prompt`).toEqual(last.prompt_ids);
    if (isTurnRow) {
      counts.turnRows += 1;
    } else {
      counts.conversationRows += 1;
      const spans = last.history_outputs ?? [];
      expect(spans, `${row.id}: every earlier turn spliced`).toHaveLength(last.turn - 1);
      for (const [k, [start, length]] of spans.entries()) {
        const turn = byId.get(`${last.conversation_id}#t${k + 1}`);
        if (turn === undefined) throw new Error(`${row.id}: turn ${k + 1} has no record`);
        expect(length, `${row.id} turn ${k + 1}`).toBe(turn.output_ids.length);
        // A cut-off turn is context unless `postprocess.keepTruncated` (it is no row of its own then).
        const cut = turn.finish_reason.type === 'length' || turn.finish_reason.type === 'abort';
        if (!cut || opts.keepTruncated === true) supervise(start, turn.output_ids, `turn ${k + 1}`);
      }
    }
    supervise(promptLength, last.output_ids, `turn ${last.turn}`);
    // The rule, position by position.
    const wrong = mask.flatMap((m, i) => (m === expected[i] ? [] : [i]));
    expect(wrong, `${row.id}: positions whose mask breaks the rule`).toEqual([]);

    // Found in the ids alone: messages that are not the model's own, and the headers, are 0.
    for (let i = ids.indexOf(imStart); i >= 0; i = ids.indexOf(imStart, i + 1)) {
      const end = ids.indexOf(imEnd, i);
      const close = end < 0 ? ids.length : end + 1 + suffix.length;
      const header = ids.slice(i + 1, i + 1 + assistantHeader.length);
      if (assistantHeader.every((id, k) => header[k] === id)) {
        expect(allZero(mask, i, i + 1 + assistantHeader.length), `${row.id}: assistant header at ${i}`).toBe(true);
        continue;
      }
      expect(allZero(mask, i, close), `${row.id}: ${tok.decode(ids.slice(i + 1, i + 3))} message at ${i}`).toBe(true);
      if (i === 0) {
        const system = tok.decode(ids.slice(0, close), { skipSpecialTokens: false });
        expect(system, `${row.id}: the system block`).toMatch(/^<\|im_start\|>system\n/);
        if (system.includes('<tools>') && system.includes('</tools>')) counts.toolSchemaBlocks += 1;
      }
    }
    for (let i = ids.indexOf(toolResponse); i >= 0; i = ids.indexOf(toolResponse, i + 1)) {
      const end = ids.indexOf(toolResponseEnd, i);
      expect(end, `${row.id}: <tool_response> at ${i} is closed`).toBeGreaterThan(i);
      expect(allZero(mask, i, end + 1), `${row.id}: <tool_response> at ${i}`).toBe(true);
      counts.toolResponses += 1;
    }
    for (let i = ids.indexOf(toolCall); i >= 0; i = ids.indexOf(toolCall, i + 1))
      if (mask[i] === 1) counts.supervisedCalls += 1;
  }
  return counts;
}
