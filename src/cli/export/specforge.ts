/**
 * `export --format specforge`: a run's generations as SpecForge 0.2.0 data, one line per
 * training row the tokenize step makes of them:
 *
 *   {"id": "<row id>", "dataset": "<name>", "text": "<the row's ids decoded, special tokens kept>",
 *    "conversations": [<prompt messages>…, {"role": "assistant", "content": "<the answer, decoded>"}],
 *    "tools": [<the prompt line's tool schemas, when it has some>]}
 *
 * - `text` is exactly what the target saw and produced: SpecForge's preformatted mode
 *   (`data.is_preformatted: true`) encodes it as it is, inserts no system prompt, renders no
 *   template, and finds the supervised spans by its template's assistant header and end-of-turn
 *   token (specforge-templates.ts picks the template whose spans are the row's mask). A row whose
 *   text does not encode back to its ids (a non-canonical token split the server produced) is
 *   counted: SpecForge cannot reproduce it from text, `export --format jsonl` as its
 *   `data.prompts_path` can.
 * - `conversations` is for readers that render messages: the prompt's messages as the producer
 *   read them (ShareGPT `{from, value}` normalized), from the line of the prompt's id (the sample
 *   id read by the dataset's id scheme: {@link promptIdOf}), checked against the record (rendered
 *   with the generation prompt and the line's `tools`, `strftime_now` at the record's `ts`, they must give its
 *   `prompt_ids`; a record whose prompt line is gone or changed is left out and counted), and
 *   the answer `decode(output_ids)` less the token it stopped on ({@link answerText}), a
 *   `<think>…</think>` block kept in `content`. Rendering it
 *   with a chat template gives the row's ids except where the template writes what the model
 *   did not (a default system prompt, Qwen3's empty think block, its own turn end after a
 *   generation that stopped on another token or was cut off): test/integration/export-specforge.test.ts.
 * - Rows come as tokenize makes them ({@link recordToRow}): stop, or length and abort with
 *   `postprocess.keepTruncated`, never an empty output, the first record of a sample id only.
 *   Datasets regenerated turn by turn are written per row too: one `all-turns` line per
 *   conversation made into one row, else one `last-turn` line per turn
 *   (specforge-conversations.ts). The two kinds go to two files (specforge-files.ts).
 */
import { countLines, errorMessage, fastPromptId, logger as componentLogger, type Logger } from '../../shared/index.js';
import { PromptIndex, partitionOf, partitionsFor, promptIdOf, type SampleIdScheme } from './prompt-index.js';
import { ConversationTurns, exportConversations, turnOf } from './specforge-conversations.js';
import {
  answerText,
  emitRow,
  emptyStats,
  generatedAtOf,
  noteProblem,
  promptMatches,
  type SpecForgeExportStats,
  type SpecForgeSink,
} from './specforge-rows.js';
import { listGenerationFiles, parseGenerationRecord, recordToRow, type GenerationRecord } from '../../workers/index.js';
import type { TokenizeContext } from '../../workers/index.js';
import { jsonLines } from '../../workers/index.js';

export {
  answerText,
  promptMatches,
  type SpecForgeExportStats,
  type SpecForgeLine,
  type SpecForgeRowKind,
  type SpecForgeSink,
} from './specforge-rows.js';

export interface ExportSpecForgeOptions {
  dataset: string;
  /** The dataset's prompt file (`datasets[i].prompts`). */
  promptsFile: string;
  /** `<run>/<dataset>/generations`. */
  generationsDir: string;
  ctx: TokenizeContext;
  /** Where the lines go, by row kind. */
  sink: SpecForgeSink;
  /** `datasets[].turns`: with `all`, turns are gathered per conversation (see specforge-conversations.ts). */
  turns: 'last' | 'all';
  /** `postprocess.rows`, for `turns: all`. */
  rows: 'per-turn' | 'conversation';
  /** `datasets[].samplesPerPrompt`: above 1, a sample id is its prompt's id and `#s<j>`. */
  samplesPerPrompt: number;
  /** Prompt lines indexed at once (default {@link PARTITION_MAX_LINES}); tests pass a small one. */
  partitionMaxLines?: number;
  logger?: Logger;
}

