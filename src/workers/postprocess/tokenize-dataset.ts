import { rm } from 'node:fs/promises';
import path from 'node:path';

import {
  readHeldOutIds,
  writeHfDataset,
  type DatasetOffsets,
  type HfRow,
  type Logger,
  type SourceOffsets,
  type TokenizePayload,
  type TokenizeResult,
} from '../../shared/index.js';
import {
  emptyConversationStats,
  emptyGenerationStats,
  rowsFromGenerations,
  type ConversationTokenizeStats,
  type GenerationTokenizeStats,
  type TokenizeContext,
  type TokenizedRow,
} from './tokenize.js';
import { rowsFromConversationsPooled } from './tokenize-pool.js';
import { fileOffset, tokenizeSettings, type FileStart } from './generation-offsets.js';
import { wholeConversationRows } from './tokenize-conversation-rows.js';
import { invalidLinesError } from './invalid-lines.js';
import type { MergedKeys } from './merged-keys.js';
import { resumeOf } from './tokenize-resume.js';

/** What a tokenize job returns: its result, and for generation records how far it read. */
export type TokenizeJobResult = TokenizeResult & { sourceOffsets?: SourceOffsets };

/**
 * One dataset of a round tokenized against the training dataset as it is (`merged`): the rows
 * it lacks, less the prompts held out for eval, written as a `datasets` folder at `stagedDir`.
 */
export async function tokenizeAgainst(
  p: TokenizePayload,
  merged: MergedKeys,
  ctx: TokenizeContext,
  log: Logger,
  started: number,
  threads: number | undefined,
): Promise<TokenizeJobResult> {
  const resume = p.kind === 'generations' ? await resumeOf(p, merged, ctx, log) : undefined;
  const positions = new Map<string, FileStart>();

  const genStats: GenerationTokenizeStats = emptyGenerationStats();
  const convStats: ConversationTokenizeStats = emptyConversationStats();
  const stats = p.kind === 'generations' ? genStats : convStats;
  const conversationRows =
    p.kind === 'generations' && p.rows === 'conversation'
      ? await wholeConversationRows(p.source, resume, ctx, p.dataset)
      : undefined;
  const source: AsyncGenerator<TokenizedRow, unknown> =
    p.kind === 'generations'
      ? rowsFromGenerations(p.source, {
          ctx,
          dataset: p.dataset,
          stats: genStats,
          logger: log,
          resume,
          positions,
          ...(conversationRows === undefined ? {} : { conversationRows }),
        })
      : rowsFromConversationsPooled(p.source, { ctx, dataset: p.dataset, stats: convStats, logger: log, threads });
  let alreadyMerged = 0;
  // The eval split's prompts and those of the same content (written by the producer): never
  // trained on, even when generated before the split existed. `<runDir>/<dataset>/`, the run
  // folder being the staged folder's (`<runDir>/postprocess/<flowId>/<dataset>`).
  const heldOut = await readHeldOutIds(path.join(path.resolve(p.stagedDir, '../../..'), p.dataset));
  let heldOutRows = 0;
  async function* fresh(): AsyncGenerator<HfRow> {
    for await (const row of source) {
      // Any invalid line is fatal when none is allowed: stop reading at once.
      if (p.maxInvalidFraction === 0 && stats.invalid > 0) break;
      if (heldOut?.has(row.id) === true) {
        heldOutRows += 1;
        continue;
      }
      if (await merged.has(row.dataset, row.id)) {
        alreadyMerged += 1;
        continue;
      }
      yield row;
    }
  }

  await rm(p.stagedDir, { recursive: true, force: true });
  const written = await writeHfDataset(p.stagedDir, fresh(), { shardSizeMiB: p.shardSizeMiB });
  // Generation lines count against the share over the whole dataset read so far (the lines of
  // earlier rounds too), so a small incremental round is not failed by one old bad line.
  const linesBefore = resume === undefined ? 0 : [...resume.values()].reduce((n, s) => n + s.lines, 0);
  const invalid = invalidLinesError(
    p.dataset,
    { ...stats, lines: stats.lines + linesBefore },
    p.maxInvalidFraction,
    p.kind === 'generations'
      ? '; fix or delete the lines named (back up the file first), then run `tokenmill postprocess -c <config>` again'
      : '',
  );
  if (invalid !== undefined) {
    await rm(p.stagedDir, { recursive: true, force: true });
    throw invalid;
  }
  const result: TokenizeJobResult = {
    dataset: p.dataset,
    kind: p.kind,
    stagedDir: p.stagedDir,
    lines: stats.lines,
    rows: written.rows,
    tokens: written.tokens,
    supervisedTokens: written.supervisedTokens,
    alreadyMerged,
    keptTruncated: genStats.keptTruncated,
    stopWithoutEndOfTurn: genStats.stopWithoutEndOfTurn,
    droppedTruncated: genStats.droppedTruncated,
    droppedAborted: genStats.droppedAborted,
    droppedEmpty: genStats.droppedEmpty,
    droppedUnsupervised: convStats.droppedUnsupervised,
    duplicates: stats.duplicates,
    invalid: stats.invalid,
    invalidExamples: stats.invalidExamples.slice(0, 5),
    durationMs: Date.now() - started,
  };
  if (p.kind === 'generations') {
    const files: DatasetOffsets['files'] = {};
    for (const [name, end] of [...positions.entries()].sort(([a], [b]) => (a < b ? -1 : 1))) {
      files[name] = await fileOffset(path.join(p.source, name), end);
    }
    result.sourceOffsets = {
      dataset: p.dataset,
      basis: merged.basis,
      offsets: { source: p.source, settings: tokenizeSettings(ctx), files },
    };
  }
  if (heldOutRows > 0)
    log.warn(
      { heldOutRows, stagedDir: p.stagedDir },
      `${heldOutRows} rows of prompts held out for eval (by id or the same content) left out of the training data`,
    );
  log.info(
    { rows: result.rows, tokens: result.tokens, alreadyMerged, invalid: result.invalid, stagedDir: p.stagedDir },
    'dataset tokenized',
  );
  return result;
}
