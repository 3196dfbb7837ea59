/**
 * `postprocess.rows: conversation` for datasets regenerated turn by turn (`turns: all`;
 * docs/multi-turn.md): one training row per conversation, every generated turn supervised,
 * where the conversation's history is an exact continuation — every turn after the first was
 * spliced from the previous turn's ids, so the last turn's `prompt_ids` hold each earlier output
 * as it was generated (its record's `history_outputs`: `[start, length]` per earlier turn).
 *
 * The row is the last turn's row (`recordToRow`: prompt, output, end-of-turn suffix) with, in
 * addition, each earlier output supervised as its row of its own would be (DESIGN invariant 13:
 * only what the model produced, ended as the model ended it):
 *
 * - an output that ends with the template's end-of-turn token (the model ended its turn) is
 *   supervised with that token and the suffix the template writes after it;
 * - an output cut off without it (finish_reason `length`, `abort` — e.g. `budget: strict` —, or a
 *   matched stop string) is followed in the history by the template's own end of turn: that close
 *   is never supervised (mask 0);
 * - an output whose generation was cut by `length` or `abort` is supervised only with
 *   `postprocess.keepTruncated` (without it, it is context, as it is no row of its own then).
 *
 * How each earlier turn finished comes from its own record (`finish_reason`), among the lines the
 * round reads; a turn read in an earlier round is judged by its ids (ending with the end-of-turn
 * token: ended by the model; else cut, supervised only with `keepTruncated`).
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

/** How a turn's generation finished: `finish_reason.type` of its record. */
export type TurnFinish = 'stop' | 'length' | 'abort';

/** How each earlier turn of a conversation finished, by turn (1-based); undefined when not known. */
export type TurnFinishOf = (turn: number) => TurnFinish | undefined;

/** One earlier turn's place in a conversation row and what of it is supervised (see the module comment). */
export interface EarlierTurnSpan {
  turn: number;
  /** Where its output starts and ends in the last turn's `prompt_ids`. */
  start: number;
  outputEnd: number;
  /** Where what the history holds after it ends: its end-of-turn token and suffix (the model's or the template's). */
  closeEnd: number;
  /** The output ends with the template's end-of-turn token: the model ended its turn. */
  closedByModel: boolean;
  /** Its output is supervised (a row of its own would keep it). */
  supervised: boolean;
}

const FINISH_TYPES: readonly string[] = ['stop', 'length', 'abort'];

/** The `finish_reason.type` of a parsed generation line, or undefined. */
export function finishTypeOf(value: unknown): TurnFinish | undefined {
  const f = (value as { finish_reason?: { type?: unknown } } | null)?.finish_reason;
  const type = f?.type;
  return typeof type === 'string' && FINISH_TYPES.includes(type) ? (type as TurnFinish) : undefined;
}

/**
 * The earlier turns of conversation row `record` (the last turn's record, `t` its fields), each
 * with what is supervised; undefined when its `history_outputs` do not fit its prompt ids.
 */
export function earlierTurnSpans(
  record: GenerationRecord,
  t: TurnFields,
  ctx: TokenizeContext,
  finishOf: TurnFinishOf = () => undefined,
): EarlierTurnSpan[] | undefined {
  if (t.historyOutputs === undefined) return undefined;
  const prompt = record.prompt_ids;
  const eot = ctx.format.endOfTurnTokenId;
  const suffix = ctx.format.suffixIds;
  const spans: EarlierTurnSpan[] = [];
  for (const [i, [start, length]] of t.historyOutputs.entries()) {
    const outputEnd = start + length;
    if (length === 0 || outputEnd > prompt.length) return undefined;
    const closedByModel = prompt[outputEnd - 1] === eot;
    // What follows the output: its own end-of-turn token, or the template's after a cut-off output.
    let closeEnd = outputEnd;
    if (!closedByModel && prompt[closeEnd] === eot) closeEnd += 1;
    if (prompt[closeEnd - 1] === eot && suffix.every((id, k) => prompt[closeEnd + k] === id)) closeEnd += suffix.length;
    const finish = finishOf(i + 1);
    // A stopped output is a row of its own; a cut one only with keepTruncated. Not known (read in
    // an earlier round): one that ended its turn stopped, any other may have been cut.
    const stopped = finish === undefined ? closedByModel : finish === 'stop';
    spans.push({
      turn: i + 1,
      start,
      outputEnd,
      closeEnd,
      closedByModel,
      supervised: stopped || ctx.keepTruncated,
    });
  }
  return spans;
}

