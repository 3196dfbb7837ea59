// The merge id index: which sample keys (`dataset` + `id`) the training dataset holds, and each
// shard's row/token counts, kept beside the dataset so that neither a merge nor a tokenize job
// reads the shards to learn them.
//
//   <target>/.tokenmill/index/<shard>.keys    one file per shard, derived from that shard only
//
// Shards are never modified once written, so an index file never goes stale by itself: the
// index of a dataset version is the files of the shards its state.json lists. A merge writes
// the files of its new shards in the staging folder and moves them in with the shards, before
// state.json is replaced, and lists them in its history record, so repair and rollback remove
// them with the shards they describe. Each file records the size and modification time of its
// shard: a file that is missing, unreadable or names another shard (a target copied without
// them, a shard replaced by hand) is rebuilt from the shard, with a log line.
//
// File layout (integers little-endian):
//   "TMKIDX1\n"  u32 header length  header JSON (padded with spaces to a multiple of 4)
//   entries: keys × (u32 hash hi, u32 hash lo, u32 key offset, u32 key length), sorted by hash
//   keys: the UTF-8 text of `dataset \0 id` of each entry, in entry order
// A lookup compares 64-bit hashes and then the key itself, so it is exact: a hash collision
// costs one read of the key, never a wrong answer.
import { open, stat } from 'node:fs/promises';
import path from 'node:path';

import type { RecordBatch } from 'apache-arrow';

import { errorMessage } from '../../errors.js';
import { isErrno, writeFileAtomic } from '../../util/index.js';
import { controlDir, log } from './common.js';
import { isAnchorHistogram, type AnchorHistogram } from '../anchor-positions.js';
import { scanShard, type ShardScan } from '../reader.js';
import type { ColumnSpec } from '../schema.js';

const MAGIC = Buffer.from('TMKIDX1\n', 'latin1');
const ENTRY_BYTES = 16;
/** Entries read at once when streaming an index file. */
const CHUNK_ENTRIES = 32_768;

/** What an index file says about its shard. */
export interface ShardIndexHeader {
  version: 1;
  /** The shard's file name in the dataset folder. */
  shard: string;
  /** Identity of the shard the file was made from. */
  bytes: number;
  mtimeMs: number;
  rows: number;
  tokens: number;
  supervisedTokens: number;
  /**
   * Rows by their DFlash anchor positions (anchor-positions.ts). Absent from files written by
   * earlier versions: a merge, which reports it over the whole dataset, rebuilds such a file.
   */
  anchorPositions?: AnchorHistogram;
  /** The shard's columns. */
  columns: ColumnSpec[];
  /** Findings of the shard's scan (reported as warnings by each merge). */
  problems: string[];
  /** Rows with a string `id` and `dataset`: the entries. */
  keys: number;
  /** Rows without a sample key (not in the index). */
  unkeyed: number;
}

/** The sample key of a row: `dataset \0 id`. */
export function sampleKey(dataset: string, id: string): string {
  return `${dataset}\0${id}`;
}

/** Two independent 32-bit hashes of `key` (its UTF-16 code units). */
export function keyHash(key: string): [number, number] {
  let a = 0x811c9dc5;
  let b = 0x9747b28c ^ key.length;
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  a ^= a >>> 13;
  a = Math.imul(a, 0xc2b2ae35);
  a ^= a >>> 16;
  b = Math.imul(b ^ (b >>> 13), 0x85ebca6b);
  b ^= b >>> 16;
  return [a >>> 0, b >>> 0];
}

/** A key with its hash, the unit of index lookups. */
export interface HashedKey {
  hi: number;
  lo: number;
  key: string;
}

export function hashedKey(key: string): HashedKey {
  const [hi, lo] = keyHash(key);
  return { hi, lo, key };
}

/** Orders keys by hash, then by text (so equal keys are adjacent). */
export function compareHashed(a: HashedKey, b: HashedKey): number {
  if (a.hi !== b.hi) return a.hi < b.hi ? -1 : 1;
  if (a.lo !== b.lo) return a.lo < b.lo ? -1 : 1;
  return a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
}

/** The index file of `shard` in a dataset folder. */
export function indexFileOf(dir: string, shard: string): string {
  return path.join(controlDir(dir), 'index', `${encodeURIComponent(shard)}.keys`);
}

/** The index file's path relative to the dataset folder (as merge history records list files). */
export function indexFileName(shard: string): string {
  return path.join('.tokenmill', 'index', `${encodeURIComponent(shard)}.keys`);
}

/** Collects the keys of a shard's record batches while it is scanned. */
export class ShardKeyCollector {
  readonly keys: HashedKey[] = [];
  unkeyed = 0;

