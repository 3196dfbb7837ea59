// What every part of a merge shares: options, report and error types, the target's control folders,
// crash points for the crash tests. See docs/design.md (Merge: layout and crash safety) for how a
// merge works.
import { randomBytes } from 'node:crypto';
import path from 'node:path';

import { AppError } from '../../errors.js';
import { logger } from '../../logger.js';
import type { AnchorHistogram } from '../anchor-positions.js';
import type { EndOfTurnCount } from './end-of-turn.js';
import type { SourceOffsets } from './offsets-schema.js';
import type { HfRow, HfTokenTypes } from '../schema.js';
import type { RowSource } from '../writer.js';

/** The component logger, resolved per call so that a root logger installed later applies. */
export function log(): ReturnType<typeof logger> {
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
   * `postprocess.verifyWithPython`: load the merged folder with this interpreter's `datasets`
   * (`load_from_disk`) before the swap, and refuse the swap when it fails or sees other rows or
   * columns (verify-python.ts). The interpreter is checked at the start of the merge.
   */
  verifyWithPython?: { python: string };
  /**
   * Names the new rows (e.g. `<run>/<dataset>/<tokenize job id>`). When a merge with this key
   * is in effect in the target's history, nothing is merged and that merge's report comes back
   * with `alreadyMerged: true`, so a merge job retried after a crash that followed its commit
   * does not append the same rows twice. A rolled-back merge is no longer in effect.
   */
  mergeKey?: string;
  /**
   * Refuse a target without the sample-key columns `dataset` and `id` (see
   * sample-key.ts): set by callers that skip rows the target already holds by that key.
   */
  requireSampleKey?: boolean;
  /**
   * End-of-turn counts of the new rows per dataset; a dataset where too many rows lack
   * end-of-turn supervision is logged and named in the report's warnings (end-of-turn.ts).
   */
  endOfTurn?: readonly EndOfTurnCount[];
  /**
   * How far the tokenize jobs of these rows read each dataset's generation files; recorded with
   * the merged version (offsets.ts), for the updates read against the current version.
   */
  tokenizeOffsets?: readonly SourceOffsets[];
  /**
   * `postprocess.dflash.maskToken`, resolved: the token DFlash fills block slots with. A new row
   * whose input_ids hold its id refuses the merge (the trainer could not tell the two apart).
   */
  dflashMaskToken?: { token: string; id: number };
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

/**
 * What a DFlash trainer can draw from the rows (anchor-positions.ts): rows without an anchor
 * position have fewer than 2 adjacent supervised tokens, and a DFlash export leaves them out.
 */
export interface MergeDflashReport {
  /** Rows of the merged dataset with fewer than 2 adjacent supervised tokens. */
  rowsWithoutAnchor: number;
  /** Of them, new rows. */
  newRowsWithoutAnchor: number;
  /** Rows of the merged dataset by their anchor positions (supervised positions followed by a supervised one). */
  anchorPositions: AnchorHistogram;
  /** The same over the new rows. */
  newAnchorPositions: AnchorHistogram;
  /** `postprocess.dflash.maskToken` and its id, checked absent from the new rows; null when not configured. */
  maskToken: { token: string; id: number } | null;
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
  /** Anchor positions per row and rows without one, for DFlash trainers (absent from reports of earlier versions). */
  dflash?: MergeDflashReport;
  checkedSamples: number;
  samples: MergeSample[];
  /** Why the merge was refused; empty when ok. */
  problems: string[];
  /** Findings that do not block the merge (about the old data, or rows without end-of-turn supervision). */
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
export interface HistoryRecord {
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

export const CONTROL_DIR = '.tokenmill';

export function controlDir(target: string): string {
  return path.join(target, CONTROL_DIR);
}
export function historyDir(target: string): string {
  return path.join(controlDir(target), 'history');
}
export function stagingRoot(target: string): string {
  return path.join(controlDir(target), 'staging');
}

export function crashPoint<P extends string>(wanted: P | undefined, here: P): Promise<void> {
  if (wanted !== here) return Promise.resolve();
  log().warn({ crashAt: here }, 'crash point reached: killing this process');
  process.kill(process.pid, 'SIGKILL');
  // SIGKILL cannot be caught; never continue past the crash point while it is delivered.
  return new Promise<void>(() => undefined);
}

export function newMergeId(): string {
  const ts = new Date().toISOString().replace(/[-:]/g, '').replace('.', '');
  return `${ts}-${randomBytes(3).toString('hex')}`;
}

/** state.json text in a form where equal states compare equal (sorted keys, no whitespace). */
export function canonicalState(text: string): string {
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
