// Merging new rows into the training dataset without ever destroying data (DESIGN invariant 8).
//
// The target stays a plain `datasets` folder at a fixed path (so that a trainer, a bind mount or
// rsync see an ordinary directory). Its state.json is the commit point:
//
//   <target>/data-…arrow            shards; old ones are never modified, new ones are added
//   <target>/dataset_info.json      kept as it is (written only if the target had none)
//   <target>/state.json             lists the shards of the current version; replaced atomically
//   <target>/.tokenmill/history/    one record per merge: the state.json before and after it and
//                                   the files it added (what rollback and repair need)
//   <target>/.tokenmill/staging/    the merged dataset being built (removed after each merge)
//   <target>.lock                   held while a merge, rollback or repair runs
//
// A merge (1) checks that the new rows fit the target's schema, (2) builds the complete merged
// dataset in a staging folder: old shards as hard links, new shards written (or linked from a
// staged folder), state.json listing old then new, (3) validates it, (4) writes the history
// record, moves the new shards into the target under names its state.json does not list, and
// (5) replaces state.json with one rename. `load_from_disk` reads only the shards state.json
// lists, so before step 5 the target is the old dataset and after it the new one; a crash at
// any step leaves one of the two. The first merge, with no target yet, builds the folder as a
// sibling `<target>.merge-<id>` and renames it into place.
//
// The next merge or rollback repairs leftovers first: staging folders are removed, and if the
// last history record is not in effect (its "after" state is not the current state.json), the
// files it added are removed with it.
import { hostname } from 'node:os';
import { mkdir, open, readFile, readdir, rename, rm, stat, unlink } from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';

import type { RecordBatch } from 'apache-arrow';

import { AppError, errorMessage } from '../errors.js';
import { logger } from '../logger.js';
import { ensureDir, exists, fsyncDir, isErrno, jsonText, linkOrCopy, readdirOrEmpty, removeTempFiles, writeFileAtomic } from './fs.js';
import { batchRowReader, readDatasetMeta, readHfDataset, readShardSchema, scanShard, type DatasetMeta, type ShardScan } from './reader.js';
import {
  REQUIRED_COLUMNS,
  cannotHold,
  columnsOfSchema,
  columnsString,
  defaultColumns,
  isRowColumn,
  newDatasetInfo,
  sameColumns,
  sameType,
  shardName,
  typeString,
  type ColumnSpec,
  type DatasetState,
  type HfRow,
  type HfTokenTypes,
} from './schema.js';
import { newFingerprint, removeEmptyDir, shardSizeBytes, writeShards, type RowRecord, type RowSource, type SampledRow } from './writer.js';

/** The component logger, resolved per call so that a root logger installed later applies. */
function log(): ReturnType<typeof logger> {
  return logger('hf-dataset');
}

/** Steps at which a merge can be made to SIGKILL itself, for crash tests. */
export const MERGE_CRASH_POINTS = [
  /** new shards written into the staging folder */
  'after-stage',
  /** old shards linked and metadata written: the staging folder is a complete dataset */
  'after-link',
  /** validation passed, report written */
  'after-validate',
  /** history record written, nothing moved into the target yet */
  'after-journal',
  /** new shards renamed into the target, state.json not yet replaced */
  'between-renames',
  /** state.json replaced (the merge is committed), staging not yet removed */
  'after-swap',
] as const;
export type MergeCrashPoint = (typeof MERGE_CRASH_POINTS)[number];

/** Steps at which a rollback can be made to SIGKILL itself. */
export const ROLLBACK_CRASH_POINTS = [
  /** state.json restored, the undone merge's shards and record not yet removed */
  'rollback-after-swap',
] as const;
export type RollbackCrashPoint = (typeof ROLLBACK_CRASH_POINTS)[number];

/** A merge or rollback refused or failed; the target is as it was. Never retried. */
export class DatasetMergeError extends AppError {
  readonly problems: readonly string[];
  readonly report: MergeReport | undefined;

