/**
 * The post-processing stage's processors: `tokenize` (one dataset's generation records or
 * conversations → a staged `datasets` folder of the rows the training dataset lacks) and `merge`
 * (the round's staged folders → one merge into the training dataset, one validation report).
 * Pure async functions of `(data, deps)`: no BullMQ here (see worker.ts).
 *
 * Which rows a round adds: every row of the sources that the training dataset does not hold yet,
 * by sample key (`dataset` + `id` columns of the target). So a round after new generations
 * appends only the new rows, a round with nothing new merges nothing, and a round after a
 * `rollback` adds back the rows the rollback removed.
 *
 * What a round costs grows with the new data only: the target's sample keys are looked up in the
 * id index kept beside it (16 bytes a row in memory, never its shards), and a generations folder
 * is read from where the last merged round stopped (offsets committed with the target's version,
 * so a rollback or a crash before the swap makes the next round read those lines again). A
 * tokenize job returns its offsets with its result (`sourceOffsets`); the merge commits them.
 */
import { rm, rmdir, stat } from 'node:fs/promises';
import path from 'node:path';

import {
  DatasetIndex,
  DatasetMergeError,
  SourceOffsetsSchema,
  commitOffsetsWithoutMerge,
  offsetsOfState,
  readDatasetMeta,
  stateKey,
  type DatasetOffsets,
  type SourceOffsets,
  MergePayloadSchema,
  MergeJobResultSchema,
  PayloadError,
  TokenizePayloadSchema,
  TokenizeResultSchema,
  assertSampleKeyedTarget,
  errorMessage,
  mergeIntoTarget,
  parsePayload,
  readHeldOutIds,
  readHfDataset,
  readShardBatches,
  writeHfDataset,
  type HfRow,
  type InvalidLineSchema,
  type Logger,
  type MergeOptions,
  type MergePayload,
  type MergeReport,
  type MergeReportSummary,
  type MergeJobResult,
  type TokenizePayload,
  type TokenizeResult,
} from '../../shared/index.js';
import type { z } from 'zod';
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
import { fileOffset, planResume, tokenizeSettings, type FileStart } from './generation-offsets.js';
import { listGenerationFiles } from './tokenize-records.js';
import { wholeConversationRows } from './tokenize-conversation-rows.js';

/** A phase of the pipeline checklist that post-processing moves (`keys.phases()`). */
export type PostprocessPhase = 'tokenize' | 'merge';
export type PhaseState = 'pending' | 'in_progress' | 'completed' | 'failed';

/** What the tokenize processor needs from the outside world. */
export interface TokenizeDeps {
  /** The tokenize context of the target's tokenizer (loaded once per process). */
  /** The tokenize context for a dataset's template variables (`datasets[].chatTemplateKwargs`). */
  tokenizeContext(templateKwargs?: Record<string, unknown>): Promise<TokenizeContext>;
  /** Threads that tokenize a large conversation dataset (`postprocess.tokenizeThreads`); default one per core. */
  tokenizeThreads?: number;
  setPhase(phase: PostprocessPhase, state: PhaseState): Promise<void>;
  logger: Logger;
}

/** What the merge processor needs from the outside world. */
export interface MergeDeps {
  /** Return values of the round's tokenize jobs (BullMQ's `getChildrenValues()`, values only). */
  childResults(): Promise<unknown[]>;
  setPhase(phase: PostprocessPhase, state: PhaseState): Promise<void>;
  /** Records how the round ended (the round's hash), once the merge is done. */
  roundCompleted(result: MergeJobResult): Promise<void>;
  /** Turns token ids into text for the report's spot-check samples. */
  decode?: (inputIds: number[]) => string;
  /** The merge itself; {@link mergeIntoTarget} unless a test passes another. */
  merge?: (opts: MergeOptions) => ReturnType<typeof mergeIntoTarget>;
  logger: Logger;
}

type InvalidLine = z.infer<typeof InvalidLineSchema>;

/**
 * Whether a source has more invalid lines than it may: more than `maxInvalidFraction` of its
 * lines (with 0, any invalid line is too many). Returns the error to fail the job with, naming
 * the first invalid lines, or undefined.
 */
export function invalidLinesError(
  dataset: string,
  stats: { lines: number; invalid: number; invalidExamples: readonly InvalidLine[] },
  maxInvalidFraction: number,
  hint = '',
): PayloadError | undefined {
  if (stats.invalid === 0 || stats.invalid <= maxInvalidFraction * stats.lines) return undefined;
  const examples = stats.invalidExamples
    .slice(0, 3)
    .map((x) => `${x.file}:${x.line}: ${x.reason}`)
    .join('; ');
  const allowed =
    maxInvalidFraction === 0 ? 'none allowed' : `at most ${Math.round(maxInvalidFraction * 1000) / 10}% allowed`;
  return new PayloadError(
    `dataset ${dataset}: ${stats.invalid} of ${stats.lines} lines are invalid (${allowed}): ${examples}${hint}`,
  );
}

async function hasState(dir: string): Promise<boolean> {
  try {
    return (await stat(path.join(dir, 'state.json'))).isFile();
  } catch {
    return false;
  }
}

