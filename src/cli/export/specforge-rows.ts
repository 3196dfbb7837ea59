/**
 * One line of `export --format specforge` per training row: the row's `text` (its ids decoded,
 * special tokens kept: what the target saw and produced, for SpecForge's preformatted mode) and
 * its `conversations` (the messages, for readers that render them), with the counters the
 * export reports. Shared by the single-turn path (specforge.ts) and the turn-by-turn path
 * (specforge-conversations.ts).
 */
import path from 'node:path';

import type { ChatMessage, HfRow, Logger } from '../../shared/index.js';
import type { GenerationRecord, TokenizeContext } from '../../workers/index.js';
import type { DflashRows } from './dflash-rows.js';

/**
 * Which SpecForge setting a row needs: `last-turn` rows supervise their last assistant turn
 * only (`train_only_last_turn: true`: generation records, turns as rows of their own);
 * `all-turns` rows supervise every assistant turn (`train_only_last_turn: false`: conversations
 * regenerated turn by turn made into one row, `postprocess.rows: conversation`).
 */
export type SpecForgeRowKind = 'last-turn' | 'all-turns';

/** The row kinds, in file order (`<out>`, then `<out stem>.all-turns.jsonl`). */
export const SPECFORGE_ROW_KINDS: readonly SpecForgeRowKind[] = ['last-turn', 'all-turns'];

/** One line of the SpecForge export. */
export interface SpecForgeLine {
  id: string;
  dataset: string;
  /** The row's ids decoded with special tokens: SpecForge's `text` column (`data.is_preformatted: true`). */
  text: string;
  /** The prompt's messages and the generated answers (SpecForge's `conversations` column). */
  conversations: ChatMessage[];
  /** The prompt's tool schemas, when it has some: what the template rendered the conversation with. */
  tools?: unknown[];
}

/** Where the export's lines go, by row kind (specforge-files.ts). */
export interface SpecForgeSink {
  write(kind: SpecForgeRowKind, line: SpecForgeLine): Promise<void>;
  /** `--drafter dflash`: rows a DFlash trainer cannot use are left out (dflash-rows.ts). */
  readonly dflash?: DflashRows;
}

/** Counters of one row kind. */
export interface SpecForgeKindStats {
  /** Lines written. */
  rows: number;
  /** Tokens of the longest row (or of its text re-encoded, when that is longer). */
  longest: number;
  /** Rows whose text does not encode back to the row's ids with the configured tokenizer. */
  reencodeDiffers: number;
}

/** At most this many problem examples are kept per dataset. */
export const MAX_EXAMPLES = 10;

/** What the export of one dataset did. */
export interface SpecForgeExportStats {
  dataset: string;
  /** Generation files read. */
  files: number;
  /** Non-blank generation lines read (once per partition counted once). */
  lines: number;
  /** Lines written (rows of both kinds). */
  exported: number;
  /** Of `exported`, by row kind. */
  byKind: Record<SpecForgeRowKind, SpecForgeKindStats>;
  /** Of `exported`: truncated and aborted generations (kept because of `postprocess.keepTruncated`). */
  keptTruncated: number;
  /** Of `exported`: stopped on something else than the template's end-of-turn token. */
  stopWithoutEndOfTurn: number;
  droppedTruncated: number;
  droppedAborted: number;
  droppedEmpty: number;
  /** Rows left out by `--drafter dflash`: fewer than 2 adjacent supervised tokens. */
  dflashLeftOut: number;
  /** Turns that are part of their conversation's row (`postprocess.rows: conversation`): no line of their own. */
  inConversationRows: number;
  /** Records of a sample id seen before (the first wins). */
  duplicates: number;
  /** Lines that are no valid generation record. */
  invalid: number;
  /** Records whose sample id has no line in the prompt file. */
  promptMissing: number;
  /** Records whose prompt line no longer renders to their `prompt_ids`, or no longer parses. */
  promptChanged: number;
  /** The first problems, `file:line: reason`. */
  examples: string[];
  /** The ids of the first rows whose text re-encodes differently. */
  reencodeExamples: string[];
}

/** Fresh zeroed counters of dataset `dataset`. */
export function emptyStats(dataset: string): SpecForgeExportStats {
  const kind = (): SpecForgeKindStats => ({ rows: 0, longest: 0, reencodeDiffers: 0 });
  return {
    dataset,
    files: 0,
    lines: 0,
    exported: 0,
    byKind: { 'last-turn': kind(), 'all-turns': kind() },
    keptTruncated: 0,
    stopWithoutEndOfTurn: 0,
    droppedTruncated: 0,
    droppedAborted: 0,
    droppedEmpty: 0,
    dflashLeftOut: 0,
    inConversationRows: 0,
    duplicates: 0,
    invalid: 0,
    promptMissing: 0,
    promptChanged: 0,
    examples: [],
    reencodeExamples: [],
  };
}

/** Records a problem of `file:line` in `stats.examples` (the first {@link MAX_EXAMPLES}) and the debug log. */
export function noteProblem(
  stats: SpecForgeExportStats,
  log: Logger,
  file: string,
  line: number,
  reason: string,
): void {
  if (stats.examples.length < MAX_EXAMPLES) stats.examples.push(`${path.basename(file)}:${line}: ${reason}`);
  log.debug({ file, line, reason }, 'generation left out of the export');
}

