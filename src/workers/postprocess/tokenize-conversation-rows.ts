/**
 * `postprocess.rows: conversation` for datasets regenerated turn by turn (`turns: all`;
 * docs/multi-turn.md): one training row per conversation, every generated turn supervised,
 * where the conversation's history is an exact continuation — every turn after the first was
 * spliced from the previous turn's ids, so the last turn's `prompt_ids` hold each earlier output
 * as it was generated (its record's `history_outputs`: `[start, length]` per earlier turn).
 *
 * The row is the last turn's row (`recordToRow`: prompt, output, end-of-turn suffix) with, in
 * addition, each earlier output supervised, with the template's end-of-turn token and suffix after
 * it (the template's own when the output was cut off): SpecForge's rule on the regenerated
 * conversation with every assistant turn trained. Its id is the conversation's id.
 *
 * Which conversations: those whose last turn (`turn` = `turns`) is among the lines read with its
 * `history_outputs`, found by a first pass over the same lines. Their other turns make no row of
 * their own; every other conversation (ended early, cut by the budget, or rendered from text)
 * keeps one row per turn.
 */
import path from 'node:path';
import { stat } from 'node:fs/promises';

import type { TokenizeContext, TokenizedRow } from './tokenize-context.js';
import { linesFrom, type FileStart } from './generation-offsets.js';
import {
  ignorableIds,
  listGenerationFiles,
  parseGenerationRecord,
  recordToRow,
  unsuperviseIgnorable,
  type GenerationRecord,
  type WholeConversationRows,
} from './tokenize-records.js';

/** The conversation fields of a turn's record. */
export interface TurnFields {
  conversationId: string;
  turn: number;
  turns: number;
  historyOutputs: [number, number][] | undefined;
}

/** The conversation fields of a parsed generation line, or undefined for a record that is not a turn. */
export function turnFields(value: unknown): TurnFields | undefined {
  const v = value as { conversation_id?: unknown; turn?: unknown; turns?: unknown; history_outputs?: unknown };
  if (typeof v.conversation_id !== 'string' || typeof v.turn !== 'number' || typeof v.turns !== 'number')
    return undefined;
  const h = v.history_outputs;
  const spans =
    Array.isArray(h) &&
    h.every((s) => Array.isArray(s) && s.length === 2 && s.every((n) => Number.isInteger(n) && (n as number) >= 0))
      ? (h as [number, number][])
      : undefined;
  return { conversationId: v.conversation_id, turn: v.turn, turns: v.turns, historyOutputs: spans };
}

/**
 * The conversations of the lines a round reads (each file from `resume`'s start, as
 * `rowsFromGenerations` reads them) whose last turn is there with a full `history_outputs`.
 * Only last turns are parsed: a line is looked at only when it holds `"history_outputs"`.
 */
export async function conversationsWithRows(
  dir: string,
  resume: ReadonlyMap<string, FileStart> | undefined,
  ctx: TokenizeContext,
  dataset: string | undefined,
): Promise<Set<string>> {
  const out = new Set<string>();
  for (const file of await listGenerationFiles(dir)) {
    const start = resume?.get(path.basename(file)) ?? { bytes: 0, lines: 0 };
    if (start.bytes > 0 && (await stat(file)).size === start.bytes) continue;
    const reader = linesFrom(file, start);
    for (;;) {
      const next = await reader.next();
      if (next.done === true) break;
      const { text } = next.value;
      if (!text.includes('"history_outputs"')) continue;
      try {
        const value: unknown = JSON.parse(text);
        const t = turnFields(value);
        if (t === undefined || t.turn !== t.turns || t.historyOutputs?.length !== t.turn - 1) continue;
        // Only a last turn that makes a row: else the conversation keeps its rows per turn.
        const record = parseGenerationRecord(value, ctx.tokenizer.vocabSize);
        if (conversationRow(record, t, ctx, dataset) !== undefined) out.add(t.conversationId);
      } catch {
        continue; // an invalid line: counted by the main pass
      }
    }
  }
  return out;
}

/**
 * The conversation row of a conversation's last turn, or undefined when its `history_outputs`
 * do not fit its prompt ids (then its turns are rows of their own).
 */
export function conversationRow(
  record: GenerationRecord,
  t: TurnFields,
  ctx: TokenizeContext,
  dataset: string | undefined,
): TokenizedRow | undefined {
  const outcome = recordToRow(record, ctx, dataset);
  if (outcome.status === 'dropped' || t.historyOutputs === undefined) return undefined;
  const { row } = outcome;
  const prompt = record.prompt_ids;
  const mask = row.loss_mask;
  const eot = ctx.format.endOfTurnTokenId;
  const suffix = ctx.format.suffixIds;
  const ignorable = ignorableIds(ctx);
  for (const [start, length] of t.historyOutputs) {
    let end = start + length;
    if (length === 0 || end > prompt.length) return undefined;
    // The turn's close: its own end-of-turn token, or the template's after a cut-off output.
    if (prompt[end - 1] !== eot && prompt[end] === eot) end += 1;
    if (prompt[end - 1] === eot && suffix.every((id, i) => prompt[end + i] === id)) end += suffix.length;
    mask.fill(1, start, end);
    unsuperviseIgnorable(prompt.slice(start, start + length), start, ignorable, mask);
  }
  return { ...row, id: t.conversationId };
}

/**
 * The {@link WholeConversationRows} of a round's lines: a first pass finds the conversations that
 * make one row ({@link conversationsWithRows}); undefined when none does.
 */
export async function wholeConversationRows(
  dir: string,
  resume: ReadonlyMap<string, FileStart> | undefined,
  ctx: TokenizeContext,
  dataset: string | undefined,
): Promise<WholeConversationRows | undefined> {
  const ids = await conversationsWithRows(dir, resume, ctx, dataset);
  if (ids.size === 0) return undefined;
  return {
    wholeOf: (value) => {
      const t = turnFields(value);
      return t !== undefined && ids.has(t.conversationId)
        ? { conversationId: t.conversationId, last: t.turn === t.turns }
        : undefined;
    },
    row: (record, value) => {
      const t = turnFields(value);
      return t === undefined ? undefined : conversationRow(record, t, ctx, dataset);
    },
  };
}
