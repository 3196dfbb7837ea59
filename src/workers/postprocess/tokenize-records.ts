/** Generation records to training rows: the token-exact path (rule: docs/design.md, Training rows). */
import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';

import {
  EnvironmentError,
  FinishReasonSchema,
  PayloadError,
  errorMessage,
  isRecord,
  logger as componentLogger,
  type FinishReason,
  type Logger,
} from '../../shared/index.js';
import type { TokenizeContext, TokenizedRow } from './tokenize-context.js';
import type { AssistantTurnFormat } from './tokenize-template.js';
import { linesFrom, type FileStart } from './generation-offsets.js';
import { noteInvalid, type InvalidLine } from './tokenize-lines.js';

/** One line of `<run>/<dataset>/generations/*.jsonl` (the keys this step reads; others ignored). */
export interface GenerationRecord {
  id: string;
  dataset?: string;
  prompt_ids: number[];
  output_ids: number[];
  prompt_tokens?: number;
  completion_tokens?: number;
  finish_reason: FinishReason;
}

function tokenIds(value: unknown, field: string, vocabSize: number): number[] {
  if (!Array.isArray(value)) throw new PayloadError(`${field} must be an array of token ids`);
  for (let i = 0; i < value.length; i++) {
    const id: unknown = value[i];
    if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw new PayloadError(`${field}[${i}] is ${JSON.stringify(id)}: expected a token id in [0, ${vocabSize})`);
    }
  }
  return value as number[];
}

/**
 * Checks a parsed generations line. Throws a {@link PayloadError} naming the problem: a missing
 * id, ids that are not token ids of the tokenizer (`vocabSize`), counts that disagree with the
 * id lists, an unknown finish reason.
 */
export function parseGenerationRecord(value: unknown, vocabSize: number): GenerationRecord {
  if (!isRecord(value)) throw new PayloadError('expected a JSON object');
  const { id, dataset, prompt_tokens: promptTokens, completion_tokens: completionTokens } = value;
  if (typeof id !== 'string' || id === '')
    throw new PayloadError(`"id" must be a non-empty string, got ${JSON.stringify(id)}`);
  if (dataset !== undefined && typeof dataset !== 'string') throw new PayloadError('"dataset" must be a string');
  const promptIds = tokenIds(value.prompt_ids, 'prompt_ids', vocabSize);
  const outputIds = tokenIds(value.output_ids, 'output_ids', vocabSize);
  if (promptIds.length === 0) throw new PayloadError('prompt_ids is empty');
  if (promptTokens !== undefined && promptTokens !== promptIds.length) {
    throw new PayloadError(
      `prompt_tokens is ${JSON.stringify(promptTokens)} but prompt_ids has ${promptIds.length} ids`,
    );
  }
  if (completionTokens !== undefined && completionTokens !== outputIds.length) {
    throw new PayloadError(
      `completion_tokens is ${JSON.stringify(completionTokens)} but output_ids has ${outputIds.length} ids`,
    );
  }
  const finish = FinishReasonSchema.safeParse(value.finish_reason);
  if (!finish.success) {
    throw new PayloadError(
      `finish_reason ${JSON.stringify(value.finish_reason)} is not one of SGLang's (stop, length, abort)`,
    );
  }
  const record: GenerationRecord = { id, prompt_ids: promptIds, output_ids: outputIds, finish_reason: finish.data };
  if (dataset !== undefined) record.dataset = dataset;
  return record;
}

/** Why a generation record yields no row. */
export type DropReason = 'truncated' | 'aborted' | 'empty';

/** What {@link recordToRow} made of a record. */
export type RecordOutcome =
  | {
      status: 'kept';
      row: TokenizedRow;
      /** Whether the output ended with the template's end-of-turn token (and got the suffix). */
      closedTurn: boolean;
    }
  | { status: 'dropped'; reason: DropReason };

const ignorableIdCache = new WeakMap<AssistantTurnFormat, readonly (readonly number[])[]>();

/** The ids of each of the template's ignorable strings, encoded on their own, once per format. */
export function ignorableIds(ctx: TokenizeContext): readonly (readonly number[])[] {
  let ids = ignorableIdCache.get(ctx.format);
  if (ids === undefined) {
    ids = ctx.format.ignorablePrefixes.map((p) => ctx.tokenizer.encode(p));
    ignorableIdCache.set(ctx.format, ids);
  }
  return ids;
}

/**
 * Sets to 0 the mask of every run of `output` (which starts at `offset` in the row) that spells
 * one of the template's ignorable strings (Qwen3's empty `<think>\n\n</think>\n\n`, which a
 * model in non-thinking mode writes itself): SpecForge's `ignore_token` rule, which a conversation
 * row gets from tokenize-mask.ts, applied to the ids the model generated.
 */
