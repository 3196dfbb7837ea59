/**
 * One dataset's `prepare`: its source's rows, streamed, become its prompt file.
 *
 * Each row is read as turns (or counted malformed), cut after its last user turn (or counted
 * empty), deduplicated by a 64-bit hash of its messages against the dataset's earlier rows and,
 * with `dedupeAcross`, against what earlier datasets kept; then measured with the target's
 * tokenizer and chat template when a `maxPromptTokens` applies, given a unique id, and kept —
 * up to `limit`: the first ones, or with `shuffle` the smallest ranks of the seed
 * (see {@link ShuffledSubset}). What grows with the source is the hash sets (about 16 bytes a
 * distinct prompt and a kept id), never the prompts. A row's tool schemas are kept with it,
 * count in its identity and are rendered wherever it is measured.
 *
 * With `turns: all` and a known context length, each kept conversation is also measured whole:
 * its last turn's prompt (the source's answers standing in for the regenerated ones, with its
 * tools) plus `maxNewTokens` beyond the context length is a conversation that would not fit
 * whole (`overContext`): kept, its later turns likely to end it early
 * (docs/multi-turn.md, "Growing context").
 */
import type { ChatMessage, ChatTokenizer } from '../../shared/index.js';
import { CancelledError, conversationTurns, errorMessage, readRawLines, turnHistory } from '../../shared/index.js';
import { Hash64Set, messagesHash, type Hash64 } from './prompt-hash.js';
import { AtomicLineWriter, type WrittenFile } from './prompt-file-writer.js';
import { UniqueIds, promptId } from './prompt-ids.js';
import { promptLine, shapePrompt } from './prompt-shape.js';
import { ShuffledSubset } from './prompt-subset.js';
import { ExampleLog, emptyCounts, type PrepareCounts, type PrepareExample } from './prepare-report.js';
import type { SourceRow, SourceRowWhere } from './source-types.js';

/** Prompts measured with the tokenizer at once. */
const ENCODE_CHUNK = 256;
/** Characters of a prompt shown in an example. */
const EXCERPT_CHARS = 160;

/** The prompts an earlier dataset kept, for `dedupeAcross`. */
export interface KeptBy {
  dataset: string;
  hashes: Hash64Set;
}

export interface PrepareDatasetInput {
  dataset: string;
  rows: AsyncIterable<SourceRow>;
  promptsFile: string;
  maxPromptTokens?: number | undefined;
  /** `datasets[].turns`: with `all`, whole conversations are kept and the length filter measures turn 1. */
  turns: 'last' | 'all';
  /** `datasets[].chatTemplateKwargs`, for the length filter's rendering. */
  templateKwargs?: Record<string, unknown> | undefined;
  /**
   * `turns: all`: the model's context length and the dataset's `maxNewTokens`, to count the
   * conversations that would not fit whole (the tokenizer is then loaded).
   */
  contextCheck?: { contextLength: number; maxNewTokens: number } | undefined;
  /** Needed when `maxPromptTokens` is set; loaded on first use. */
  tokenizer?: (() => Promise<ChatTokenizer>) | undefined;
  limit?: number | undefined;
  shuffleSeed?: number | undefined;
  /** Earlier datasets' kept prompts (config order); empty without `dedupeAcross`. */
  keptBefore: readonly KeptBy[];
  /** Record this dataset's kept prompts (for the datasets after it). */
  recordKept: boolean;
  /** Called with the new file's SHA-256 before it replaces the old one; throw to refuse. */
  beforeCommit?: ((sha256: string) => Promise<void>) | undefined;
  /** Aborted: the prepare stops at the next row with a `CancelledError`, the old prompt file untouched. */
  signal?: AbortSignal | undefined;
  /** Called about every `progressEveryMs` (default 10 s) with the counts so far. */
  onProgress?: ((counts: Readonly<PrepareCounts>) => void) | undefined;
  progressEveryMs?: number | undefined;
}

export interface PrepareDatasetResult {
  written: WrittenFile;
  counts: PrepareCounts;
  examples: ExampleLog['examples'];
  /** This dataset's kept prompts, when `recordKept`. */
  kept: Hash64Set | undefined;
}

interface Candidate {
  id: string;
  messages: ChatMessage[];
  tools: unknown[] | undefined;
  hash: Hash64;
  where: SourceRowWhere;
  droppedTrailing: number;
}

/** What the length filter measures: the chat to answer, or with `turns: all` turn 1's history. */
function firstTurn(messages: ChatMessage[], turns: 'last' | 'all'): ChatMessage[] {
  if (turns !== 'all') return messages;
  const shape = conversationTurns(messages);
  return typeof shape === 'string' ? messages : turnHistory(messages, shape, 1, []);
}

