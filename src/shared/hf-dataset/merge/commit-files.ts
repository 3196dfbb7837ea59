// The files a merge commits beside its new shards: the index files of the new shards and the
// tokenize offsets of the version it makes. Both are written in the staging folder, listed in the
// merge's history record, and moved into the target with the shards before state.json is
// replaced (see docs/design.md, Merge: layout and crash safety), so they are in effect exactly
// when the version they describe is.
import { rename } from 'node:fs/promises';
import path from 'node:path';

import { ensureDir, fsyncDir } from '../../util/index.js';
import type { MergeOptions, MergeReport } from './common.js';
import type { DatasetIndex, ShardKeyCollector } from './id-index.js';
import { indexNewShards } from './new-shard-index.js';
import { nextOffsets, offsetsOfState, stateKey, writeOffsetsFile, type CommittedOffsets } from './offsets.js';
import type { DatasetMeta, ShardScan } from '../reader.js';

/**
 * Writes the index files of the new shards and the offsets file of the next version into
 * `staging`; returns their names relative to it. A new row the target already holds (or two
 * new rows with one sample key) refuses the merge: the problem goes into `report`.
 */
export async function stageIndexAndOffsets(
  staging: string,
  target: string,
  old: DatasetMeta | undefined,
  newFiles: readonly string[],
  newScans: ReadonlyMap<string, { scan: ShardScan; collector: ShardKeyCollector }>,
  oldIndex: DatasetIndex | undefined,
  nextStateText: string,
  opts: MergeOptions,
  report: MergeReport,
): Promise<string[]> {
  if (!report.ok) return [];
  const indexed = await indexNewShards(staging, newFiles, newScans, oldIndex);
  if (indexed.problems.length > 0) {
    report.problems.push(...indexed.problems);
    report.ok = false;
    return [];
  }
  const previous: CommittedOffsets =
    old === undefined ? { basis: null, datasets: {} } : await offsetsOfState(target, old.stateText);
  const datasets = nextOffsets(previous, opts.tokenizeOffsets ?? []);
  const files = [...indexed.files];
  if (Object.keys(datasets).length > 0) files.push(await writeOffsetsFile(staging, stateKey(nextStateText), datasets));
  return files;
}

/** Moves `files` (relative names) from `staging` into `target`, then flushes their folders. */
export async function moveExtraFiles(staging: string, target: string, files: readonly string[]): Promise<void> {
  const dirs = new Set<string>();
  for (const f of files) {
    const to = path.join(target, f);
    await ensureDir(path.dirname(to));
    await rename(path.join(staging, f), to);
    dirs.add(path.dirname(to));
  }
  for (const d of dirs) await fsyncDir(d);
}
