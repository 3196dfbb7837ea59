/**
 * 64-bit hashes of prompts and ids, and a set of them that costs about 16 bytes an entry:
 * what `prepare` remembers of every prompt it has seen, instead of the prompt.
 */
import { createHash } from 'node:crypto';
import type { ChatMessage } from '../../shared/index.js';

/** A 64-bit hash as two unsigned 32-bit halves. */
export interface Hash64 {
  hi: number;
  lo: number;
}

function hash64(text: string): Hash64 {
  const d = createHash('sha256').update(text).digest();
  return { hi: d.readUInt32BE(0), lo: d.readUInt32BE(4) };
}

/**
 * The hash two prompts share when their messages are the same: role, content and the other
 * fields the prompt file keeps (tool calls, names), compared exactly — and their tool schemas,
 * when they have some (the same chat with other tools is another prompt).
 */
export function messagesHash(messages: readonly ChatMessage[], tools?: readonly unknown[]): Hash64 {
  return hash64(JSON.stringify(tools === undefined ? messages : { messages, tools }));
}

/** The hash of an id. */
export function idHash(id: string): Hash64 {
  return hash64(`id\u0000${id}`);
}

/** Where a prompt falls in the shuffled order of `seed`: the smaller, the earlier. */
export function shuffleRank(seed: number, id: string): bigint {
  return createHash('sha256').update(`${seed}\u0000${id}`).digest().readBigUInt64BE(0);
}

const MIN_CAPACITY = 1024;

/** A set of {@link Hash64}: open addressing over one typed array, grown at half full. */
export class Hash64Set {
  private table = new Uint32Array(MIN_CAPACITY * 2);
  private mask = MIN_CAPACITY - 1;
  private count = 0;
  // (0, 0) marks an empty slot, so that hash is kept aside.
  private hasZero = false;

  /** Entries in the set. */
  get size(): number {
    return this.count + (this.hasZero ? 1 : 0);
  }

  /** Bytes the table takes. */
  get bytes(): number {
    return this.table.byteLength;
  }

  has(h: Hash64): boolean {
    if (h.hi === 0 && h.lo === 0) return this.hasZero;
    return this.slotOf(h, this.table, this.mask) < 0;
  }

  /** Adds `h`; false when it was there already. */
  add(h: Hash64): boolean {
    if (h.hi === 0 && h.lo === 0) {
      if (this.hasZero) return false;
      this.hasZero = true;
      return true;
    }
    const slot = this.slotOf(h, this.table, this.mask);
    if (slot < 0) return false;
    this.table[slot * 2] = h.hi;
    this.table[slot * 2 + 1] = h.lo;
    this.count += 1;
    if (this.count * 2 > this.mask + 1) this.grow();
    return true;
  }

  /** The free slot for `h`, or -1 when `h` is in the table. */
  private slotOf(h: Hash64, table: Uint32Array, mask: number): number {
    let i = (h.lo ^ h.hi) & mask;
    for (;;) {
      const hi = table[i * 2] ?? 0;
      const lo = table[i * 2 + 1] ?? 0;
      if (hi === 0 && lo === 0) return i;
      if (hi === h.hi && lo === h.lo) return -1;
      i = (i + 1) & mask;
    }
  }

  private grow(): void {
    const old = this.table;
    const capacity = (this.mask + 1) * 2;
    const table = new Uint32Array(capacity * 2);
    const mask = capacity - 1;
    for (let i = 0; i < old.length; i += 2) {
      const hi = old[i] ?? 0;
      const lo = old[i + 1] ?? 0;
      if (hi === 0 && lo === 0) continue;
      const slot = this.slotOf({ hi, lo }, table, mask);
      table[slot * 2] = hi;
      table[slot * 2 + 1] = lo;
    }
    this.table = table;
    this.mask = mask;
  }
}