/**
 * Writes the SpecForge lines of one dataset's rows to `opts.sink` (see the module comment). The
 * prompt file is indexed one partition of sample ids at a time, and the generation files are
 * read once per partition: lines come out partition by partition, in generation-file order
 * within each (a partition's conversations after its other records).
 */
export async function exportSpecForgeDataset(opts: ExportSpecForgeOptions): Promise<SpecForgeExportStats> {
  const stats = emptyStats(opts.dataset);
  const log = opts.logger ?? componentLogger('export', { dataset: opts.dataset });
  const files = await listGenerationFiles(opts.generationsDir);
  stats.files = files.length;
  if (files.length === 0) return stats;
  const partitions = partitionsFor(await countLines(opts.promptsFile), opts.partitionMaxLines);
  const vocabSize = opts.ctx.tokenizer.vocabSize;
  const scheme: SampleIdScheme = { samplesPerPrompt: opts.samplesPerPrompt, turns: opts.turns };
  const note = (file: string, line: number, reason: string): void => noteProblem(stats, log, file, line, reason);
  for (let p = 0; p < partitions; p++) {
    const index = await PromptIndex.build(opts.promptsFile, p, partitions, { turns: opts.turns });
    const seen = new Set<string>();
    const conversations = new ConversationTurns();
    try {
      for (const file of files) {
        for await (const { line, text } of jsonLines(file)) {
          const fastId = partitions > 1 && opts.turns !== 'all' ? fastPromptId(text) : undefined;
          if (fastId !== undefined && partitionOf(promptIdOf(fastId, scheme), partitions) !== p) continue;
          let record: GenerationRecord;
          let value: unknown;
          try {
            value = JSON.parse(text);
            record = parseGenerationRecord(value, vocabSize);
          } catch (e: unknown) {
            if (p === 0) {
              stats.lines += 1;
              stats.invalid += 1;
              note(file, line, e instanceof SyntaxError ? `invalid JSON: ${e.message}` : errorMessage(e));
            }
            continue;
          }
          const turn = opts.turns === 'all' ? turnOf(value, scheme) : undefined;
          const promptId = turn?.promptId ?? promptIdOf(record.id, scheme);
          if (partitionOf(promptId, partitions) !== p) continue;
          stats.lines += 1;
          if (seen.has(record.id)) {
            stats.duplicates += 1;
            continue;
          }
          seen.add(record.id);
          const generatedAt = generatedAtOf(value);
          if (turn !== undefined) conversations.add(turn, record, file, line, generatedAt);
          else await exportRecord({ record, promptId, generatedAt }, file, line, opts, index, stats, note);
        }
      }
      await exportConversations(conversations, {
        dataset: opts.dataset,
        ctx: opts.ctx,
        sink: opts.sink,
        rows: opts.rows,
        index,
        stats,
        log,
      });
    } finally {
      await index.close();
    }
  }
  return stats;
}

/** A record to export, with its prompt line's id and when it was written. */
interface RecordToExport {
  record: GenerationRecord;
  promptId: string;
  generatedAt: Date | undefined;
}

async function exportRecord(
  { record, promptId, generatedAt }: RecordToExport,
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
  const prompt = await index.get(promptId);
  if (prompt === undefined) {
    stats.promptMissing += 1;
    const which = promptId === record.id ? 'this id' : `its prompt's id ${promptId}`;
    note(file, line, `sample ${record.id}: no line of ${index.file} has ${which}`);
    return;
  }
  if ('error' in prompt) {
    stats.promptChanged += 1;
    note(file, line, `sample ${record.id}: its prompt line no longer parses: ${prompt.error}`);
    return;
  }
  let matches: boolean;
  try {
    matches = promptMatches(opts.ctx, prompt.messages, record.prompt_ids, generatedAt, prompt.tools);
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
  await emitRow(
    opts.sink,
    opts.ctx,
    stats,
    'last-turn',
    outcome.row,
    [...prompt.messages, { role: 'assistant', content: answerText(opts.ctx, record) }],
    prompt.tools,
  );
  if (outcome.row.finish_reason === 'length' || outcome.row.finish_reason === 'abort') stats.keptTruncated += 1;
  else if (!outcome.closedTurn) stats.stopWithoutEndOfTurn += 1;
}
