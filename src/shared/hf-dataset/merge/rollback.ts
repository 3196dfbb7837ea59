// Rollback: the dataset as it was before the last merge.
import { rm, unlink } from 'node:fs/promises';
import path from 'node:path';

import { ensureDir, fsyncDir, jsonText, writeFileAtomic } from '../../util/index.js';
import {
  DatasetMergeError,
  canonicalState,
  crashPoint,
  historyDir,
  log,
  newMergeId,
  type RollbackCrashPoint,
} from './common.js';
import { listedFiles, readHistory, readStateText, repairLocked } from './journal.js';
import { acquireLock } from './lock.js';

/** What {@link rollbackTarget} did. */
export interface RollbackResult {
  target: string;
  /** The merge that was undone. */
  undoneMergeId: string;
  undoneNewRows: number;
  /** The dataset now in place: the one before that merge. */
  restored: { rows: number; tokens: number; shards: number };
  removedFiles: string[];
  /** Merges still recorded: how many more rollbacks are possible (the first one excepted if it created the target). */
  remainingMerges: number;
  repaired: string[];
  reportPath: string;
}

/** Options of {@link rollbackTarget}. */
export interface RollbackOptions {
  target: string;
  /** Where `rollback-<ts>.json` is written. */
  runDir: string;
  crashAt?: RollbackCrashPoint;
}

/**
 * Restores the dataset as it was before the last merge: state.json goes back to its previous
 * content (one atomic rename; the old shards were never touched), then the shards that merge
 * added are deleted. A second call undoes the merge before that, and so on. Refuses (with
 * {@link DatasetMergeError}) when there is no recorded merge, when the last merge created the
 * target (there is no earlier dataset: delete the folder to start over), or when state.json
 * was changed outside tokenmill since that merge.
 */
export async function rollbackTarget(opts: RollbackOptions): Promise<RollbackResult> {
  const target = path.resolve(opts.target);
  const release = await acquireLock(target);
  try {
    const repaired = await repairLocked(target);
    const history = await readHistory(target);
    const last = history[history.length - 1];
    if (last === undefined) {
      throw new DatasetMergeError(`nothing to roll back: ${target} has no merge recorded by tokenmill`);
    }
    const { record } = last;
    if (record.previousState === null) {
      throw new DatasetMergeError(
        `cannot roll back merge ${record.mergeId}: it created ${target}, so there is no earlier dataset to restore ` +
          '(delete the folder to start over)',
      );
    }
    const current = await readStateText(target);
    if (current === undefined || canonicalState(current) !== canonicalState(record.nextState)) {
      throw new DatasetMergeError(
        `cannot roll back merge ${record.mergeId}: ${path.join(target, 'state.json')} was changed outside tokenmill since that merge`,
      );
    }
    await writeFileAtomic(path.join(target, 'state.json'), record.previousState);
    await crashPoint(opts.crashAt, 'rollback-after-swap');
    const keep = listedFiles(record.previousState);
    const removedFiles: string[] = [];
    for (const f of record.addedFiles) {
      if (keep.has(f)) continue;
      await rm(path.join(target, f), { force: true });
      removedFiles.push(f);
    }
    await fsyncDir(target);
    await unlink(last.file);
    await fsyncDir(historyDir(target));
    const result: RollbackResult = {
      target,
      undoneMergeId: record.mergeId,
      undoneNewRows: record.summary.newRows,
      restored: {
        rows: record.summary.oldRows,
        tokens: record.summary.oldTokens,
        shards: listedFiles(record.previousState).size,
      },
      removedFiles,
      remainingMerges: history.length - 1,
      repaired,
      reportPath: path.join(opts.runDir, `rollback-${newMergeId()}.json`),
    };
    await ensureDir(opts.runDir);
    await writeFileAtomic(result.reportPath, jsonText(result));
    log().info(
      { target, undone: record.mergeId, restored: result.restored },
      'rollback done: the dataset before the last merge is restored',
    );
    return result;
  } finally {
    await release();
  }
}

/** Merges recorded for `target`, oldest first. */
export async function listMerges(
  target: string,
): Promise<{ mergeId: string; createdAt: string; newRows: number; rows: number }[]> {
  const history = await readHistory(path.resolve(target));
  return history.map(({ record }) => ({
    mergeId: record.mergeId,
    createdAt: record.createdAt,
    newRows: record.summary.newRows,
    rows: record.summary.rows,
  }));
}
