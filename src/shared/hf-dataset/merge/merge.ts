// Merging new rows into the training dataset without ever destroying data (docs/design.md,
// invariant 8). The target's state.json is the commit point: the merged version is built and
// validated in a staging folder (old shards hard-linked, new ones added), then swapped in by one
// rename of state.json, so a crash at any step leaves the old dataset or the new one. The target's
// layout, the steps and the repair of leftovers: docs/design.md, Merge: layout and crash safety.
import { mkdir, readdir, rename, rm } from 'node:fs/promises';
import path from 'node:path';

import {
  ensureDir,
  exists,
  fsyncDir,
  jsonText,
  linkOrCopy,
  readdirOrEmpty,
  writeFileAtomic,
} from '../../util/index.js';
import {
  DatasetMergeError,
  controlDir,
  crashPoint,
  historyDir,
  log,
  newMergeId,
  stagingRoot,
  type HistoryRecord,
  type MergeOptions,
  type MergeResult,
} from './common.js';
import { endOfTurnFindings } from './end-of-turn.js';
import { nextHistoryName, readHistory, repairLocked } from './journal.js';
import { acquireLock } from './lock.js';
import { sampleKeyProblem } from './sample-key.js';
import { planMergeColumns, planSource, sortStateKeys, stageNewShards } from './stage.js';
import { validateMerged } from './validate.js';
import { pythonVerifierFor } from './verify-python.js';
import { DatasetIndex, type ShardKeyCollector } from './id-index.js';
import { moveExtraFiles, stageIndexAndOffsets } from './commit-files.js';
import { emptyAnchorHistogram } from '../anchor-positions.js';
import { readDatasetMeta, readShardSchema, type DatasetMeta, type ShardScan } from '../reader.js';
import {
  columnsOfSchema,
  columnsString,
  newDatasetInfo,
  sameColumns,
  type ColumnSpec,
  type DatasetState,
} from '../schema.js';
import { newFingerprint, removeEmptyDir } from '../writer.js';

/**
 * Merges new rows into the training dataset at `target` (docs/design.md, invariant 8): old rows
 * first, then the new ones; builds and validates the merged dataset beside the current one, then
 * swaps it in with one atomic rename of state.json. See docs/design.md (Merge: layout and crash
 * safety) for the layout and the crash guarantees.
 *
 * Refuses (throws {@link DatasetMergeError}, target untouched) when the schemas are
 * incompatible — the message names the column and both types — or when validation finds a
 * problem: merged rows/tokens differ from old + new, a shard's schema differs, loss_mask
 * coverage of the new rows is 0, a sampled row reads back different from what was written, or
 * `verifyMerged` reports one. The report is written to `<runDir>/merge-report-<mergeId>.json`
 * either way and attached to the error.
 */