  /** Adds the sample keys of one record batch (rows without a string id and dataset are counted apart). */
  addBatch(batch: RecordBatch): void {
    const idCol = batch.getChild('id');
    const dsCol = batch.getChild('dataset');
    if (idCol === null || dsCol === null) {
      this.unkeyed += batch.numRows;
      return;
    }
    for (let i = 0; i < batch.numRows; i++) {
      const id: unknown = idCol.get(i);
      const ds: unknown = dsCol.get(i);
      if (typeof id === 'string' && typeof ds === 'string') this.keys.push(hashedKey(sampleKey(ds, id)));
      else this.unkeyed += 1;
    }
  }
}

/** The bytes of an index file for `keys` (sorted here). */
export function encodeIndex(header: Omit<ShardIndexHeader, 'keys' | 'unkeyed'>, collector: ShardKeyCollector): Buffer {
  const keys = collector.keys.sort(compareHashed);
  const full: ShardIndexHeader = { ...header, keys: keys.length, unkeyed: collector.unkeyed };
  let headerText = JSON.stringify(full);
  while ((Buffer.byteLength(headerText) + MAGIC.length + 4) % 4 !== 0) headerText += ' ';
  const headerBytes = Buffer.from(headerText, 'utf8');
  const keyBytes = keys.map((k) => Buffer.from(k.key, 'utf8'));
  const blobLength = keyBytes.reduce((n, b) => n + b.length, 0);
  const entriesStart = MAGIC.length + 4 + headerBytes.length;
  const out = Buffer.alloc(entriesStart + keys.length * ENTRY_BYTES + blobLength);
  MAGIC.copy(out, 0);
  out.writeUInt32LE(headerBytes.length, MAGIC.length);
  headerBytes.copy(out, MAGIC.length + 4);
  let at = entriesStart;
  let off = 0;
  const blobStart = entriesStart + keys.length * ENTRY_BYTES;
  for (const [i, k] of keys.entries()) {
    const b = keyBytes[i] as Buffer;
    out.writeUInt32LE(k.hi, at);
    out.writeUInt32LE(k.lo, at + 4);
    out.writeUInt32LE(off, at + 8);
    out.writeUInt32LE(b.length, at + 12);
    b.copy(out, blobStart + off);
    at += ENTRY_BYTES;
    off += b.length;
  }
  return out;
}

/** Where the parts of an index file start. */
interface IndexLayout {
  header: ShardIndexHeader;
  entriesStart: number;
  blobStart: number;
}

function parseLayout(head: Buffer, where: string): IndexLayout {
  if (head.length < MAGIC.length + 4 || !head.subarray(0, MAGIC.length).equals(MAGIC))
    throw new Error(`${where} is not a tokenmill index file`);
  const len = head.readUInt32LE(MAGIC.length);
  const entriesStart = MAGIC.length + 4 + len;
  if (head.length < entriesStart) throw new Error(`${where}: header cut short`);
  const header = JSON.parse(head.subarray(MAGIC.length + 4, entriesStart).toString('utf8')) as ShardIndexHeader;
  if (header.version !== 1 || typeof header.keys !== 'number') throw new Error(`${where}: unknown index version`);
  return { header, entriesStart, blobStart: entriesStart + header.keys * ENTRY_BYTES };
}

/** Random access to one index file's bytes: the file, or a buffer built in memory. */
interface IndexBytes {
  read(pos: number, length: number): Promise<Buffer>;
  close(): Promise<void>;
}

function memoryBytes(buf: Buffer): IndexBytes {
  return { read: (pos, length) => Promise.resolve(buf.subarray(pos, pos + length)), close: () => Promise.resolve() };
}

async function fileBytes(file: string): Promise<IndexBytes> {
  const fh = await open(file, 'r');
  return {
    async read(pos, length) {
      const buf = Buffer.alloc(length);
      let got = 0;
      while (got < length) {
        const { bytesRead } = await fh.read(buf, got, length - got, pos + got);
        if (bytesRead === 0) throw new Error(`${file}: unexpected end of file`);
        got += bytesRead;
      }
      return buf;
    },
    close: () => fh.close(),
  };
}

/** One shard's index, opened. */
export interface ShardIndex {
  shard: string;
  header: ShardIndexHeader;
  /** Whether it was rebuilt from the shard (missing or stale file). */
  rebuilt: boolean;
  layout: IndexLayout;
  bytes: IndexBytes;
}

/**
 * The index file's bytes of `shard` in `dir`, from its scan and the keys collected during it
 * (the merge's validation reads each new shard once for both).
 */