export function unsuperviseIgnorable(
  output: readonly number[],
  offset: number,
  ignorable: readonly (readonly number[])[],
  mask: number[],
): void {
  for (const seq of ignorable) {
    const first = seq[0];
    if (first === undefined) continue;
    for (let i = output.indexOf(first); i >= 0 && i + seq.length <= output.length; i = output.indexOf(first, i + 1)) {
      let k = 1;
      while (k < seq.length && output[i + k] === seq[k]) k++;
      if (k === seq.length) mask.fill(0, offset + i, offset + i + seq.length);
    }
  }
}

/**
 * The training row of one generation record (see the module comment for the rule by finish
 * reason). `dataset` defaults to the record's own. Pure; the record is assumed checked by
 * {@link parseGenerationRecord}.
 */
export function recordToRow(record: GenerationRecord, ctx: TokenizeContext, dataset?: string): RecordOutcome {
  const finish = record.finish_reason;
  // A partial output (`budget: strict` stopped it at the budget, or the server aborted it) is cut like a truncated one.
  if (finish.type === 'abort' && !ctx.keepTruncated) return { status: 'dropped', reason: 'aborted' };
  if (finish.type === 'length' && !ctx.keepTruncated) return { status: 'dropped', reason: 'truncated' };
  const output = record.output_ids;
  if (output.length === 0) return { status: 'dropped', reason: 'empty' };
  const closedTurn = finish.type === 'stop' && output[output.length - 1] === ctx.format.endOfTurnTokenId;
  const suffix = closedTurn ? ctx.format.suffixIds : [];
  const prompt = record.prompt_ids;
  const total = prompt.length + output.length + suffix.length;
  const inputIds = new Array<number>(total);
  const lossMask = new Array<number>(total);
  let i = 0;
  for (const id of prompt) {
    inputIds[i] = id;
    lossMask[i++] = 0;
  }
  for (const id of output) {
    inputIds[i] = id;
    lossMask[i++] = 1;
  }
  for (const id of suffix) {
    inputIds[i] = id;
    lossMask[i++] = 1;
  }
  unsuperviseIgnorable(output, prompt.length, ignorableIds(ctx), lossMask);
  const name = dataset ?? record.dataset;
  if (name === undefined) throw new PayloadError(`record ${record.id} names no dataset`);
  return {
    status: 'kept',
    closedTurn,
    row: {
      id: record.id,
      dataset: name,
      input_ids: inputIds,
      loss_mask: lossMask,
      num_tokens: total,
      finish_reason: finish.type,
    },
  };
}

/** Counters of {@link rowsFromGenerations}; final once the generator is exhausted. */
export interface GenerationTokenizeStats {
  files: number;
  /** Non-blank lines read. */
  lines: number;
  /** Rows yielded. */
  kept: number;
  /** Of `kept`: truncated (`length`) and aborted rows kept because of `keepTruncated`. */
  keptTruncated: number;
  /** Of `kept`: stopped rows whose output does not end with the template's end-of-turn token. */
  stopWithoutEndOfTurn: number;
  droppedTruncated: number;
  droppedAborted: number;
  /** Records with no output ids. */
  droppedEmpty: number;
  /** Records whose id was already seen in this dataset (the first one wins). */
  duplicates: number;
  /** Lines that are not valid records (bad JSON, ids out of the vocabulary, ...). */
  invalid: number;
  /** The first invalid lines, with the reason. */
  invalidExamples: InvalidLine[];
  /** Sum of `num_tokens` of the rows yielded. */
  tokens: number;
  /** Sum of their loss masks. */
  supervisedTokens: number;
  /** `rows: conversation`: of `kept`, rows of whole conversations. */
  conversationRows?: number;
  /** `rows: conversation`: turns that are part of their conversation's row (no row of their own). */
  inConversationRows?: number;
}

/** Fresh zeroed counters. */
export function emptyGenerationStats(): GenerationTokenizeStats {
  return {
    files: 0,
    lines: 0,
    kept: 0,
    keptTruncated: 0,
    stopWithoutEndOfTurn: 0,
    droppedTruncated: 0,
    droppedAborted: 0,
    droppedEmpty: 0,
    duplicates: 0,
    invalid: 0,
    invalidExamples: [],
    tokens: 0,
    supervisedTokens: 0,
  };
}

export interface RowsFromGenerationsOptions {
  ctx: TokenizeContext;
  /** The dataset's name, written to each row (default: each record's `dataset`). */
  dataset?: string;
  /** Counters to fill in place (also the generator's return value). */
  stats?: GenerationTokenizeStats;
  logger?: Logger;
  /**
   * Where to start reading each file, by file name (from the offsets of the last round, see
   * generation-offsets.ts); files not in it are read from the start.
   */
  resume?: ReadonlyMap<string, FileStart> | undefined;
  /** Filled with where each file's complete lines end once read, by file name. */
  positions?: Map<string, FileStart>;
  /**
   * `postprocess.rows: conversation`: the conversations regenerated turn by turn that make one
   * row each (tokenize-conversation-rows.ts builds it); their other turns make none.
   */
  conversationRows?: WholeConversationRows;
}

