/**
 * Compact, memory-bounded helpers for finding repeated sample ids in a prompt file without
 * holding every id in memory (a `Map` of 20M ids costs ~3.5 GB and V8 refuses more than
 * 16,777,216 entries).
 *
 * - {@link BloomFilter}: a fixed-size bit array (off the V8 heap). "No" is certain; "maybe"
 *   is a false positive with a small probability, so a positive is only ever a *suspect*,
 *   confirmed exactly elsewhere (see `PromptFileIndex` in source.ts).
 * - {@link fastPromptId}: a record's `id` read from the start of its line without parsing
 *   the whole JSON, when that is safe.
 */

/** The smallest and largest filters (bits); sized from the file in between. */
const MIN_BITS = 2 ** 16;
const MAX_BITS = 2 ** 30; // 128 MiB
/** Bits per block: one 64-byte cache line, so a lookup costs one cache miss, not seven. */
const BLOCK_BITS = 512;
const HASHES = 7;

/**
 * A blocked Bloom filter over strings: an id's `k = 7` bits all lie in one 512-bit block (one
 * cache line), chosen by a first 32-bit hash; the bits inside it by double hashing of a
 * second. At 13 bits per id it answers "maybe" for an absent id about 0.3 % of the time.
 */
export class BloomFilter {
  private readonly bits: Uint8Array;
  private readonly blockMask: number;

  /** `sizeBits` is rounded up to a power of two within [2^16, 2^30]. */
  constructor(sizeBits: number) {
    let m = MIN_BITS;
    while (m < sizeBits && m < MAX_BITS) m *= 2;
    this.bits = new Uint8Array(m / 8);
    this.blockMask = m / BLOCK_BITS - 1;
  }

  /**
   * A filter for a file of `fileBytes` bytes: at least 13 bits a line for lines of 40 bytes
   * or more (a line is at least ~15 bytes, so very short lines get fewer).
   */
  static forFileBytes(fileBytes: number): BloomFilter {
    return new BloomFilter(Math.ceil(fileBytes / 3));
  }

  /** Memory the filter holds (bytes). */
  get sizeBytes(): number {
    return this.bits.length;
  }

  /** Adds `key`; returns whether it was (maybe) there already. */
  testAndAdd(key: string): boolean {
    const [h1, h2] = hash2(key);
    const base = (h1 & this.blockMask) * BLOCK_BITS;
    const step = (h2 >>> 9) | 1;
    let present = true;
    for (let i = 0; i < HASHES; i += 1) {
      const bit = base + ((h2 + Math.imul(i, step)) & (BLOCK_BITS - 1));
      const byte = bit >>> 3;
      const flag = 1 << (bit & 7);
      const old = this.bits[byte] ?? 0;
      if ((old & flag) === 0) {
        present = false;
        this.bits[byte] = old | flag;
      }
    }
    return present;
  }

  /** Whether `key` may have been added (false: certainly not). */
  has(key: string): boolean {
    const [h1, h2] = hash2(key);
    const base = (h1 & this.blockMask) * BLOCK_BITS;
    const step = (h2 >>> 9) | 1;
    for (let i = 0; i < HASHES; i += 1) {
      const bit = base + ((h2 + Math.imul(i, step)) & (BLOCK_BITS - 1));
      if (((this.bits[bit >>> 3] ?? 0) & (1 << (bit & 7))) === 0) return false;
    }
    return true;
  }
}

/** MurmurHash3's 32-bit finalizer. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85eb_ca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2_ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Two independent 32-bit hashes of a string's UTF-16 code units. */
function hash2(key: string): [number, number] {
  let a = 0x811c_9dc5;
  let b = 0x9747_b28c;
  for (let i = 0; i < key.length; i += 1) {
    const c = key.charCodeAt(i);
    a = Math.imul(a ^ c, 0x0100_0193);
    b = Math.imul(b ^ c, 0x5bd1_e995);
    b ^= b >>> 15;
  }
  return [fmix32(a ^ key.length), fmix32(b + key.length)];
}

// JSON forbids raw control characters in strings; such a token goes through JSON.parse.
const NEEDS_JSON_PARSE = /[\\\u0000-\u001f]/;
const WS = '[ \\t\\r\\n]*';
const LEADING_ID = new RegExp(
  `^${WS}\\{${WS}"id"${WS}:${WS}("(?:[^"\\\\]|\\\\.)*"|-?(?:0|[1-9]\\d*)(?:\\.\\d+)?(?:[eE][+-]?\\d+)?)${WS}[,}]`,
);

/**
 * The sample id of a JSONL line whose first key is `"id"`, read without parsing the rest of
 * the line; `undefined` when that cannot be done safely (no leading `"id"`, an `"id"` key
 * elsewhere in the line, which JSON.parse would let win, or an id that is not a non-empty
 * string or a finite number), and the caller parses the line in full.
 *
 * When it returns an id, it is the id `parsePromptLine` gives the line if the line is valid.
 * It does not say the line is valid.
 */
export function fastPromptId(text: string): string | undefined {
  const m = LEADING_ID.exec(text);
  const token = m?.[1];
  if (m === null || token === undefined) return undefined;
  if (text.indexOf('"id"', m[0].length) !== -1) return undefined;
  // A plain string token (no escapes, no control characters) is its own value.
  if (token.startsWith('"') && !NEEDS_JSON_PARSE.test(token)) {
    const id = token.slice(1, -1);
    return id.trim() === '' ? undefined : id;
  }
  let value: unknown;
  try {
    value = JSON.parse(token);
  } catch {
    return undefined;
  }
  if (typeof value === 'string') return value.trim() === '' ? undefined : value;
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  return undefined;
}