export async function shardIndexBytes(
  dir: string,
  shard: string,
  scan: ShardScan,
  collector: ShardKeyCollector,
): Promise<Buffer> {
  const st = await stat(path.join(dir, shard));
  return encodeIndex(
    {
      version: 1,
      shard,
      bytes: st.size,
      mtimeMs: st.mtimeMs,
      rows: scan.rows,
      tokens: scan.tokens,
      supervisedTokens: scan.supervisedTokens,
      anchorPositions: scan.anchorPositions,
      columns: scan.columns,
      problems: scan.problems,
    },
    collector,
  );
}

/** Builds the index of one shard by scanning it; returns the file's bytes. */
export async function buildShardIndex(dir: string, shard: string): Promise<Buffer> {
  const collector = new ShardKeyCollector();
  const scan = await scanShard(path.join(dir, shard), (batch) => collector.addBatch(batch));
  return shardIndexBytes(dir, shard, scan, collector);
}

async function readHead(file: string): Promise<Buffer | undefined> {
  let fh;
  try {
    fh = await open(file, 'r');
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return undefined;
    throw e;
  }
  try {
    const first = Buffer.alloc(MAGIC.length + 4);
    const { bytesRead } = await fh.read(first, 0, first.length, 0);
    if (bytesRead < first.length || !first.subarray(0, MAGIC.length).equals(MAGIC)) return first.subarray(0, bytesRead);
    const len = first.readUInt32LE(MAGIC.length);
    const head = Buffer.alloc(first.length + len);
    await fh.read(head, 0, head.length, 0);
    return head;
  } finally {
    await fh.close();
  }
}

/**
 * Opens the index of `shard` in the dataset folder `dir`: its file when it describes the shard
 * as it is, or else one rebuilt from the shard (logged) — written to its place when `persist`,
 * kept in memory otherwise (a reader without the target's lock never writes into it). With
 * `persist` (a merge), a file without the anchor-position counts is rebuilt too.
 */
export async function openShardIndex(dir: string, shard: string, opts: { persist: boolean }): Promise<ShardIndex> {
  const file = indexFileOf(dir, shard);
  const st = await stat(path.join(dir, shard));
  let why: string;
  try {
    const head = await readHead(file);
    if (head === undefined) why = 'missing';
    else {
      const layout = parseLayout(head, file);
      const h = layout.header;
      if (opts.persist && !isAnchorHistogram(h.anchorPositions)) why = 'made by an earlier version';
      // Within a millisecond: a time set back by utimes (ms resolution) comes back rounded.
      else if (
        h.shard === shard &&
        Array.isArray(h.columns) &&
        h.bytes === st.size &&
        Math.abs(h.mtimeMs - st.mtimeMs) < 1
      ) {
        const size = (await stat(file)).size;
        if (size === layout.blobStart + (await blobLength(file, layout))) {
          return { shard, header: h, rebuilt: false, layout, bytes: await fileBytes(file) };
        }
        why = 'cut short';
      } else why = 'made from another file';
    }
  } catch (e: unknown) {
    why = `unreadable (${errorMessage(e)})`;
  }
  log().info({ dir, shard, why }, 'merge index: building the index of a shard from its rows');
  const buf = await buildShardIndex(dir, shard);
  const layout = parseLayout(buf, file);
  if (opts.persist) await writeFileAtomic(file, buf);
  return { shard, header: layout.header, rebuilt: true, layout, bytes: memoryBytes(buf) };
}

async function blobLength(file: string, layout: IndexLayout): Promise<number> {
  if (layout.header.keys === 0) return 0;
  const fh = await open(file, 'r');
  try {
    const last = Buffer.alloc(ENTRY_BYTES);
    await fh.read(last, 0, ENTRY_BYTES, layout.entriesStart + (layout.header.keys - 1) * ENTRY_BYTES);
    return last.readUInt32LE(8) + last.readUInt32LE(12);
  } finally {
    await fh.close();
  }
}

/** The index of every shard of a dataset version, opened. */
export class DatasetIndex {
  private constructor(readonly shards: ShardIndex[]) {}

  /** Opens (or rebuilds, see {@link openShardIndex}) the index of each of `shards` of `dir`. */
  static async open(dir: string, shards: readonly string[], opts: { persist: boolean }): Promise<DatasetIndex> {
    const opened: ShardIndex[] = [];
    try {
      for (const s of shards) opened.push(await openShardIndex(dir, s, opts));
    } catch (e: unknown) {
      await Promise.all(opened.map((o) => o.bytes.close()));
      throw e;
    }
    return new DatasetIndex(opened);
  }

