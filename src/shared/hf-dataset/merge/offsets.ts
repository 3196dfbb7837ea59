// Tokenize offsets: how far each dataset's generation files have been read into the training
// dataset, so that a post-process round reads only the lines written since.
//
//   <target>/.tokenmill/offsets/<state key>.json
//
// The file is named after the dataset version it belongs to (a hash of state.json), so it can
// never describe another version: a merge writes the offsets of the version it makes before
// state.json is replaced, listed in its history record (a crash before the swap leaves a file
// no state names, which repair removes; rollback removes it with the merge, and the version it
// restores finds its own file again). Offsets that no file vouches for mean "read everything";
// dedupe against the index keeps a full read exact.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import path from 'node:path';

import { z } from 'zod';

import { ensureDir, isErrno, jsonText, writeFileAtomic } from '../../util/index.js';
import { canonicalState, controlDir, log } from './common.js';
import { readStateText } from './journal.js';
import { DatasetIndex } from './id-index.js';
import { acquireLock } from './lock.js';
import { readDatasetMeta } from '../reader.js';
import { DatasetOffsetsSchema, type DatasetOffsets, type SourceOffsets } from './offsets-schema.js';

const OffsetsFileSchema = z.object({
  version: z.literal(1),
  state: z.string(),
  datasets: z.record(z.string(), DatasetOffsetsSchema),
});
type OffsetsFile = z.infer<typeof OffsetsFileSchema>;

/** The key of a dataset version: a hash of its state.json (key order and whitespace ignored). */
export function stateKey(stateText: string): string {
  return createHash('sha256').update(canonicalState(stateText)).digest('hex').slice(0, 24);
}

/** The offsets file of a version, relative to the dataset folder. */
export function offsetsFileName(key: string): string {
  return path.join('.tokenmill', 'offsets', `${key}.json`);
}

/** The offsets committed for the current version of `target`. */
export interface CommittedOffsets {
  /** Key of the current version; null when there is no target yet. */
  basis: string | null;
  datasets: Record<string, DatasetOffsets>;
  /** Why there are none, when there are none. */
  missing?: string;
}

async function readOffsetsFile(dir: string, key: string): Promise<OffsetsFile | string> {
  const file = path.join(dir, offsetsFileName(key));
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return 'no offsets recorded for this version of the training dataset';
    throw e;
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return `${file} is not valid JSON`;
  }
  const r = OffsetsFileSchema.safeParse(parsed);
  if (!r.success || r.data.state !== key) return `${file} is not an offsets file of this version`;
  return r.data;
}

/** Reads the offsets committed with the current version of the dataset at `target`. */
export async function readCommittedOffsets(target: string): Promise<CommittedOffsets> {
  const stateText = await readStateText(target);
  if (stateText === undefined) return { basis: null, datasets: {}, missing: 'no training dataset yet' };
  return offsetsOfState(target, stateText);
}

/** The offsets committed with the version whose state.json is `stateText`. */
export async function offsetsOfState(target: string, stateText: string): Promise<CommittedOffsets> {
  const basis = stateKey(stateText);
  const file = await readOffsetsFile(target, basis);
  if (typeof file === 'string') return { basis, datasets: {}, missing: file };
  return { basis, datasets: file.datasets };
}

/**
 * The offsets of the next version: those of the current one (`previous`), with each update
 * whose `basis` is the current version's key applied. An update read against another version
 * (the target changed between tokenize and merge) is left out, so its lines are read again.
 */
export function nextOffsets(
  previous: CommittedOffsets,
  updates: readonly SourceOffsets[],
): Record<string, DatasetOffsets> {
  const out: Record<string, DatasetOffsets> = { ...previous.datasets };
  for (const u of updates) {
    if (u.basis !== previous.basis) {
      log().warn(
        { dataset: u.dataset, readAgainst: u.basis, current: previous.basis },
        'tokenize offsets not recorded: the training dataset changed since they were read; the next round reads these lines again',
      );
      continue;
    }
    out[u.dataset] = u.offsets;
  }
  return out;
}

/** Writes the offsets file of version `key` into the dataset folder `dir`. Returns its relative name. */
export async function writeOffsetsFile(
  dir: string,
  key: string,
  datasets: Record<string, DatasetOffsets>,
): Promise<string> {
  const name = offsetsFileName(key);
  await ensureDir(path.join(controlDir(dir), 'offsets'));
  const body: OffsetsFile = { version: 1, state: key, datasets };
  await writeFileAtomic(path.join(dir, name), jsonText(body));
  return name;
}

/**
 * Records offsets for the current version of `target` without merging (a round that found
 * nothing new: its lines need not be read again), and writes the index files its shards lack
 * (a target made without them), so the next round's lookups need not rebuild them. Takes the
 * target's lock. Records nothing when there is no target, or when no update was read against
 * the current version.
 */
export async function commitOffsetsWithoutMerge(target: string, updates: readonly SourceOffsets[]): Promise<boolean> {
  const abs = path.resolve(target);
  const release = await acquireLock(abs);
  try {
    const stateText = await readStateText(abs);
    if (stateText === undefined) return false;
    const previous = await offsetsOfState(abs, stateText);
    if (!updates.some((u) => u.basis === previous.basis)) return false;
    const index = await DatasetIndex.open(abs, (await readDatasetMeta(abs)).shards, { persist: true });
    await index.close();
    await writeOffsetsFile(abs, previous.basis as string, nextOffsets(previous, updates));
    return true;
  } finally {
    await release();
  }
}
