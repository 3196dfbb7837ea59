/**
 * `limit` with `shuffle`: the `limit` prompts whose rank (a hash of the seed and the id) is
 * smallest, in rank order — the same subset for the same seed, whatever the order rows come
 * in, in memory that grows with `limit`, not with the source.
 *
 * A max-heap keeps the ranks, ids, content hashes and the place of each kept line in a spill
 * file; a prompt enters only when it ranks below the heap's largest, so the spill file holds
 * about `limit · (1 + ln(rows / limit))` lines, not the source.
 */
import { open, rm, type FileHandle } from 'node:fs/promises';
import type { Hash64 } from './prompt-hash.js';
import { tempNameFor } from '../../shared/index.js';
import { shuffleRank } from './prompt-hash.js';

interface Entry {
  rank: bigint;
  offset: number;
  length: number;
  hash: Hash64;
}

/** A prompt the subset keeps: its line and its content hash. */
export interface SubsetLine {
  line: string;
  hash: Hash64;
}

export class ShuffledSubset {
  private readonly heap: Entry[] = [];
  private spillBytes = 0;

  private constructor(
    private readonly limit: number,
    private readonly seed: number,
    private readonly spillFile: string,
    private readonly fh: FileHandle,
  ) {}

  /** A subset of `limit` prompts; its spill file lies next to `nearFile` until {@link close}. */
  static async open(limit: number, seed: number, nearFile: string): Promise<ShuffledSubset> {
    const spill = tempNameFor(nearFile, 'subset');
    return new ShuffledSubset(limit, seed, spill, await open(spill, 'wx+'));
  }

  /** Offers a prompt: `kept` (room left), `replaced` (it pushed out the largest rank) or `dropped`. */
  async offer(id: string, line: string, hash: Hash64): Promise<'kept' | 'dropped' | 'replaced'> {
    const rank = shuffleRank(this.seed, id);
    const full = this.heap.length >= this.limit;
    if (full && rank >= (this.heap[0]?.rank ?? 0n)) return 'dropped';
    const buf = Buffer.from(line, 'utf8');
    const entry: Entry = { rank, offset: this.spillBytes, length: buf.length, hash };
    let off = 0;
    while (off < buf.length)
      off += (await this.fh.write(buf, off, buf.length - off, this.spillBytes + off)).bytesWritten;
    this.spillBytes += buf.length;
    if (full) {
      this.heap[0] = entry;
      this.siftDown(0);
      return 'replaced';
    }
    this.heap.push(entry);
    this.siftUp(this.heap.length - 1);
    return 'kept';
  }

  /** Prompts held. */
  get size(): number {
    return this.heap.length;
  }

  /** The subset's lines in rank order. */
  async *lines(): AsyncGenerator<SubsetLine> {
    const sorted = [...this.heap].sort((a, b) => (a.rank < b.rank ? -1 : a.rank > b.rank ? 1 : a.offset - b.offset));
    for (const e of sorted) {
      const buf = Buffer.alloc(e.length);
      let off = 0;
      while (off < e.length) {
        const { bytesRead } = await this.fh.read(buf, off, e.length - off, e.offset + off);
        if (bytesRead === 0) throw new Error(`subset spill file ${this.spillFile} is shorter than expected`);
        off += bytesRead;
      }
      yield { line: buf.toString('utf8'), hash: e.hash };
    }
  }

  /** Closes and removes the spill file. */
  async close(): Promise<void> {
    await this.fh.close().catch(() => undefined);
    await rm(this.spillFile, { force: true });
  }

  private siftUp(i: number): void {
    const h = this.heap;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const a = h[i];
      const p = h[parent];
      if (a === undefined || p === undefined || p.rank >= a.rank) return;
      h[i] = p;
      h[parent] = a;
      i = parent;
    }
  }

  private siftDown(i: number): void {
    const h = this.heap;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let largest = i;
      if ((h[l]?.rank ?? -1n) > (h[largest]?.rank ?? -1n)) largest = l;
      if ((h[r]?.rank ?? -1n) > (h[largest]?.rank ?? -1n)) largest = r;
      if (largest === i) return;
      const tmp = h[i] as Entry;
      h[i] = h[largest] as Entry;
      h[largest] = tmp;
      i = largest;
    }
  }
}