  /** Rows, tokens and supervised tokens of the whole version, from the index headers. */
  totals(): { rows: number; tokens: number; supervisedTokens: number; keys: number } {
    let rows = 0;
    let tokens = 0;
    let supervisedTokens = 0;
    let keys = 0;
    for (const s of this.shards) {
      rows += s.header.rows;
      tokens += s.header.tokens;
      supervisedTokens += s.header.supervisedTokens;
      keys += s.header.keys;
    }
    return { rows, tokens, supervisedTokens, keys };
  }

  /**
   * Which of `query` (sorted with {@link compareHashed}) the version holds. Streams each shard's
   * entries in chunks against the sorted query, so memory does not grow with the dataset; a hash
   * match is confirmed by reading the key.
   */
  async findExisting(query: readonly HashedKey[]): Promise<Set<string>> {
    const found = new Set<string>();
    if (query.length === 0) return found;
    for (const s of this.shards) {
      const n = s.header.keys;
      let q = 0;
      for (let start = 0; start < n && q < query.length; start += CHUNK_ENTRIES) {
        const count = Math.min(CHUNK_ENTRIES, n - start);
        const chunk = await s.bytes.read(s.layout.entriesStart + start * ENTRY_BYTES, count * ENTRY_BYTES);
        for (let i = 0; i < count && q < query.length; i++) {
          const hi = chunk.readUInt32LE(i * ENTRY_BYTES);
          const lo = chunk.readUInt32LE(i * ENTRY_BYTES + 4);
          let k = query[q] as HashedKey;
          while (k.hi < hi || (k.hi === hi && k.lo < lo)) {
            if (++q >= query.length) break;
            k = query[q] as HashedKey;
          }
          if (q >= query.length) break;
          if (k.hi !== hi || k.lo !== lo) continue;
          const key = await this.keyAt(s, chunk, i);
          for (let j = q; j < query.length; j++) {
            const m = query[j] as HashedKey;
            if (m.hi !== hi || m.lo !== lo) break;
            if (m.key === key) found.add(key);
          }
        }
      }
    }
    return found;
  }

  private async keyAt(s: ShardIndex, chunk: Buffer, i: number): Promise<string> {
    const off = chunk.readUInt32LE(i * ENTRY_BYTES + 8);
    const len = chunk.readUInt32LE(i * ENTRY_BYTES + 12);
    return (await s.bytes.read(s.layout.blobStart + off, len)).toString('utf8');
  }

  /**
   * An in-memory filter for looking keys up one at a time (the tokenize step, which streams its
   * rows): holds the hashes of every entry (16 bytes a row); keys are read on a hash match.
   */
  async memoryFilter(): Promise<KeyFilter> {
    const parts: { entries: Buffer; shard: ShardIndex }[] = [];
    for (const s of this.shards) {
      parts.push({ entries: await s.bytes.read(s.layout.entriesStart, s.header.keys * ENTRY_BYTES), shard: s });
    }
    return new KeyFilter(parts);
  }

  async close(): Promise<void> {
    await Promise.all(this.shards.map((s) => s.bytes.close()));
  }
}

/** Exact membership of sample keys, one lookup at a time (see {@link DatasetIndex.memoryFilter}). */
export class KeyFilter {
  constructor(private readonly parts: { entries: Buffer; shard: ShardIndex }[]) {}

  /** Whether the dataset version holds `dataset` / `id`. */
  async has(dataset: string, id: string): Promise<boolean> {
    const key = sampleKey(dataset, id);
    const [hi, lo] = keyHash(key);
    for (const { entries, shard } of this.parts) {
      let a = 0;
      let b = entries.length / ENTRY_BYTES;
      while (a < b) {
        const m = (a + b) >>> 1;
        const h = entries.readUInt32LE(m * ENTRY_BYTES);
        const l = entries.readUInt32LE(m * ENTRY_BYTES + 4);
        if (h < hi || (h === hi && l < lo)) a = m + 1;
        else b = m;
      }
      for (let i = a; i < entries.length / ENTRY_BYTES; i++) {
        if (entries.readUInt32LE(i * ENTRY_BYTES) !== hi || entries.readUInt32LE(i * ENTRY_BYTES + 4) !== lo) break;
        const off = entries.readUInt32LE(i * ENTRY_BYTES + 8);
        const len = entries.readUInt32LE(i * ENTRY_BYTES + 12);
        if ((await shard.bytes.read(shard.layout.blobStart + off, len)).toString('utf8') === key) return true;
      }
    }
    return false;
  }
}

/** Writes the index bytes of a new shard to `file` (its parent folder is created). */
export async function writeShardIndex(file: string, buf: Buffer): Promise<void> {
  await writeFileAtomic(file, buf);
}
