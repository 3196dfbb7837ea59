// The index files of a merge's new shards, and the check that makes the merge exact: no new row
// is one the target already holds, and no two new rows share a sample key.
import type { DatasetIndex } from './id-index.js';
import {
  compareHashed,
  indexFileName,
  indexFileOf,
  shardIndexBytes,
  writeShardIndex,
  type HashedKey,
  type ShardKeyCollector,
} from './id-index.js';
import type { ShardScan } from '../reader.js';

/** Keys shown in a problem message. */
const SHOWN_KEYS = 5;

function shown(keys: readonly string[]): string {
  const list = keys.slice(0, SHOWN_KEYS).map((k) => JSON.stringify(k.replace('\0', '/')));
  return `${list.join(', ')}${keys.length > SHOWN_KEYS ? ', …' : ''}`;
}

/** What {@link indexNewShards} wrote and found. */
export interface NewShardIndex {
  /** Index files written in the staging folder, relative to it (the same names in the target). */
  files: string[];
  /** Why the merge must be refused; empty when every new row is new and once. */
  problems: string[];
}

/**
 * Writes the index file of each new shard of `staging` (from the scans the validation made) and
 * looks every new row's sample key up in `oldIndex`, the index of the target as it is. Memory
 * grows with the new rows only: the old index is streamed.
 */
export async function indexNewShards(
  staging: string,
  files: readonly string[],
  scans: ReadonlyMap<string, { scan: ShardScan; collector: ShardKeyCollector }>,
  oldIndex: DatasetIndex | undefined,
): Promise<NewShardIndex> {
  const written: string[] = [];
  const all: HashedKey[] = [];
  for (const f of files) {
    const s = scans.get(f);
    if (s === undefined) throw new Error(`the new shard ${f} was not scanned`);
    for (const k of s.collector.keys) all.push(k);
    await writeShardIndex(indexFileOf(staging, f), await shardIndexBytes(staging, f, s.scan, s.collector));
    written.push(indexFileName(f));
  }
  all.sort(compareHashed);
  const problems: string[] = [];
  const twice: string[] = [];
  for (let i = 1; i < all.length; i++) {
    const a = all[i - 1] as HashedKey;
    const b = all[i] as HashedKey;
    if (a.key === b.key && (i < 2 || (all[i - 2] as HashedKey).key !== a.key)) twice.push(a.key);
  }
  if (twice.length > 0) {
    problems.push(
      `${twice.length} sample keys occur more than once among the new rows (${shown(twice)}): each would be in the dataset twice`,
    );
  }
  if (oldIndex !== undefined) {
    const existing = [...(await oldIndex.findExisting(all))].sort();
    if (existing.length > 0) {
      problems.push(
        `${existing.length} new rows are already in the target (${shown(existing)}): each would be in the dataset twice`,
      );
    }
  }
  return { files: written, problems };
}
