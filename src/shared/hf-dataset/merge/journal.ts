// The merge history in `<target>/.tokenmill/history/` and the repair of interrupted merges.
import { readFile, rm, unlink } from 'node:fs/promises';
import path from 'node:path';

import { exists, fsyncDir, isErrno, readdirOrEmpty, removeTempFiles } from '../../util/index.js';
import { CONTROL_DIR, canonicalState, controlDir, historyDir, log, stagingRoot, type HistoryRecord } from './common.js';
import { acquireLock } from './lock.js';
import type { DatasetState } from '../schema.js';
import { removeEmptyDir } from '../writer.js';

export async function readHistory(target: string): Promise<{ file: string; record: HistoryRecord }[]> {
  const dir = historyDir(target);
  const names = (await readdirOrEmpty(dir)).filter((n) => n.endsWith('.json') && !n.startsWith('.')).sort();
  const out: { file: string; record: HistoryRecord }[] = [];
  for (const n of names) {
    const file = path.join(dir, n);
    out.push({ file, record: JSON.parse(await readFile(file, 'utf8')) as HistoryRecord });
  }
  return out;
}

export async function nextHistoryName(target: string, mergeId: string): Promise<string> {
  const names = (await readdirOrEmpty(historyDir(target))).filter((n) => /^\d{6}-/.test(n)).sort();
  const last = names[names.length - 1];
  const seq = last === undefined ? 1 : Number(last.slice(0, 6)) + 1;
  return `${String(seq).padStart(6, '0')}-${mergeId}.json`;
}

export async function readStateText(target: string): Promise<string | undefined> {
  try {
    return await readFile(path.join(target, 'state.json'), 'utf8');
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return undefined;
    throw e;
  }
}

export function listedFiles(stateText: string): Set<string> {
  try {
    const s = JSON.parse(stateText) as Partial<DatasetState>;
    return new Set((s._data_files ?? []).map((f) => f.filename));
  } catch {
    return new Set();
  }
}

/**
 * Finishes or undoes whatever an interrupted merge or rollback left behind. Call with the lock
 * held. Returns what it did (empty when there was nothing to repair).
 */
export async function repairLocked(target: string): Promise<string[]> {
  const actions: string[] = [];
  const parent = path.dirname(target);
  const base = path.basename(target);
  // Staging folders of first merges that never reached their rename.
  for (const name of await readdirOrEmpty(parent)) {
    if (name.startsWith(`${base}.merge-`)) {
      await rm(path.join(parent, name), { recursive: true, force: true });
      actions.push(`removed unfinished merge folder ${name}`);
    }
  }
  if (!(await exists(controlDir(target)))) return actions;
  for (const name of await readdirOrEmpty(stagingRoot(target))) {
    await rm(path.join(stagingRoot(target), name), { recursive: true, force: true });
    actions.push(`removed staging folder ${name}`);
  }
  await removeEmptyDir(stagingRoot(target));
  for (const name of await removeTempFiles(target)) actions.push(`removed temporary file ${name}`);
  for (const name of await removeTempFiles(historyDir(target)))
    actions.push(`removed temporary file ${CONTROL_DIR}/history/${name}`);
  for (const sub of ['index', 'offsets']) {
    for (const name of await removeTempFiles(path.join(controlDir(target), sub)))
      actions.push(`removed temporary file ${CONTROL_DIR}/${sub}/${name}`);
  }

  // The last history record must describe the current state; if the current state is the one
  // before it, that merge never committed (or was rolled back): remove what it added.
  for (;;) {
    const history = await readHistory(target);
    const last = history[history.length - 1];
    const current = await readStateText(target);
    if (last === undefined || current === undefined) break;
    const cur = canonicalState(current);
    if (cur === canonicalState(last.record.nextState)) break;
    if (last.record.previousState !== null && cur === canonicalState(last.record.previousState)) {
      const keep = listedFiles(current);
      for (const f of last.record.addedFiles) {
        if (keep.has(f)) continue;
        await rm(path.join(target, f), { force: true });
      }
      await fsyncDir(target);
      await unlink(last.file);
      await fsyncDir(historyDir(target));
      actions.push(
        `removed merge ${last.record.mergeId}, which is not in effect (${last.record.addedFiles.length} added files)`,
      );
      continue;
    }
    log().warn(
      { target, mergeId: last.record.mergeId },
      'state.json was changed outside tokenmill since the last merge',
    );
    break;
  }
  if (actions.length > 0) log().info({ target, actions }, 'repaired leftovers of an interrupted merge or rollback');
  return actions;
}

/** Repairs leftovers of an interrupted merge or rollback of `target` (takes the lock). */
export async function repairTarget(target: string): Promise<string[]> {
  const abs = path.resolve(target);
  const release = await acquireLock(abs);
  try {
    return await repairLocked(abs);
  } finally {
    await release();
  }
}