  constructor(message: string, options: { problems?: readonly string[]; report?: MergeReport; cause?: unknown } = {}) {
    super(message, { cause: options.cause, retryable: false });
    this.problems = options.problems ?? [];
    this.report = options.report;
  }
}

/** The new rows of a merge: rows, or a folder written by {@link writeHfDataset}. */
export type MergeSource = RowSource<HfRow> | { stagedDir: string };

/** Options of {@link mergeIntoTarget}. */
export interface MergeOptions extends HfTokenTypes {
  /** The training dataset folder. May not exist yet (the first merge creates it). */
  target: string;
  newRows: MergeSource;
  /** Where the merge report is written (`merge-report-<mergeId>.json`). */
  runDir: string;
  /** Size cap of the new shards (see {@link HfWriteOptions.shardSizeMiB}). */
  shardSizeMiB: number;
  /** New rows read back and compared with what was written. Default 16. */
  sampleSize?: number;
  /** Turns token ids into text for the report's spot-check samples. */
  decode?: (inputIds: number[]) => string | Promise<string>;
  /**
   * Extra checks on the complete merged folder before the swap (e.g. Python's
   * `load_from_disk`); returns problems, empty when sound.
   */
  verifyMerged?: (mergedDir: string) => Promise<string[]>;
  /**
   * Names the new rows (e.g. `<run>/<dataset>/<tokenize job id>`). When a merge with this key
   * is in effect in the target's history, nothing is merged and that merge's report comes back
   * with `alreadyMerged: true`, so a merge job retried after a crash that followed its commit
   * does not append the same rows twice. A rolled-back merge is no longer in effect.
   */
  mergeKey?: string;
  crashAt?: MergeCrashPoint;
  /** Randomness for sampling (tests pass a seeded one). */
  random?: () => number;
}

/** A sampled new row, read back from the merged folder. */
export interface MergeSample {
  /** Row index in the merged dataset. */
  index: number;
  id: string | undefined;
  tokens: number;
  supervisedTokens: number;
  /** Whether the row read back equals the row written. */
  matches: boolean;
  /** Decoded text (first 300 characters), when a `decode` was given. */
  text?: string;
  /** Decoded supervised tokens only (first 300 characters). */
  supervisedText?: string;
}

/** What a merge checked; written to `<runDir>/merge-report-<mergeId>.json`. */
export interface MergeReport {
  ok: boolean;
  mergeId: string;
  target: string;
  createdAt: string;
  /** The target did not exist (or was empty) before this merge. */
  firstMerge: boolean;
  oldRows: number;
  newRows: number;
  rows: number;
  oldTokens: number;
  newTokens: number;
  tokens: number;
  oldSupervisedTokens: number;
  newSupervisedTokens: number;
  supervisedTokens: number;
  /** supervisedTokens / tokens of the merged dataset. */
  lossMaskCoverage: number;
  /** Same, over the new rows only. */
  newLossMaskCoverage: number;
  /** Shard count of the merged dataset. */
  shards: number;
  newShards: string[];
  /** Old shards reused by hard link, and those that had to be copied. */
  linkedShards: number;
  copiedShards: number;
  /** The merged dataset's columns, e.g. `id: string, input_ids: list<int64>, …`. */
  columns: string;
  /** Columns of the new rows that the target does not have, left out. */
  droppedColumns: string[];
  checkedSamples: number;
  samples: MergeSample[];
  /** Why the merge was refused; empty when ok. */
  problems: string[];
  /** Findings about the old data that do not block the merge. */
  warnings: string[];
  environment: { node: string; platform: string; host: string; pid: number };
  durationMs: number;
}

/** What {@link mergeIntoTarget} returns. */
export interface MergeResult {
  report: MergeReport;
  reportPath: string;
  /** Actions taken to repair a previous interrupted merge or rollback. */
  repaired: string[];
  /** A merge with the same `mergeKey` was already in effect: nothing was done. */
  alreadyMerged: boolean;
}