/**
 * The conversations of the lines a round reads (each file from `resume`'s start, as
 * `rowsFromGenerations` reads them) whose last turn is there with a full `history_outputs`, and
 * how each of their turns finished. Only turns of a spliced chain are parsed: a line is looked at
 * only when it holds `"history_outputs"`.
 */
export async function conversationsWithRows(
  dir: string,
  resume: ReadonlyMap<string, FileStart> | undefined,
  ctx: TokenizeContext,
  dataset: string | undefined,
): Promise<{ ids: Set<string>; finishes: Map<string, (TurnFinish | undefined)[]> }> {
  const out = new Set<string>();
  const finishes = new Map<string, (TurnFinish | undefined)[]>();
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
        if (t === undefined) continue;
        if (t.turn < t.turns) {
          // How an earlier turn finished; the first line of a turn wins, as in the main pass.
          const list = finishes.get(t.conversationId) ?? [];
          if (list[t.turn - 1] === undefined) list[t.turn - 1] = finishTypeOf(value);
          finishes.set(t.conversationId, list);
          continue;
        }
        if (t.turn !== t.turns || t.historyOutputs?.length !== t.turn - 1) continue;
        // Only a last turn that makes a row: else the conversation keeps its rows per turn.
        const record = parseGenerationRecord(value, ctx.tokenizer.vocabSize);
        if (conversationRow(record, t, ctx, dataset) !== undefined) out.add(t.conversationId);
      } catch {
        continue; // an invalid line: counted by the main pass
      }
    }
  }
  for (const id of finishes.keys()) if (!out.has(id)) finishes.delete(id);
  return { ids: out, finishes };
}

/**
 * The conversation row of a conversation's last turn, or undefined when its `history_outputs`
 * do not fit its prompt ids (then its turns are rows of their own). `finishOf` tells how each
 * earlier turn finished (see the module comment for what is supervised).
 */
export function conversationRow(
  record: GenerationRecord,
  t: TurnFields,
  ctx: TokenizeContext,
  dataset: string | undefined,
  finishOf?: TurnFinishOf,
): TokenizedRow | undefined {
  const outcome = recordToRow(record, ctx, dataset);
  if (outcome.status === 'dropped') return undefined;
  const spans = earlierTurnSpans(record, t, ctx, finishOf);
  if (spans === undefined) return undefined;
  const { row } = outcome;
  const prompt = record.prompt_ids;
  const mask = row.loss_mask;
  const ignorable = ignorableIds(ctx);
  for (const s of spans) {
    if (!s.supervised) continue;
    // A close the template wrote after a cut-off output stays context.
    mask.fill(1, s.start, s.closedByModel ? s.closeEnd : s.outputEnd);
    unsuperviseIgnorable(prompt.slice(s.start, s.outputEnd), s.start, ignorable, mask);
  }
  return { ...row, id: t.conversationId };
}

/**
 * The {@link WholeConversationRows} of a round's lines: a first pass finds the conversations that
 * make one row, and how their turns finished ({@link conversationsWithRows}); undefined when none does.
 */
export async function wholeConversationRows(
  dir: string,
  resume: ReadonlyMap<string, FileStart> | undefined,
  ctx: TokenizeContext,
  dataset: string | undefined,
): Promise<WholeConversationRows | undefined> {
  const { ids, finishes } = await conversationsWithRows(dir, resume, ctx, dataset);
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
      if (t === undefined) return undefined;
      const list = finishes.get(t.conversationId);
      return conversationRow(record, t, ctx, dataset, (turn) => list?.[turn - 1]);
    },
  };
}