/** Whether two id lists are equal. */
export function sameIds(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** A day, for {@link promptMatches}. */
const DAY_MS = 86_400_000;

/**
 * Whether `messages`, rendered with the generation prompt (and the prompt line's `tools`), are the
 * prompt the record was generated from: the decoded `prompt_ids` equal the rendered text (cheap),
 * or else encoding the rendered text gives the same ids (for tokenizers whose decoding is not the
 * exact inverse).
 *
 * `generatedAt` is when the record was written (its `ts`): a template that writes the date
 * (`strftime_now`, Llama 3.2's `Today Date:`) renders that day, not today's; and, as the prompt
 * was rendered when it was sent, a little before, the day before too when that renders otherwise.
 */
export function promptMatches(
  ctx: TokenizeContext,
  messages: readonly ChatMessage[],
  promptIds: readonly number[],
  generatedAt?: Date,
  tools?: unknown[],
): boolean {
  const render = (now: Date | undefined): string =>
    ctx.tokenizer.applyChatTemplate(messages, {
      addGenerationPrompt: true,
      ...(tools === undefined ? {} : { tools }),
      ...(ctx.templateKwargs === undefined ? {} : { templateKwargs: ctx.templateKwargs }),
      ...(now === undefined ? {} : { now }),
    });
  const matches = (text: string): boolean =>
    ctx.tokenizer.decode(promptIds) === text || sameIds(ctx.tokenizer.encode(text), promptIds);
  const text = render(generatedAt);
  if (matches(text)) return true;
  if (generatedAt === undefined) return false;
  const dayBefore = render(new Date(generatedAt.getTime() - DAY_MS));
  return dayBefore !== text && matches(dayBefore);
}

/** When a generation line says it was written (`ts`), or undefined. */
export function generatedAtOf(value: unknown): Date | undefined {
  const ts = (value as { ts?: unknown } | null)?.ts;
  if (typeof ts !== 'string') return undefined;
  const at = new Date(ts);
  return Number.isNaN(at.getTime()) ? undefined : at;
}

/**
 * The generated answer as text: the output less the token it stopped on, special tokens kept.
 * That token is dropped when generation stopped (`finish_reason` stop) and the output ends with
 * an end-of-turn token of the tokenizer, or with the special token SGLang says it matched (e.g.
 * Qwen's `<|endoftext|>`): in a conversation the template writes its own turn end there.
 */
export function answerText(ctx: TokenizeContext, record: GenerationRecord): string {
  const out = record.output_ids;
  const last = out[out.length - 1];
  const finish = record.finish_reason;
  const stoppedOn =
    finish.type === 'stop' &&
    last !== undefined &&
    (ctx.tokenizer.endOfTurnTokenIds.includes(last) ||
      (finish.matched === last && ctx.tokenizer.isSpecialTokenId(last)));
  return ctx.tokenizer.decode(stoppedOn ? out.slice(0, -1) : out);
}

/** A turn's answer as its conversation's history carried it: {@link answerText}, less any trailing end-of-turn token. */
export function turnAnswerText(ctx: TokenizeContext, record: GenerationRecord): string {
  const out = record.output_ids;
  const last = out[out.length - 1];
  if (last !== undefined && ctx.tokenizer.endOfTurnTokenIds.includes(last))
    return ctx.tokenizer.decode(out.slice(0, -1));
  return answerText(ctx, record);
}

/**
 * Writes the line of training row `row` (kind `kind`, messages `conversations`) to `sink` and
 * counts it (unless `--drafter dflash` leaves it out, counted apart): its `text` is the row's ids decoded with special tokens kept, and is encoded again
 * with the configured tokenizer, as SpecForge encodes it, to count the rows whose ids it cannot
 * give back (non-canonical token splits the server produced).
 */
export async function emitRow(
  sink: SpecForgeSink,
  ctx: TokenizeContext,
  stats: SpecForgeExportStats,
  kind: SpecForgeRowKind,
  row: HfRow,
  conversations: ChatMessage[],
  tools?: unknown[],
): Promise<void> {
  if (sink.dflash !== undefined && !sink.dflash.admit(row.input_ids, row.loss_mask, () => `${row.dataset}/${row.id}`)) {
    stats.dflashLeftOut += 1;
    return;
  }
  const text = ctx.tokenizer.decode(row.input_ids, { skipSpecialTokens: false });
  const again = ctx.tokenizer.encode(text);
  const k = stats.byKind[kind];
  k.rows += 1;
  k.longest = Math.max(k.longest, row.input_ids.length, again.length);
  if (!sameIds(again, row.input_ids)) {
    k.reencodeDiffers += 1;
    if (stats.reencodeExamples.length < MAX_EXAMPLES) stats.reencodeExamples.push(row.id);
  }
  stats.exported += 1;
  await sink.write(kind, {
    id: row.id,
    dataset: row.dataset,
    text,
    conversations,
    ...(tools === undefined ? {} : { tools }),
  });
}