/** What {@link rowsFromGenerations} needs to make rows of whole conversations. */
export interface WholeConversationRows {
  /** The turn fields of a parsed line: its conversation, when that conversation makes one row. */
  wholeOf(value: unknown): { conversationId: string; last: boolean } | undefined;
  /** The conversation's row, from its last turn's record (undefined: rows per turn after all). */
  row(record: GenerationRecord, value: unknown): TokenizedRow | undefined;
}

/** The `*.jsonl` files of a generations folder, by name. Throws an `EnvironmentError` if it is no folder. */
export async function listGenerationFiles(dir: string): Promise<string[]> {
  try {
    if (!(await stat(dir)).isDirectory()) throw new EnvironmentError(`generations folder ${dir} is not a folder`);
  } catch (e: unknown) {
    if (e instanceof EnvironmentError) throw e;
    throw new EnvironmentError(`generations folder ${dir} cannot be read: ${errorMessage(e)}`, { cause: e });
  }
  const names = await readdir(dir);
  return names
    .filter((n) => n.endsWith('.jsonl') && !n.startsWith('.'))
    .sort()
    .map((n) => path.join(dir, n));
}

/**
 * Streams the rows of one dataset's generations folder (`<run>/<dataset>/generations`): its
 * `*.jsonl` files in name order, line by line, so files of any size take constant memory
 * (besides the set of ids seen). With `opts.resume`, each file is read from where the last
 * round stopped (a file that has not grown since is not opened). A sample id seen before in the
 * lines read is skipped (the first wins). Invalid lines are counted and skipped, never fatal.
 * Returns the counters, which are also kept up to date in `opts.stats` when given.
 */
export async function* rowsFromGenerations(
  dir: string,
  opts: RowsFromGenerationsOptions,
): AsyncGenerator<TokenizedRow, GenerationTokenizeStats, undefined> {
  const stats = opts.stats ?? emptyGenerationStats();
  const log = opts.logger ?? componentLogger('tokenize', { dataset: opts.dataset, dir });
  const vocabSize = opts.ctx.tokenizer.vocabSize;
  const seen = new Set<string>();
  for (const file of await listGenerationFiles(dir)) {
    const name = path.basename(file);
    const start = opts.resume?.get(name) ?? { bytes: 0, lines: 0 };
    if (start.bytes > 0 && (await stat(file)).size === start.bytes) {
      opts.positions?.set(name, start);
      continue;
    }
    stats.files += 1;
    const reader = linesFrom(file, start);
    for (;;) {
      const next = await reader.next();
      if (next.done === true) {
        opts.positions?.set(name, next.value);
        break;
      }
      const { line, text } = next.value;
      stats.lines += 1;
      let record: GenerationRecord;
      let value: unknown;
      try {
        value = JSON.parse(text);
        record = parseGenerationRecord(value, vocabSize);
      } catch (e: unknown) {
        noteInvalid(stats, log, {
          file,
          line,
          reason: e instanceof SyntaxError ? `invalid JSON: ${e.message}` : errorMessage(e),
        });
        continue;
      }
      if (seen.has(record.id)) {
        stats.duplicates += 1;
        continue;
      }
      seen.add(record.id);
      const whole = opts.conversationRows?.wholeOf(value);
      if (whole !== undefined) {
        // Part of its conversation's row: the earlier turns make none of their own.
        if (!whole.last) {
          stats.inConversationRows = (stats.inConversationRows ?? 0) + 1;
          continue;
        }
        const row = opts.conversationRows?.row(record, value);
        if (row !== undefined) {
          stats.kept += 1;
          stats.conversationRows = (stats.conversationRows ?? 0) + 1;
          stats.tokens += row.num_tokens;
          for (const m of row.loss_mask) stats.supervisedTokens += m;
          yield row;
          continue;
        }
      }
      let outcome: RecordOutcome;
      try {
        outcome = recordToRow(record, opts.ctx, opts.dataset);
      } catch (e: unknown) {
        noteInvalid(stats, log, { file, line, reason: errorMessage(e) });
        continue;
      }
      if (outcome.status === 'dropped') {
        if (outcome.reason === 'truncated') stats.droppedTruncated += 1;
        else if (outcome.reason === 'aborted') stats.droppedAborted += 1;
        else stats.droppedEmpty += 1;
        continue;
      }
      const { row } = outcome;
      stats.kept += 1;
      if (row.finish_reason === 'length' || row.finish_reason === 'abort') stats.keptTruncated += 1;
      else if (!outcome.closedTurn) stats.stopWithoutEndOfTurn += 1;
      stats.tokens += row.num_tokens;
      for (const m of row.loss_mask) stats.supervisedTokens += m;
      yield row;
    }
  }
  return stats;
}