/** The last turn's history of a conversation, the source's answers standing in for the regenerated ones. */
function lastTurn(messages: ChatMessage[]): ChatMessage[] {
  const shape = conversationTurns(messages);
  if (typeof shape === 'string') return messages;
  const answers = shape.starts.map((i) => messages[i] ?? { role: 'assistant' as const, content: '' });
  return turnHistory(messages, shape, shape.starts.length, answers);
}

/** A kept prompt to measure: its id, messages and tools, and where its row is (in the source, or the prompt file). */
type Measured = Pick<Candidate, 'id' | 'messages' | 'tools' | 'where'>;

function excerptOf(messages: readonly ChatMessage[]): string {
  const text = messages.at(-1)?.content ?? '';
  return text.length > EXCERPT_CHARS ? `${text.slice(0, EXCERPT_CHARS)}…` : text;
}

/** Writes the dataset's prompt file from its rows; see the module comment. */
export async function prepareDataset(input: PrepareDatasetInput): Promise<PrepareDatasetResult> {
  const counts = emptyCounts();
  const log = new ExampleLog();
  const seen = new Hash64Set();
  const kept = input.recordKept ? new Hash64Set() : undefined;
  const ids = new UniqueIds();
  const { limit, maxPromptTokens } = input;
  const writer = await AtomicLineWriter.open(input.promptsFile);
  const subset =
    limit !== undefined && input.shuffleSeed !== undefined
      ? await ShuffledSubset.open(limit, input.shuffleSeed, input.promptsFile)
      : undefined;
  let tokenizer: ChatTokenizer | undefined;
  let pending: Candidate[] = [];
  let full = false;
  const useTokenizer = async (): Promise<ChatTokenizer> => {
    tokenizer ??= await input.tokenizer?.();
    if (tokenizer === undefined) throw new Error('prepare: measuring prompts needs a tokenizer');
    return tokenizer;
  };
  const renderOptions = input.templateKwargs === undefined ? {} : { templateKwargs: input.templateKwargs };
  const contextCheck = input.turns === 'all' ? input.contextCheck : undefined;
  if (contextCheck !== undefined) counts.overContext = 0;

  /** Counts the conversations of `list` that would not fit whole (see the module comment). */
  const countOverContext = async (list: readonly Measured[]): Promise<void> => {
    if (contextCheck === undefined || list.length === 0) return;
    const tok = await useTokenizer();
    const lengths = await tok.encodePrompts(
      list.map((c) => ({ messages: lastTurn(c.messages), tools: c.tools })),
      renderOptions,
    );
    const { contextLength, maxNewTokens } = contextCheck;
    for (const [i, c] of list.entries()) {
      const ids = lengths[i];
      if (ids === undefined || ids instanceof Error || ids.length + maxNewTokens <= contextLength) continue;
      counts.overContext = (counts.overContext ?? 0) + 1;
      example(
        'overContext',
        c.where,
        `the last turn's prompt has ${ids.length} tokens; with maxNewTokens ${maxNewTokens} that is over the context length ${contextLength}`,
        { id: c.id },
      );
    }
  };

  const example = (
    kind: Parameters<ExampleLog['add']>[0],
    where: SourceRowWhere,
    reason: string,
    extra: Partial<PrepareExample> = {},
  ): void => log.add(kind, { ...where, ...extra, reason });

  const keep = async (c: Candidate): Promise<void> => {
    const unique = ids.assign(c.id);
    if (unique.renamed) {
      counts.idsRenamed += 1;
      example('idsRenamed', c.where, `id "${c.id}" already used by another prompt; written as "${unique.id}"`, {
        id: unique.id,
      });
    }
    if (c.droppedTrailing > 0) counts.trailingTurnsDropped += 1;
    if (input.turns === 'all') {
      const turns = conversationTurns(c.messages);
      if (typeof turns !== 'string' && turns.starts.length > 1) counts.multiTurn = (counts.multiTurn ?? 0) + 1;
    }
    const line = promptLine(unique.id, c.messages, c.tools);
    if (subset === undefined) {
      await writer.writeLine(line);
      kept?.add(c.hash);
      counts.kept += 1;
      if (limit !== undefined && counts.kept >= limit) full = true;
      return;
    }
    const outcome = await subset.offer(unique.id, line, c.hash);
    if (outcome !== 'kept') counts.overLimit += 1;
  };

  const flush = async (): Promise<void> => {
    const batch = pending;
    pending = [];
    if (batch.length === 0) return;
    let lengths: (number[] | Error)[] | undefined;
    if (maxPromptTokens !== undefined) {
      const tok = await useTokenizer();
      lengths = await tok.encodePrompts(
        batch.map((c) => ({ messages: firstTurn(c.messages, input.turns), tools: c.tools })),
        renderOptions,
      );
    }
    const keptNow: Candidate[] = [];
    for (const [i, c] of batch.entries()) {
      if (full) return;
      const encoded = lengths?.[i];
      if (encoded instanceof Error) {
        counts.malformed += 1;
        example('malformed', c.where, `cannot render the chat template: ${encoded.message}`, { id: c.id });
        continue;
      }
      if (encoded !== undefined && maxPromptTokens !== undefined && encoded.length > maxPromptTokens) {
        counts.tooLong += 1;
        example('tooLong', c.where, `${encoded.length} prompt tokens > maxPromptTokens ${maxPromptTokens}`, {
          id: c.id,
          excerpt: excerptOf(c.messages),
        });
        continue;
      }
      await keep(c);
      keptNow.push(c);
    }
    // With a shuffled subset, which prompts are kept is known only at the end.
    if (subset === undefined) await countOverContext(keptNow);
  };

  const progressEveryMs = input.progressEveryMs ?? 10_000;
  let nextProgressMs = Date.now() + progressEveryMs;
  try {
    for await (const row of input.rows) {
      if (input.signal?.aborted === true)
        throw new CancelledError(
          `prepare of dataset "${input.dataset}" stopped after ${counts.rowsRead} rows (${String(input.signal.reason)}); its prompt file was left as it was`,
        );
      counts.rowsRead += 1;
      if (input.onProgress !== undefined && (counts.rowsRead & 1023) === 0 && Date.now() >= nextProgressMs) {
        nextProgressMs = Date.now() + progressEveryMs;
        input.onProgress({ ...counts });
      }
      if (!row.ok) {
        counts.malformed += 1;
        example('malformed', row.where, row.reason, row.excerpt === undefined ? {} : { excerpt: row.excerpt });
        continue;
      }
      const shaped = shapePrompt(row.messages, input.turns);
      if (shaped.kind !== 'prompt') {
        counts[shaped.kind] += 1;
        example(shaped.kind, row.where, shaped.reason, row.id === undefined ? {} : { id: row.id });
        continue;
      }
      const id = promptId(row.id, shaped.messages, row.tools);
      const hash = messagesHash(shaped.messages, row.tools);
      if (!seen.add(hash)) {
        counts.duplicates += 1;
        example('duplicates', row.where, 'same messages as an earlier row of this dataset', { id });
        continue;
      }
      const earlier = input.keptBefore.find((k) => k.hashes.has(hash));
      if (earlier !== undefined) {
        counts.duplicatesAcross += 1;
        example('duplicatesAcross', row.where, `same messages as a prompt dataset "${earlier.dataset}" kept`, { id });
        continue;
      }
      pending.push({
        id,
        messages: shaped.messages,
        tools: row.tools,
        hash,
        where: row.where,
        droppedTrailing: shaped.droppedTrailing,
      });
      if ((maxPromptTokens === undefined && contextCheck === undefined) || pending.length >= ENCODE_CHUNK)
        await flush();
      if (full) break;
    }
    await flush();
    if (subset !== undefined) {
      let measure: Measured[] = [];
      for await (const s of subset.lines()) {
        await writer.writeLine(s.line);
        kept?.add(s.hash);
        counts.kept += 1;
        if (contextCheck === undefined) continue;
        const rec = JSON.parse(s.line) as { id: string; messages: ChatMessage[]; tools?: unknown[] };
        const where = { file: input.promptsFile, row: counts.kept - 1, line: counts.kept };
        measure.push({ id: rec.id, messages: rec.messages, tools: rec.tools, where });
        if (measure.length >= ENCODE_CHUNK) {
          await countOverContext(measure);
          measure = [];
        }
      }
      await countOverContext(measure);
    }
    const written = await writer.commit(input.beforeCommit);
    return { written, counts, examples: log.examples, kept };
  } catch (e: unknown) {
    await writer.abort();
    throw e;
  } finally {
    await subset?.close();
  }
}

/** The hashes of a prepared prompt file's prompts (for `dedupeAcross` when its dataset is unchanged). */
export async function keptHashesOf(promptsFile: string): Promise<Hash64Set> {
  const hashes = new Hash64Set();
  for await (const { line, text } of readRawLines(promptsFile)) {
    try {
      const rec = JSON.parse(text ?? '') as { messages: ChatMessage[]; tools?: unknown[] };
      hashes.add(messagesHash(rec.messages, rec.tools));
    } catch (e: unknown) {
      throw new Error(
        `${promptsFile}:${line}: not a line prepare wrote (${errorMessage(e)}); delete the file and prepare again`,
        { cause: e },
      );
    }
  }
  return hashes;
}
