/**
 * `export --format specforge`: a run's generations as SpecForge's conversation JSONL, so that a
 * trainer using SpecForge's own loader (or any chat-template pipeline) can read them:
 *
 *   {"id": "<sample id>", "dataset": "<name>", "conversations": [<prompt messages>…,
 *     {"role": "assistant", "content": "<the generated answer, decoded>"}]}
 *
 * - One line per generation that the tokenize step keeps as a row ({@link recordToRow}: stop,
 *   or length and abort with `postprocess.keepTruncated`; never an empty output), the first
 *   record of a sample id only, as tokenize does.
 * - The prompt messages are those of the prompt file's line with the record's sample id, as the
 *   producer read them (ShareGPT `{from, value}` normalized to `{role, content}`; a
 *   `conversations` prompt cut after its last user turn). The file is checked against the
 *   record: the messages rendered with the generation prompt must give the record's
 *   `prompt_ids`; a record whose prompt line is gone or changed is left out and counted.
 * - The answer is `decode(output_ids)` with special tokens kept, less the token generation
 *   stopped on ({@link answerText}; the chat template writes the turn end itself). A
 *   `<think>…</think>` block stays in `content`, as generated: Qwen3's template splits it off
 *   into the reasoning block itself (the rendering is the same as with `reasoning_content`),
 *   SpecForge's `ThinkingParser` appends `content` after the generation prompt and reads no
 *   `reasoning_content`, and templates without reasoning support render it verbatim — in each
 *   case the generated ids come back.
 *
 * Rendering an exported line with the chat template gives the row's `input_ids`, except where
 * the template writes what the model did not: a generation that stopped on another token than
 * the template's end-of-turn token (the template closes the turn with its own), a truncated
 * one kept with `keepTruncated` (the template closes it too), and Qwen3's empty `<think>\n\n</think>\n\n` block for an answer generated
 * in thinking mode without one. test/integration/export-specforge.test.ts measures it.
 */
import path from 'node:path';

import {
  conversationTurns,
  errorMessage,
  fastPromptId,
  turnHistory,
  logger as componentLogger,
  type ChatMessage,
  type Logger,
} from '../../shared/index.js';
import type { AtomicJsonlWriter } from './file.js';
import { PromptIndex, countLines, partitionOf, partitionsFor } from './prompt-index.js';
import { ConversationTurns, turnOf, type GatheredTurn } from './specforge-conversations.js';
import { listGenerationFiles, parseGenerationRecord, recordToRow, type GenerationRecord } from '../../workers/index.js';
import type { TokenizeContext } from '../../workers/index.js';
import { jsonLines } from '../../workers/index.js';

/** One line of the SpecForge export. */
export interface SpecForgeLine {
  id: string;
  dataset: string;
  conversations: ChatMessage[];
}

/** At most this many problem examples are kept per dataset. */
const MAX_EXAMPLES = 10;

/** What the export of one dataset did. */
export interface SpecForgeExportStats {
  dataset: string;
  /** Generation files read. */
  files: number;
  /** Non-blank generation lines read (once per partition counted once). */
  lines: number;
  /** Lines written. */
  exported: number;
  /** Of `exported`: truncated and aborted generations (kept because of `postprocess.keepTruncated`). */
  keptTruncated: number;
  /** Of `exported`: stopped on something else than the template's end-of-turn token. */
  stopWithoutEndOfTurn: number;
  droppedTruncated: number;
  droppedAborted: number;
  droppedEmpty: number;
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
}

function emptyStats(dataset: string): SpecForgeExportStats {
  return {
    dataset,
    files: 0,
    lines: 0,
    exported: 0,
    keptTruncated: 0,
    stopWithoutEndOfTurn: 0,
    droppedTruncated: 0,
    droppedAborted: 0,
    droppedEmpty: 0,
    duplicates: 0,
    invalid: 0,
    promptMissing: 0,
    promptChanged: 0,
    examples: [],
  };
}