/** One merge as recorded in `<target>/.tokenmill/history/`. */
interface HistoryRecord {
  version: 1;
  mergeId: string;
  createdAt: string;
  /** state.json text before the merge; null when the merge created the target. */
  previousState: string | null;
  /** state.json text after the merge. */
  nextState: string;
  /** Files the merge added to the target folder. */
  addedFiles: string[];
  mergeKey: string | null;
  summary: Pick<MergeReport, 'oldRows' | 'newRows' | 'rows' | 'oldTokens' | 'newTokens' | 'tokens' | 'shards'>;
  report: MergeReport;
  reportPath: string;
}

const CONTROL_DIR = '.tokenmill';

function controlDir(target: string): string {
  return path.join(target, CONTROL_DIR);
}
function historyDir(target: string): string {
  return path.join(controlDir(target), 'history');
}
function stagingRoot(target: string): string {
  return path.join(controlDir(target), 'staging');
}

function crashPoint<P extends string>(wanted: P | undefined, here: P): Promise<void> {
  if (wanted !== here) return Promise.resolve();
  log().warn({ crashAt: here }, 'crash point reached: killing this process');
  process.kill(process.pid, 'SIGKILL');
  // SIGKILL cannot be caught; never continue past the crash point while it is delivered.
  return new Promise<void>(() => undefined);
}

function newMergeId(): string {
  const ts = new Date().toISOString().replace(/[-:]/g, '').replace('.', '');
  return `${ts}-${randomBytes(3).toString('hex')}`;
}

/** state.json text in a form where equal states compare equal (sorted keys, no whitespace). */
function canonicalState(text: string): string {
  const sort = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(sort);
    if (typeof v === 'object' && v !== null) {
      return Object.fromEntries(
        Object.keys(v)
          .sort()
          .map((k) => [k, sort((v as Record<string, unknown>)[k])]),
      );
    }
    return v;
  };
  try {
    return JSON.stringify(sort(JSON.parse(text)));
  } catch {
    return text;
  }
}

// ---------------------------------------------------------------------------------------------
// Lock

async function acquireLock(target: string): Promise<() => Promise<void>> {
  const lockPath = `${target}.lock`;
  await ensureDir(path.dirname(target));
  const me = { pid: process.pid, host: hostname(), since: new Date().toISOString() };
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fh = await open(lockPath, 'wx');
      try {
        await fh.writeFile(JSON.stringify(me));
        await fh.sync();
      } finally {
        await fh.close();
      }
      return async () => {
        await rm(lockPath, { force: true });
      };
    } catch (e: unknown) {
      if (!isErrno(e, 'EEXIST')) throw e;
      let holder: { pid?: number; host?: string; since?: string } = {};
      try {
        holder = JSON.parse(await readFile(lockPath, 'utf8')) as typeof holder;
      } catch {
        // a lock file cut short by a crash while it was written: treat as stale below
      }
      const sameHost = holder.host === undefined || holder.host === me.host;
      if (sameHost && (holder.pid === undefined || !processAlive(holder.pid))) {
        log().warn({ lockPath, holder }, 'removing a stale lock left by a process that no longer runs');
        await rm(lockPath, { force: true });
        continue;
      }
      throw new DatasetMergeError(
        `${target} is locked by process ${String(holder.pid)} on ${String(holder.host)} since ${String(holder.since)}; ` +
          `if no merge or rollback is running, remove ${lockPath}`,
      );
    }
  }
  throw new DatasetMergeError(`cannot take the lock ${lockPath}`);
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e: unknown) {
    return !isErrno(e, 'ESRCH');
  }
}

// ---------------------------------------------------------------------------------------------
// History and repair

async function readHistory(target: string): Promise<{ file: string; record: HistoryRecord }[]> {
  const dir = historyDir(target);
  const names = (await readdirOrEmpty(dir)).filter((n) => n.endsWith('.json') && !n.startsWith('.')).sort();
  const out: { file: string; record: HistoryRecord }[] = [];
  for (const n of names) {
    const file = path.join(dir, n);
    out.push({ file, record: JSON.parse(await readFile(file, 'utf8')) as HistoryRecord });
  }
  return out;
}