export async function mergeIntoTarget(opts: MergeOptions): Promise<MergeResult> {
  const started = Date.now();
  const target = path.resolve(opts.target);
  const mergeId = newMergeId();
  const mlog = log().child({ target, mergeId });
  // postprocess.verifyWithPython: the interpreter is checked before anything else is done.
  const python = await pythonVerifierFor(opts);
  const release = await acquireLock(target);
  let staging: string | undefined;
  let oldIndex: DatasetIndex | undefined;
  try {
    const repaired = await repairLocked(target);
    if (opts.mergeKey !== undefined) {
      const prior = (await readHistory(target)).find((h) => h.record.mergeKey === opts.mergeKey);
      if (prior !== undefined) {
        mlog.info(
          { mergeKey: opts.mergeKey, mergedAs: prior.record.mergeId },
          'these rows are already merged: nothing to do',
        );
        return { report: prior.record.report, reportPath: prior.record.reportPath, repaired, alreadyMerged: true };
      }
    }

    // -- 1. what is there, and does the new data fit it
    const targetExists = await exists(target);
    let old: DatasetMeta | undefined;
    if (targetExists) {
      if ((await readdir(target)).length > 0) old = await readDatasetMeta(target);
    }
    const firstMerge = old === undefined;
    const source = await planSource(opts);
    let columns: ColumnSpec[];
    let dropped: string[] = [];
    const oldScans: ShardScan[] = [];
    const warnings: string[] = [];
    if (old !== undefined) {
      const firstShard = old.shards[0];
      if (firstShard === undefined) throw new DatasetMergeError(`${target}: state.json lists no shard`);
      const targetColumns = columnsOfSchema(await readShardSchema(path.join(target, firstShard)));
      const keyProblem = opts.requireSampleKey === true ? sampleKeyProblem(target, targetColumns) : undefined;
      if (keyProblem !== undefined) throw new DatasetMergeError(keyProblem, { problems: [keyProblem] });
      const plan = planMergeColumns(targetColumns, source.columns, source.kind);
      if (plan.problems.length > 0) {
        throw new DatasetMergeError(plan.problems.join('\n'), { problems: plan.problems });
      }
      columns = plan.columns;
      dropped = plan.dropped;
      if (dropped.length > 0) warnings.push(`columns the target does not have were left out: ${dropped.join(', ')}`);
      // The old shards' counts, columns and keys come from the index (built once from a shard
      // that has none); the shards themselves are not read.
      oldIndex = await DatasetIndex.open(target, old.shards, { persist: true });
      for (const { shard: s, header: h } of oldIndex.shards) {
        if (!sameColumns(h.columns, columns)) {
          throw new DatasetMergeError(
            `cannot merge: the target's shard ${s} has columns (${columnsString(h.columns)}) but ${firstShard} has (${columnsString(columns)})`,
          );
        }
        warnings.push(...h.problems);
        oldScans.push({
          file: path.join(target, s),
          columns: h.columns,
          rows: h.rows,
          tokens: h.tokens,
          supervisedTokens: h.supervisedTokens,
          anchorPositions: h.anchorPositions ?? emptyAnchorHistogram(),
          batches: 0,
          problems: h.problems,
        });
      }
    } else {
      columns = source.columns;
    }
    const oldShards = old?.shards ?? [];
    const endOfTurn = endOfTurnFindings(opts.endOfTurn ?? []);
    if (endOfTurn.length > 0) {
      mlog.warn(
        { findings: endOfTurn },
        "many new rows lack end-of-turn supervision: check the server's stop-token handling",
      );
      warnings.push(...endOfTurn);
    }

    // -- 2. build the merged dataset in a staging folder
    staging = firstMerge ? `${target}.merge-${mergeId}` : path.join(stagingRoot(target), mergeId);
    await mkdir(staging, { recursive: true });
    mlog.info({ staging, firstMerge, oldShards: oldShards.length }, 'merge: staging');
    const taken = new Set([...oldShards, ...(await readdirOrEmpty(target))]);
    const newPart = await stageNewShards(staging, opts, source, columns, oldShards.length, taken, mergeId);
    await crashPoint(opts.crashAt, 'after-stage');

    let linked = 0;
    let copied = 0;
    for (const s of oldShards) {
      const to = path.join(staging, s);
      await ensureDir(path.dirname(to));
      if ((await linkOrCopy(path.join(target, s), to)) === 'link') linked++;
      else copied++;
    }
    await fsyncDir(staging);
    const infoText = old?.infoText ?? jsonText(newDatasetInfo(columns));
    await writeFileAtomic(path.join(staging, 'dataset_info.json'), infoText);
    const allShards = [...oldShards, ...newPart.files];
    const nextState: DatasetState = {
      ...(old?.state ?? {
        _format_columns: null,
        _format_kwargs: {},
        _format_type: null,
        _output_all_columns: false,
        _split: null,
      }),
      _data_files: allShards.map((filename) => ({ filename })),
      _fingerprint: newFingerprint(),
    };
    const nextStateText = jsonText(sortStateKeys(nextState));
    await writeFileAtomic(path.join(staging, 'state.json'), nextStateText);
    await crashPoint(opts.crashAt, 'after-link');

    // -- 3. validate the staged folder and write the report
    const newScans = new Map<string, { scan: ShardScan; collector: ShardKeyCollector }>();
    const report = await validateMerged({
      staging,
      target,
      mergeId,
      firstMerge,
      columns,
      dropped,
      oldShards,
      oldScans,
      newPart: { ...newPart, linked: linked + newPart.linked, copied: copied + newPart.copied },
      newScans,
      warnings,
      opts,
      started,
    });
    if (report.ok) await python?.check(staging, report);
    const extraFiles = await stageIndexAndOffsets(
      staging,
      target,
      old,
      newPart.files,
      newScans,
      oldIndex,
      nextStateText,
      opts,
      report,
    );
    const reportPath = path.join(opts.runDir, `merge-report-${mergeId}.json`);
    await ensureDir(opts.runDir);
    await writeFileAtomic(reportPath, jsonText(report));
    if (!report.ok) {
      mlog.error(
        { problems: report.problems, reportPath },
        'merge refused: validation failed; the target is unchanged',
      );
      throw new DatasetMergeError(
        `merge refused, the target is unchanged:\n  ${report.problems.join('\n  ')}\n(report: ${reportPath})`,
        {
          problems: report.problems,
          report,
        },
      );
    }
    await crashPoint(opts.crashAt, 'after-validate');

    // -- 4./5. record, move the new shards in, swap state.json
    const record: HistoryRecord = {
      version: 1,
      mergeId,
      createdAt: report.createdAt,
      previousState: old?.stateText ?? null,
      nextState: nextStateText,
      addedFiles: [...newPart.files, ...extraFiles],
      mergeKey: opts.mergeKey ?? null,
      report,
      reportPath,
      summary: {
        oldRows: report.oldRows,
        newRows: report.newRows,
        rows: report.rows,
        oldTokens: report.oldTokens,
        newTokens: report.newTokens,
        tokens: report.tokens,
        shards: report.shards,
      },
    };
    if (firstMerge) {
      const hist = historyDir(staging);
      await ensureDir(hist);
      await writeFileAtomic(path.join(hist, await nextHistoryName(staging, mergeId)), jsonText(record));
      await fsyncDir(controlDir(staging));
      await fsyncDir(staging);
      await crashPoint(opts.crashAt, 'after-journal');
      await rename(staging, target);
      staging = undefined;
      await fsyncDir(path.dirname(target));
      await crashPoint(opts.crashAt, 'after-swap');
    } else {
      await ensureDir(historyDir(target));
      await writeFileAtomic(path.join(historyDir(target), await nextHistoryName(target, mergeId)), jsonText(record));
      await crashPoint(opts.crashAt, 'after-journal');
      for (const f of newPart.files) await rename(path.join(staging, f), path.join(target, f));
      await moveExtraFiles(staging, target, extraFiles);
      // load_from_disk needs dataset_info.json; a target without one gets the merged folder's
      // (it matches the old shards' schema too, so the old state stays loadable).
      if (old?.infoText === undefined)
        await rename(path.join(staging, 'dataset_info.json'), path.join(target, 'dataset_info.json'));
      await fsyncDir(target);
      await crashPoint(opts.crashAt, 'between-renames');
      await writeFileAtomic(path.join(target, 'state.json'), nextStateText);
      await crashPoint(opts.crashAt, 'after-swap');
    }
    mlog.info(
      { rows: report.rows, newRows: report.newRows, tokens: report.tokens, shards: report.shards, reportPath },
      'merge committed',
    );
    return { report, reportPath, repaired, alreadyMerged: false };
  } finally {
    await oldIndex?.close();
    if (staging !== undefined) {
      await rm(staging, { recursive: true, force: true }).catch((e: unknown) => {
        mlog.warn({ err: e, staging }, 'could not remove the staging folder; the next merge removes it');
      });
      // Leave no empty control folders behind in a target that had none.
      await removeEmptyDir(stagingRoot(target));
      await removeEmptyDir(controlDir(target));
    }
    await release();
  }
}