function sameIds(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Whether `messages`, rendered with the generation prompt, are the prompt the record was
 * generated from: the decoded `prompt_ids` equal the rendered text (cheap), or else encoding the
 * rendered text gives the same ids (for tokenizers whose decoding is not the exact inverse).
 */
export function promptMatches(
  ctx: TokenizeContext,
  messages: readonly ChatMessage[],
  promptIds: readonly number[],
): boolean {
  const text = ctx.tokenizer.applyChatTemplate(messages, {
    addGenerationPrompt: true,
    ...(ctx.templateKwargs === undefined ? {} : { templateKwargs: ctx.templateKwargs }),
  });
  if (ctx.tokenizer.decode(promptIds) === text) return true;
  return sameIds(ctx.tokenizer.encode(text), promptIds);
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
function turnAnswerText(ctx: TokenizeContext, record: GenerationRecord): string {
  const out = record.output_ids;
  const last = out[out.length - 1];
  if (last !== undefined && ctx.tokenizer.endOfTurnTokenIds.includes(last))
    return ctx.tokenizer.decode(out.slice(0, -1));
  return answerText(ctx, record);
}

export interface ExportSpecForgeOptions {
  dataset: string;
  /** The dataset's prompt file (`datasets[i].prompts`). */
  promptsFile: string;
  /** `<run>/<dataset>/generations`. */
  generationsDir: string;
  ctx: TokenizeContext;
  writer: AtomicJsonlWriter;
  /** `datasets[].turns`: with `all`, one line per conversation (see specforge-conversations.ts). */
  turns?: 'last' | 'all';
  /** Prompt lines indexed at once (default {@link PARTITION_MAX_LINES}); tests pass a small one. */
  partitionMaxLines?: number;
  logger?: Logger;
}

/**
 * Writes the SpecForge lines of one dataset's kept generations to `opts.writer` (see the module
 * comment). The prompt file is indexed one partition of sample ids at a time, and the
 * generation files are read once per partition: lines come out partition by partition, in
 * generation-file order within each.
 */
export async function exportSpecForgeDataset(opts: ExportSpecForgeOptions): Promise<SpecForgeExportStats> {
  const stats = emptyStats(opts.dataset);
  const log = opts.logger ?? componentLogger('export', { dataset: opts.dataset });
  const files = await listGenerationFiles(opts.generationsDir);
  stats.files = files.length;
  if (files.length === 0) return stats;
  const partitions = partitionsFor(await countLines(opts.promptsFile), opts.partitionMaxLines);
  const vocabSize = opts.ctx.tokenizer.vocabSize;
  const note = (file: string, line: number, reason: string): void => {
    if (stats.examples.length >= MAX_EXAMPLES) return;
    stats.examples.push(`${path.basename(file)}:${line}: ${reason}`);
    log.debug({ file, line, reason }, 'generation left out of the export');
  };
  for (let p = 0; p < partitions; p++) {
    const index = await PromptIndex.build(opts.promptsFile, p, partitions, { turns: opts.turns ?? 'last' });
    const seen = new Set<string>();
    const conversations = new ConversationTurns();
    try {
      for (const file of files) {
        for await (const { line, text } of jsonLines(file)) {
          const fastId = partitions > 1 && opts.turns !== 'all' ? fastPromptId(text) : undefined;
          if (fastId !== undefined && partitionOf(fastId, partitions) !== p) continue;
          let record: GenerationRecord;
          try {
            record = parseGenerationRecord(JSON.parse(text), vocabSize);
          } catch (e: unknown) {
            if (p === 0) {
              stats.lines += 1;
              stats.invalid += 1;
              note(file, line, e instanceof SyntaxError ? `invalid JSON: ${e.message}` : errorMessage(e));
            }
            continue;
          }
          const turn = opts.turns === 'all' ? turnOf(text) : undefined;
          if (partitionOf(turn?.promptId ?? record.id, partitions) !== p) continue;
          stats.lines += 1;
          if (seen.has(record.id)) {
            stats.duplicates += 1;
            continue;
          }
          seen.add(record.id);
          if (turn !== undefined) conversations.add(turn, record, file, line);
          else await exportRecord(record, file, line, opts, index, stats, note);
        }
      }
      await exportConversations(conversations, opts, index, stats, note);
    } finally {
      await index.close();
    }
  }
  return stats;
}

async function exportRecord(
  record: GenerationRecord,
  file: string,
  line: number,
  opts: ExportSpecForgeOptions,
  index: PromptIndex,
  stats: SpecForgeExportStats,
  note: (file: string, line: number, reason: string) => void,
): Promise<void> {
  const outcome = recordToRow(record, opts.ctx, opts.dataset);
  if (outcome.status === 'dropped') {
    if (outcome.reason === 'truncated') stats.droppedTruncated += 1;
    else if (outcome.reason === 'aborted') stats.droppedAborted += 1;
    else stats.droppedEmpty += 1;
    return;
  }
  const prompt = await index.get(record.id);
  if (prompt === undefined) {
    stats.promptMissing += 1;
    note(file, line, `sample ${record.id}: no line of ${index.file} has this id`);
    return;
  }
  if ('error' in prompt) {
    stats.promptChanged += 1;
    note(file, line, `sample ${record.id}: its prompt line no longer parses: ${prompt.error}`);
    return;
  }
  let matches: boolean;
  try {
    matches = promptMatches(opts.ctx, prompt.messages, record.prompt_ids);
  } catch (e: unknown) {
    matches = false;
    note(file, line, `sample ${record.id}: its prompt cannot be rendered: ${errorMessage(e)}`);
  }
  if (!matches) {
    stats.promptChanged += 1;
    note(
      file,
      line,
      `sample ${record.id}: its prompt line in ${index.file} does not render to the record's prompt_ids (the file changed since generation?)`,
    );
    return;
  }
  const out: SpecForgeLine = {
    id: record.id,
    dataset: opts.dataset,
    conversations: [...prompt.messages, { role: 'assistant', content: answerText(opts.ctx, record) }],
  };
  await opts.writer.write(out);
  stats.exported += 1;
  if (outcome.row.finish_reason === 'length' || outcome.row.finish_reason === 'abort') stats.keptTruncated += 1;
  else if (!outcome.closedTurn) stats.stopWithoutEndOfTurn += 1;
}

/**
 * One line per conversation regenerated turn by turn: its history up to its last kept turn, the
 * source's system, user and tool messages with each turn's regenerated answer, as it was sent.
 * Turns must run 1, 2, … without a gap; turn 1's prompt must still render from the prompt line
 * (else the line changed since generation). A last turn that the tokenize step drops (truncated
 * without `keepTruncated`) is left off; earlier turns stay, as they were the history sent.
 */
async function exportConversations(
  gathered: ConversationTurns,
  opts: ExportSpecForgeOptions,
  index: PromptIndex,
  stats: SpecForgeExportStats,
  note: (file: string, line: number, reason: string) => void,
): Promise<void> {
  for (const [id, c] of gathered.byConversation) {
    const turns = c.turns.sort((a, b) => a.turn - b.turn);
    const first = turns[0] as GatheredTurn;
    const gap = turns.findIndex((t, i) => t.turn !== i + 1);
    if (gap >= 0) {
      stats.invalid += 1;
      note(first.file, first.line, `conversation ${id}: turn ${gap + 1} is missing from the generation files`);
      continue;
    }
    const prompt = await index.get(c.promptId);
    if (prompt === undefined || 'error' in prompt) {
      if (prompt === undefined) stats.promptMissing += 1;
      else stats.promptChanged += 1;
      note(first.file, first.line, `conversation ${id}: no usable line of ${index.file} has id ${c.promptId}`);
      continue;
    }
    const shape = conversationTurns(prompt.messages);
    const turn1 = typeof shape === 'string' ? undefined : turnHistory(prompt.messages, shape, 1, []);
    let matches = false;
    try {
      matches = turn1 !== undefined && promptMatches(opts.ctx, turn1, first.record.prompt_ids);
    } catch {
      matches = false;
    }
    if (typeof shape === 'string' || !matches) {
      stats.promptChanged += 1;
      note(
        first.file,
        first.line,
        `conversation ${id}: its line in ${index.file} does not render to turn 1's prompt_ids`,
      );
      continue;
    }
    const last = turns[turns.length - 1] as GatheredTurn;
    const lastRow = recordToRow(last.record, opts.ctx, opts.dataset);
    const kept = lastRow.status === 'dropped' ? turns.slice(0, -1) : turns;
    if (kept.length === 0) {
      stats.droppedTruncated += 1;
      continue;
    }
    // As the history was sent: an answer's trailing end-of-turn token is the template's to write,
    // whatever the finish reason (SGLang reports `length` for an end token that is the last one allowed).
    const answers: ChatMessage[] = kept.map((t) => ({
      role: 'assistant',
      content: turnAnswerText(opts.ctx, t.record),
    }));
    const history = turnHistory(prompt.messages, shape, kept.length, answers.slice(0, -1));
    await opts.writer.write({
      id,
      dataset: opts.dataset,
      conversations: [...history, answers[answers.length - 1] as ChatMessage],
    });
    stats.exported += 1;
  }
}