async function nextHistoryName(target: string, mergeId: string): Promise<string> {
  const names = (await readdirOrEmpty(historyDir(target))).filter((n) => /^\d{6}-/.test(n)).sort();
  const last = names[names.length - 1];
  const seq = last === undefined ? 1 : Number(last.slice(0, 6)) + 1;
  return `${String(seq).padStart(6, '0')}-${mergeId}.json`;
}

async function readStateText(target: string): Promise<string | undefined> {
  try {
    return await readFile(path.join(target, 'state.json'), 'utf8');
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return undefined;
    throw e;
  }
}

function listedFiles(stateText: string): Set<string> {
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
async function repairLocked(target: string): Promise<string[]> {
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
  for (const name of await removeTempFiles(historyDir(target))) actions.push(`removed temporary file ${CONTROL_DIR}/history/${name}`);

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
      actions.push(`removed merge ${last.record.mergeId}, which is not in effect (${last.record.addedFiles.length} added files)`);
      continue;
    }
    log().warn({ target, mergeId: last.record.mergeId }, 'state.json was changed outside tokenmill since the last merge');
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

// ---------------------------------------------------------------------------------------------
// Schema planning

interface SourcePlan {
  kind: 'rows' | 'staged';
  columns: ColumnSpec[];
  staged?: DatasetMeta;
}

/**
 * The columns of the merged dataset: the target's, in its order and with its types. Every
 * target column must be filled from the new rows with a type that holds their values (new
 * int32 ids are written as int64 into an int64 target); a target column the new rows lack is
 * refused, as is a missing required column (input_ids, loss_mask), each with a message naming
 * the column and both types. Columns of the new rows the target lacks are left out (`dropped`).
 * `source` is `rows` for {@link HfRow}s (typed as {@link defaultColumns}) or `staged` for a
 * folder, whose values are only converted between columns of the same kind.
 */
export function planMergeColumns(
  targetColumns: readonly ColumnSpec[],
  sourceColumns: readonly ColumnSpec[],
  source: 'rows' | 'staged' = 'rows',
): { columns: ColumnSpec[]; dropped: string[]; problems: string[] } {
  const problems: string[] = [];
  const byName = new Map(sourceColumns.map((c) => [c.name, c]));
  const targetNames = new Set(targetColumns.map((c) => c.name));
  for (const req of REQUIRED_COLUMNS) {
    if (!targetNames.has(req)) problems.push(`cannot merge: the target has no column ${req}`);
  }
  for (const t of targetColumns) {
    const s = byName.get(t.name);
    if (s === undefined) {
      problems.push(`cannot merge: the target has column ${t.name} (${typeString(t.type)}) but the new rows do not`);
      continue;
    }
    let why: string | undefined;
    if (isRowColumn(t.name)) {
      why = cannotHold(t.name, t.type);
      if (why === undefined && source === 'staged' && s.type.kind !== t.type.kind) why = 'different kinds of column';
    } else if (!sameType(t.type, s.type)) {
      why = 'different types';
    }
    if (why !== undefined) {
      problems.push(`cannot merge: column ${t.name} is ${typeString(t.type)} in the target but ${typeString(s.type)} in the new rows (${why})`);
    }
  }
  const dropped = sourceColumns.filter((c) => !targetNames.has(c.name)).map((c) => c.name);
  return { columns: targetColumns.map((c) => ({ ...c })), dropped, problems };
}

// ---------------------------------------------------------------------------------------------
// Merge

interface NewPart {
  files: string[];
  rows: number;
  tokens: number;
  supervisedTokens: number;
  samples: SampledRow[];
  linked: number;
  copied: number;
}

/**
 * Merges new rows into the training dataset at `target` (DESIGN invariant 8): old rows first,
 * then the new ones; builds and validates the merged dataset beside the current one, then
 * swaps it in with one atomic rename of state.json. See the header of this file for the
 * layout and the crash guarantees.
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
  const release = await acquireLock(target);
  let staging: string | undefined;
  try {
    const repaired = await repairLocked(target);
    if (opts.mergeKey !== undefined) {
      const prior = (await readHistory(target)).find((h) => h.record.mergeKey === opts.mergeKey);
      if (prior !== undefined) {
        mlog.info({ mergeKey: opts.mergeKey, mergedAs: prior.record.mergeId }, 'these rows are already merged: nothing to do');
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
      const plan = planMergeColumns(targetColumns, source.columns, source.kind);
      if (plan.problems.length > 0) {
        throw new DatasetMergeError(plan.problems.join('\n'), { problems: plan.problems });
      }
      columns = plan.columns;
      dropped = plan.dropped;
      if (dropped.length > 0) warnings.push(`columns the target does not have were left out: ${dropped.join(', ')}`);
      for (const s of old.shards) {
        const scan = await scanShard(path.join(target, s));
        if (!sameColumns(scan.columns, columns)) {
          throw new DatasetMergeError(`cannot merge: the target's shard ${s} has columns (${columnsString(scan.columns)}) but ${firstShard} has (${columnsString(columns)})`);
        }
        warnings.push(...scan.problems);
        oldScans.push(scan);
      }
    } else {
      columns = source.columns;
    }
    const oldShards = old?.shards ?? [];

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
      warnings,
      opts,
      started,
    });
    const reportPath = path.join(opts.runDir, `merge-report-${mergeId}.json`);
    await ensureDir(opts.runDir);
    await writeFileAtomic(reportPath, jsonText(report));
    if (!report.ok) {
      mlog.error({ problems: report.problems, reportPath }, 'merge refused: validation failed; the target is unchanged');
      throw new DatasetMergeError(`merge refused, the target is unchanged:\n  ${report.problems.join('\n  ')}\n(report: ${reportPath})`, {
        problems: report.problems,
        report,
      });
    }
    await crashPoint(opts.crashAt, 'after-validate');

    // -- 4./5. record, move the new shards in, swap state.json
    const record: HistoryRecord = {
      version: 1,
      mergeId,
      createdAt: report.createdAt,
      previousState: old?.stateText ?? null,
      nextState: nextStateText,
      addedFiles: newPart.files,
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
      // load_from_disk needs dataset_info.json; a target without one gets the merged folder's
      // (it matches the old shards' schema too, so the old state stays loadable).
      if (old?.infoText === undefined) await rename(path.join(staging, 'dataset_info.json'), path.join(target, 'dataset_info.json'));
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

/** state.json keys in the order `datasets` writes them (sorted). */
function sortStateKeys(s: DatasetState): DatasetState {
  return Object.fromEntries(Object.keys(s).sort().map((k) => [k, (s as Record<string, unknown>)[k]])) as DatasetState;
}

async function planSource(opts: MergeOptions): Promise<SourcePlan> {
  const src = opts.newRows;
  if (typeof src === 'object' && src !== null && 'stagedDir' in src) {
    const staged = await readDatasetMeta(src.stagedDir);
    const first = staged.shards[0];
    const columns = first === undefined ? defaultColumns(opts) : columnsOfSchema(await readShardSchema(path.join(src.stagedDir, first)));
    return { kind: 'staged', columns, staged };
  }
  return { kind: 'rows', columns: defaultColumns(opts) };
}

/** Writes (or links) the new shards into `staging`, named after their place in the merged dataset. */
async function stageNewShards(
  staging: string,
  opts: MergeOptions,
  source: SourcePlan,
  columns: ColumnSpec[],
  oldCount: number,
  taken: Set<string>,
  mergeId: string,
): Promise<NewPart> {
  const nameShard = (i: number, n: number): string => {
    const name = shardName(oldCount + i, oldCount + n);
    return taken.has(name) ? name.replace(/\.arrow$/, `-${mergeId}.arrow`) : name;
  };
  const sampleSize = opts.sampleSize ?? 16;
  const random = opts.random ?? Math.random;
  const bytes = shardSizeBytes(opts.shardSizeMiB);
  if (source.kind === 'staged' && source.staged !== undefined) {
    const staged = source.staged;
    const stagedColumns = source.columns;
    if (sameColumns(stagedColumns, columns)) {
      // Same schema: reuse the staged shards as they are (hard links), reading them once for
      // their statistics and a sample to compare after the merge.
      const part: NewPart = { files: [], rows: 0, tokens: 0, supervisedTokens: 0, samples: [], linked: 0, copied: 0 };
      const reservoir = new Reservoir(sampleSize, random);
      for (const [i, s] of staged.shards.entries()) {
        const from = path.join(staged.dir, s);
        const scan = await scanShard(from, (batch, cols, firstRow) => reservoir.offerBatch(batch, cols, part.rows + firstRow));
        if (scan.problems.length > 0) throw new DatasetMergeError(`the staged rows are not sound:\n  ${scan.problems.join('\n  ')}`, { problems: scan.problems });
        part.rows += scan.rows;
        part.tokens += scan.tokens;
        part.supervisedTokens += scan.supervisedTokens;
        const name = nameShard(i, staged.shards.length);
        if ((await linkOrCopy(from, path.join(staging, name))) === 'link') part.linked++;
        else part.copied++;
        part.files.push(name);
      }
      await fsyncDir(staging);
      part.samples = reservoir.sorted();
      return part;
    }
    const ds = await readHfDataset(staged.dir);
    const written = await writeShards(staging, ds.rows(), { columns, shardSizeBytes: bytes, nameShard, sampleSize, random });
    return { ...written, linked: 0, copied: 0 };
  }
  const written = await writeShards(staging, opts.newRows as RowSource<HfRow>, { columns, shardSizeBytes: bytes, nameShard, sampleSize, random });
  return { ...written, linked: 0, copied: 0 };
}

/** Uniform sample of rows over batches, materializing only the rows kept. */
class Reservoir {
  private readonly kept: SampledRow[] = [];
  private seen = 0;

  constructor(
    private readonly size: number,
    private readonly random: () => number,
  ) {}

  offerBatch(batch: RecordBatch, columns: ColumnSpec[], firstIndex: number): void {
    if (this.size <= 0) return;
    let read: ((i: number) => RowRecord) | undefined;
    for (let i = 0; i < batch.numRows; i++) {
      const k = this.seen++;
      let slot = -1;
      if (k < this.size) slot = k;
      else {
        const j = Math.floor(this.random() * (k + 1));
        if (j < this.size) slot = j;
      }
      if (slot < 0) continue;
      read ??= batchRowReader(batch, columns);
      this.kept[slot] = { index: firstIndex + i, row: read(i) };
    }
  }

  sorted(): SampledRow[] {
    return [...this.kept].sort((a, b) => a.index - b.index);
  }
}

// ---------------------------------------------------------------------------------------------
// Validation

interface ValidateInput {
  staging: string;
  target: string;
  mergeId: string;
  firstMerge: boolean;
  columns: ColumnSpec[];
  dropped: string[];
  oldShards: string[];
  oldScans: ShardScan[];
  newPart: NewPart;
  warnings: string[];
  opts: MergeOptions;
  started: number;
}

async function validateMerged(v: ValidateInput): Promise<MergeReport> {
  const problems: string[] = [];
  const { staging, newPart, oldScans } = v;
  const meta = await readDatasetMeta(staging);
  const expected = [...v.oldShards, ...newPart.files];
  if (meta.shards.join('\n') !== expected.join('\n')) {
    problems.push(`state.json lists ${meta.shards.length} shards, expected the ${v.oldShards.length} old ones then ${newPart.files.length} new ones`);
  }

  // Old shards: a hard link is the same file that was read before the merge, so its scan
  // stands; a copy is read again and must match.
  let oldRows = 0;
  let oldTokens = 0;
  let oldSupervised = 0;
  for (const [i, s] of v.oldShards.entries()) {
    const before = oldScans[i] as ShardScan;
    oldRows += before.rows;
    oldTokens += before.tokens;
    oldSupervised += before.supervisedTokens;
    const [a, b] = await Promise.all([stat(path.join(v.target, s)), stat(path.join(staging, s))]);
    if (a.ino === b.ino && a.dev === b.dev) {
      const cols = columnsOfSchema(await readShardSchema(path.join(staging, s)));
      if (!sameColumns(cols, v.columns)) problems.push(`${s}: schema (${columnsString(cols)}) differs from (${columnsString(v.columns)})`);
      continue;
    }
    const again = await scanShard(path.join(staging, s));
    if (again.rows !== before.rows || again.tokens !== before.tokens || again.supervisedTokens !== before.supervisedTokens) {
      problems.push(`${s}: the copy in the merged folder differs from the original`);
    }
    if (!sameColumns(again.columns, v.columns)) problems.push(`${s}: schema (${columnsString(again.columns)}) differs from (${columnsString(v.columns)})`);
  }

  // New shards: read back completely, sample rows captured on the way.
  const wanted = new Map(newPart.samples.map((s) => [s.index, s]));
  const readBack = new Map<number, RowRecord>();
  let newRowsRead = 0;
  let newTokensRead = 0;
  let newSupervisedRead = 0;
  for (const f of newPart.files) {
    const base = newRowsRead;
    const scan = await scanShard(path.join(staging, f), (batch, cols, firstRow) => {
      let read: ((i: number) => RowRecord) | undefined;
      for (let i = 0; i < batch.numRows; i++) {
        const idx = base + firstRow + i;
        if (!wanted.has(idx)) continue;
        read ??= batchRowReader(batch, cols);
        readBack.set(idx, read(i));
      }
    });
    problems.push(...scan.problems);
    if (!sameColumns(scan.columns, v.columns)) problems.push(`${f}: schema (${columnsString(scan.columns)}) differs from (${columnsString(v.columns)})`);
    newRowsRead += scan.rows;
    newTokensRead += scan.tokens;
    newSupervisedRead += scan.supervisedTokens;
  }

  const rows = oldRows + newRowsRead;
  const tokens = oldTokens + newTokensRead;
  const supervisedTokens = oldSupervised + newSupervisedRead;
  if (newPart.rows === 0) problems.push('no new rows to merge');
  if (rows !== oldRows + newPart.rows) problems.push(`the merged dataset has ${rows} rows, expected ${oldRows} old + ${newPart.rows} new = ${oldRows + newPart.rows}`);
  if (tokens !== oldTokens + newPart.tokens) {
    problems.push(`the merged dataset has ${tokens} tokens, expected ${oldTokens} old + ${newPart.tokens} new = ${oldTokens + newPart.tokens}`);
  }
  if (supervisedTokens !== oldSupervised + newPart.supervisedTokens) {
    problems.push(`the merged dataset has ${supervisedTokens} supervised tokens, expected ${oldSupervised + newPart.supervisedTokens}`);
  }
  const lossMaskCoverage = tokens === 0 ? 0 : supervisedTokens / tokens;
  const newLossMaskCoverage = newPart.tokens === 0 ? 0 : newPart.supervisedTokens / newPart.tokens;
  if (!(lossMaskCoverage >= 0 && lossMaskCoverage <= 1)) problems.push(`loss-mask coverage ${lossMaskCoverage} is outside [0, 1]`);
  if (newPart.rows > 0 && !(newLossMaskCoverage > 0 && newLossMaskCoverage <= 1)) {
    problems.push(`loss-mask coverage of the new rows is ${newLossMaskCoverage}: nothing would be trained on`);
  }

  // Sampled rows: read back equal to what was written; decoded for a human spot check.
  const samples: MergeSample[] = [];
  for (const s of newPart.samples) {
    const got = readBack.get(s.index);
    const index = oldRows + s.index;
    const mismatch = got === undefined ? 'not found' : rowDifference(s.row, got, v.columns);
    if (mismatch !== undefined) problems.push(`row ${index}${idOf(s.row)} reads back different from what was written: ${mismatch}`);
    const ids = (s.row['input_ids'] as number[] | undefined) ?? [];
    const mask = (s.row['loss_mask'] as number[] | undefined) ?? [];
    const sample: MergeSample = {
      index,
      id: typeof s.row['id'] === 'string' ? s.row['id'] : undefined,
      tokens: ids.length,
      supervisedTokens: mask.reduce((a, m) => a + m, 0),
      matches: mismatch === undefined,
    };
    if (v.opts.decode !== undefined) {
      try {
        sample.text = (await v.opts.decode(Array.from(ids))).slice(0, 300);
        sample.supervisedText = (await v.opts.decode(Array.from(ids).filter((_, i) => mask[i] === 1))).slice(0, 300);
        if (ids.length > 0 && sample.text.length === 0) problems.push(`row ${index}${idOf(s.row)} decodes to empty text`);
      } catch (e: unknown) {
        problems.push(`row ${index}${idOf(s.row)} cannot be decoded: ${errorMessage(e)}`);
      }
    }
    samples.push(sample);
  }

  if (problems.length === 0 && v.opts.verifyMerged !== undefined) {
    try {
      problems.push(...(await v.opts.verifyMerged(staging)));
    } catch (e: unknown) {
      problems.push(`verification of the merged folder failed: ${errorMessage(e)}`);
    }
  }

  return {
    ok: problems.length === 0,
    mergeId: v.mergeId,
    target: v.target,
    createdAt: new Date().toISOString(),
    firstMerge: v.firstMerge,
    oldRows,
    newRows: newPart.rows,
    rows,
    oldTokens,
    newTokens: newPart.tokens,
    tokens,
    oldSupervisedTokens: oldSupervised,
    newSupervisedTokens: newPart.supervisedTokens,
    supervisedTokens,
    lossMaskCoverage,
    newLossMaskCoverage,
    shards: meta.shards.length,
    newShards: newPart.files,
    linkedShards: newPart.linked,
    copiedShards: newPart.copied,
    columns: columnsString(v.columns),
    droppedColumns: v.dropped,
    checkedSamples: samples.filter((s) => s.matches).length,
    samples,
    problems,
    warnings: v.warnings,
    environment: { node: process.version, platform: `${process.platform}-${process.arch}`, host: hostname(), pid: process.pid },
    durationMs: Date.now() - v.started,
  };
}

function idOf(row: RowRecord): string {
  return typeof row['id'] === 'string' ? ` (id ${JSON.stringify(row['id'])})` : '';
}

/** Where a written row and the row read back differ, over the merged columns; undefined if equal. */
function rowDifference(written: RowRecord, read: RowRecord, columns: readonly ColumnSpec[]): string | undefined {
  for (const c of columns) {
    const a = written[c.name];
    const b = read[c.name];
    if (Array.isArray(a) || ArrayBuffer.isView(a)) {
      const xs = a as ArrayLike<number>;
      if (!Array.isArray(b) || b.length !== xs.length) return `${c.name} has ${Array.isArray(b) ? b.length : 'no'} values, expected ${xs.length}`;
      for (let i = 0; i < xs.length; i++) if (xs[i] !== b[i]) return `${c.name}[${i}] is ${String(b[i])}, expected ${String(xs[i])}`;
    } else if (a !== b) {
      return `${c.name} is ${JSON.stringify(b)}, expected ${JSON.stringify(a)}`;
    }
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// Rollback

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
      restored: { rows: record.summary.oldRows, tokens: record.summary.oldTokens, shards: listedFiles(record.previousState).size },
      removedFiles,
      remainingMerges: history.length - 1,
      repaired,
      reportPath: path.join(opts.runDir, `rollback-${newMergeId()}.json`),
    };
    await ensureDir(opts.runDir);
    await writeFileAtomic(result.reportPath, jsonText(result));
    log().info({ target, undone: record.mergeId, restored: result.restored }, 'rollback done: the dataset before the last merge is restored');
    return result;
  } finally {
    await release();
  }
}

/** Merges recorded for `target`, oldest first. */
export async function listMerges(target: string): Promise<{ mergeId: string; createdAt: string; newRows: number; rows: number }[]> {
  const history = await readHistory(path.resolve(target));
  return history.map(({ record }) => ({ mergeId: record.mergeId, createdAt: record.createdAt, newRows: record.summary.newRows, rows: record.summary.rows }));
}
