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
import { rm, rmdir } from 'node:fs/promises';
import path from 'node:path';

import {
  DatasetMergeError,
  commitOffsetsWithoutMerge,
  MergePayloadSchema,
  MergeJobResultSchema,
  TokenizePayloadSchema,
  TokenizeResultSchema,
  errorMessage,
  mergeIntoTarget,
  parsePayload,
  type Logger,
  type MergeOptions,
  type MergePayload,
  type MergeJobResult,
  type TokenizePayload,
} from '../../shared/index.js';
import type { TokenizeContext } from './tokenize.js';
import { openMergedKeys } from './merged-keys.js';
import { tokenizeAgainst, type TokenizeJobResult } from './tokenize-dataset.js';
import { sourceOffsetsOf, stagedRows } from './merge-inputs.js';
import { summarizeReport } from './merge-summary.js';

export { invalidLinesError } from './invalid-lines.js';
export { mergedSampleIds, openMergedKeys, type MergedKeys } from './merged-keys.js';
export { type TokenizeJobResult } from './tokenize-dataset.js';
export { summarizeReport } from './merge-summary.js';

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
  /**
   * The id of `postprocess.dflash.maskToken` in the tokenizer, or a ConfigError saying what is
   * wrong with it (see `checkDflashMaskToken`); needed when the payload names a mask token.
   */
  dflashMaskTokenId?: (token: string) => number;
  /** The merge itself; {@link mergeIntoTarget} unless a test passes another. */
  merge?: (opts: MergeOptions) => ReturnType<typeof mergeIntoTarget>;
  logger: Logger;
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
    if (p.dflashMaskToken !== undefined) {
      if (deps.dflashMaskTokenId === undefined)
        throw new DatasetMergeError('postprocess.dflash.maskToken is set but this merge has no tokenizer to check it');
      opts.dflashMaskToken = { token: p.dflashMaskToken, id: deps.dflashMaskTokenId(p.dflashMaskToken) };
    }
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
