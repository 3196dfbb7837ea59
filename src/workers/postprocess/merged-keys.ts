import { stat } from 'node:fs/promises';
import path from 'node:path';

import {
  DatasetIndex,
  assertSampleKeyedTarget,
  readDatasetMeta,
  readHfDataset,
  readShardBatches,
  stateKey,
} from '../../shared/index.js';

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