/**
 * Sample ids of `dataset` already in the training dataset at `target` (empty when there is no
 * target yet). Reads the `id` and `dataset` columns of every shard. A target without both
 * columns is refused ({@link assertSampleKeyedTarget}: a DatasetMergeError naming the missing
 * column and the fix), since its rows cannot be matched with the new ones.
 */
export async function mergedSampleIds(target: string, dataset: string): Promise<Set<string>> {
  const ids = new Set<string>();
  if (!(await hasState(target))) return ids;
  await assertSampleKeyedTarget(target);
  const ds = await readHfDataset(target);
  for (const shard of ds.meta.shards) {
    for await (const batch of readShardBatches(path.join(target, shard))) {
      const idCol = batch.getChild('id');
      const dsCol = batch.getChild('dataset');
      if (idCol === null || dsCol === null) continue;
      for (let i = 0; i < batch.numRows; i++) {
        if (dsCol.get(i) !== dataset) continue;
        const id: unknown = idCol.get(i);
        if (typeof id === 'string') ids.add(id);
      }
    }
  }
  return ids;
}

/** The sample keys of the training dataset as it is, looked up in its id index. */
export interface MergedKeys {
  /** The version's key (see `stateKey`); null when there is no target yet. */
  basis: string | null;
  /** state.json of that version, when there is one. */
  stateText: string | undefined;
  has(dataset: string, id: string): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * Opens the id index of the training dataset at `target` for lookups (an index file that is
 * missing or stale is rebuilt in memory from its shard, with a log line; the merge writes it).
 * A target without `id` and `dataset` columns is refused ({@link assertSampleKeyedTarget}).
 */
export async function openMergedKeys(target: string): Promise<MergedKeys> {
  if (!(await hasState(target))) {
    return { basis: null, stateText: undefined, has: () => Promise.resolve(false), close: () => Promise.resolve() };
  }
  await assertSampleKeyedTarget(target);
  const meta = await readDatasetMeta(target);
  const index = await DatasetIndex.open(target, meta.shards, { persist: false });
  try {
    const filter = await index.memoryFilter();
    return {
      basis: stateKey(meta.stateText),
      stateText: meta.stateText,
      has: (dataset, id) => filter.has(dataset, id),
      close: () => index.close(),
    };
  } catch (e: unknown) {
    await index.close();
    throw e;
  }
}

/** What a tokenize job returns: its result, and for generation records how far it read. */
export type TokenizeJobResult = TokenizeResult & { sourceOffsets?: SourceOffsets };

/** Where each generation file of a dataset starts, from the offsets committed with `merged`'s version. */
async function resumeOf(
  p: TokenizePayload,
  merged: MergedKeys,
  ctx: TokenizeContext,
  log: Logger,
): Promise<Map<string, FileStart>> {
  const committed = merged.stateText === undefined ? undefined : await offsetsOfState(p.target, merged.stateText);
  const plan = await planResume(
    await listGenerationFiles(p.source),
    committed?.datasets[p.dataset],
    tokenizeSettings(ctx),
  );
  if (plan.fullRead !== undefined) {
    log.info(
      { source: p.source, reason: plan.fullRead },
      'reading every generation line of the dataset (no usable offsets)',
    );
  } else {
    log.info(
      { source: p.source, files: plan.starts.size },
      'reading only the generation lines written since the last merged round',
    );
  }
  return plan.starts;
}

/**
 * Tokenizes one dataset of a post-process round: reads its generation records (only the lines
 * not yet read into the training dataset) or its conversation file, leaves out rows the
 * training dataset already holds, and writes the rest as a `datasets` folder at `stagedDir`
 * (replacing what an earlier attempt left there). Fails — unrecoverably, with a message naming
 * the source — when the source cannot be read or has more invalid lines than
 * `maxInvalidFraction` allows; the staged folder is then removed.
 */
export async function processTokenize(data: unknown, deps: TokenizeDeps): Promise<TokenizeJobResult> {
  const p: TokenizePayload = parsePayload(TokenizePayloadSchema, data, 'tokenize');
  const started = Date.now();
  const log = deps.logger.child({ dataset: p.dataset, flowId: p.flowId });
  await deps.setPhase('tokenize', 'in_progress');
  const ctx = await deps.tokenizeContext(p.templateKwargs);
  const merged = await openMergedKeys(p.target);
  try {
    return await tokenizeAgainst(p, merged, ctx, log, started, deps.tokenizeThreads);
  } finally {
    await merged.close();
  }
}

async function tokenizeAgainst(
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

/** The brief form of a merge report that a merge job returns. */
export function summarizeReport(report: MergeReport, reportPath: string): MergeReportSummary {
  return {
    mergeId: report.mergeId,
    target: report.target,
    reportPath,
    firstMerge: report.firstMerge,
    oldRows: report.oldRows,
    newRows: report.newRows,
    rows: report.rows,
    oldTokens: report.oldTokens,
    newTokens: report.newTokens,
    tokens: report.tokens,
    supervisedTokens: report.supervisedTokens,
    lossMaskCoverage: report.lossMaskCoverage,
    newLossMaskCoverage: report.newLossMaskCoverage,
    shards: report.shards,
    newShards: report.newShards.length,
    checkedSamples: report.checkedSamples,
    problems: report.problems,
    warnings: report.warnings,
  };
}

/** The offsets the round's tokenize jobs returned beside their results (generation datasets). */
function sourceOffsetsOf(values: readonly unknown[], log: Logger): SourceOffsets[] {
  const out: SourceOffsets[] = [];
  for (const v of values) {
    const raw = typeof v === 'object' && v !== null ? (v as { sourceOffsets?: unknown }).sourceOffsets : undefined;
    if (raw === undefined) continue;
    const parsed = SourceOffsetsSchema.safeParse(raw);
    if (parsed.success) out.push(parsed.data);
    else
      log.warn(
        { issues: parsed.error.issues.slice(0, 3) },
        'a tokenize job returned offsets that do not parse: its lines are read again next round',
      );
  }
  return out;
}

/** Every row of the staged folders, in order. */
async function* stagedRows(dirs: readonly string[]): AsyncGenerator<HfRow> {
  for (const dir of dirs) {
    const ds = await readHfDataset(dir);
    for await (const row of ds.rows()) yield row as unknown as HfRow;
  }
}

/**
 * Merges a post-process round: the staged rows of every tokenize job of the round (datasets in
 * name order) go into the training dataset in ONE merge — one validation report, one rollback
 * step — keyed by the round's `mergeKey`, so a retried job finds its merge in the target's
 * history instead of appending twice. A round where no dataset has new rows merges nothing.
 * The staged folders are removed once the merge is in place. A merge refused by validation
 * fails the job unrecoverably with the problems found; the target is unchanged.
 */
export async function processMerge(data: unknown, deps: MergeDeps): Promise<MergeJobResult> {
  const p: MergePayload = parsePayload(MergePayloadSchema, data, 'merge');
  const log = deps.logger.child({ flowId: p.flowId });
  const values = await deps.childResults();
  const datasets = values
    .map((v, i) => parsePayload(TokenizeResultSchema, v, `merge: result of tokenize job ${i + 1}`))
    .sort((a, b) => (a.dataset < b.dataset ? -1 : a.dataset > b.dataset ? 1 : 0));
  const offsets = sourceOffsetsOf(values, log);
  await deps.setPhase('tokenize', 'completed');
  await deps.setPhase('merge', 'in_progress');

  const withRows = datasets.filter((d) => d.rows > 0);
  let result: MergeJobResult;
  if (withRows.length === 0) {
    log.info({ datasets: datasets.length }, 'nothing new to merge');
    // The lines read made no row the target lacks: the next round need not read them again.
    if (offsets.length > 0 && (await commitOffsetsWithoutMerge(p.target, offsets))) {
      log.info({ datasets: offsets.map((o) => o.dataset) }, 'tokenize offsets recorded');
    }
    result = { flowId: p.flowId, status: 'nothing-new', datasets, report: null };
  } else {
    const merge = deps.merge ?? mergeIntoTarget;
    const opts: MergeOptions = {
      target: p.target,
      newRows: stagedRows(withRows.map((d) => d.stagedDir)),
      runDir: p.runDir,
      shardSizeMiB: p.shardSizeMiB,
      mergeKey: p.mergeKey,
      requireSampleKey: true,
      tokenizeOffsets: offsets,
      endOfTurn: withRows.map((d) => ({
        dataset: d.dataset,
        stoppedRows: d.rows + d.alreadyMerged - d.keptTruncated,
        withoutEndOfTurn: d.stopWithoutEndOfTurn,
      })),
    };
    if (deps.decode !== undefined) opts.decode = deps.decode;
    if (p.verifyWithPython !== undefined) opts.verifyWithPython = p.verifyWithPython;
    let merged: Awaited<ReturnType<typeof mergeIntoTarget>>;
    try {
      merged = await merge(opts);
    } catch (e: unknown) {
      if (e instanceof DatasetMergeError) throw e;
      // A staged folder that vanished or cannot be read: name the round in the message.
      throw new DatasetMergeError(`merge of ${p.flowId} failed: ${errorMessage(e)}`, { cause: e });
    }
    result = {
      flowId: p.flowId,
      status: merged.alreadyMerged ? 'already-merged' : 'merged',
      datasets,
      report: summarizeReport(merged.report, merged.reportPath),
    };
    log.info(
      {
        status: result.status,
        newRows: merged.report.newRows,
        rows: merged.report.rows,
        reportPath: merged.reportPath,
      },
      'round merged',
    );
  }
  for (const d of datasets) await rm(d.stagedDir, { recursive: true, force: true });
  // The round's staging folder, once empty.
  for (const dir of new Set(datasets.map((d) => path.dirname(d.stagedDir)))) await rmdir(dir).catch(() => undefined);
  await deps.roundCompleted(result);
  await deps.setPhase('merge', 'completed');
  return MergeJobResultSchema.parse(result);
}
