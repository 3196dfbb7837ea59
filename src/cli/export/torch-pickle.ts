/**
 * Python pickle, protocol 2, of a `dict[int, int]`: the bytes Python's own `pickle.dumps(d,
 * protocol=2)` writes (and so `torch.save`, whose pickler is Python's with protocol 2), which
 * `torch.load(path, weights_only=True)` reads. Only what such a dict needs: integers and one
 * dict, written in the dict's iteration order.
 */

const PROTO = 0x80;
const EMPTY_DICT = 0x7d; // '}'
const BINPUT = 0x71; // 'q'
const MARK = 0x28; // '('
const SETITEM = 0x73; // 's'
const SETITEMS = 0x75; // 'u'
const BININT = 0x4a; // 'J': 4-byte signed
const BININT1 = 0x4b; // 'K': 1-byte unsigned
const BININT2 = 0x4d; // 'M': 2-byte unsigned
const LONG1 = 0x8a; // 1-byte length, then that many bytes of two's complement, little-endian
const STOP = 0x2e; // '.'

/** Pairs per MARK … SETITEMS batch, as Python's pickler cuts them (its BATCHSIZE). */
const BATCH = 1000;

/** A growable byte buffer. */
class Bytes {
  #buf = Buffer.alloc(1024);
  length = 0;

  #room(n: number): void {
    if (this.length + n <= this.#buf.length) return;
    let cap = this.#buf.length * 2;
    while (cap < this.length + n) cap *= 2;
    const next = Buffer.alloc(cap);
    this.#buf.copy(next, 0, 0, this.length);
    this.#buf = next;
  }

  byte(b: number): void {
    this.#room(1);
    this.#buf[this.length++] = b;
  }

  uint16(v: number): void {
    this.#room(2);
    this.#buf.writeUInt16LE(v, this.length);
    this.length += 2;
  }

  int32(v: number): void {
    this.#room(4);
    this.#buf.writeInt32LE(v, this.length);
    this.length += 4;
  }

  bytes(b: Uint8Array): void {
    this.#room(b.length);
    this.#buf.set(b, this.length);
    this.length += b.length;
  }

  take(): Buffer {
    return Buffer.from(this.#buf.subarray(0, this.length));
  }
}

/** Python's `save_long` for protocol 2: BININT1/BININT2/BININT within int32, LONG1 beyond. */
function writeInt(out: Bytes, v: number): void {
  if (!Number.isSafeInteger(v)) throw new RangeError(`cannot pickle ${String(v)}: not a safe integer`);
  if (v >= 0 && v <= 0xff) {
    out.byte(BININT1);
    out.byte(v);
  } else if (v >= 0 && v <= 0xffff) {
    out.byte(BININT2);
    out.uint16(v);
  } else if (v >= -0x80000000 && v <= 0x7fffffff) {
    out.byte(BININT);
    out.int32(v);
  } else {
    out.byte(LONG1);
    out.bytes(longBytes(v));
  }
}

/**
 * The LONG1 payload: length byte, then the value in little-endian two's complement with as few
 * bytes as Python uses (bit length / 8 + 1, one less for a negative value whose top byte is
 * only sign).
 */
function longBytes(v: number): Uint8Array {
  const big = BigInt(v);
  const magnitude = big < 0n ? -big : big;
  const bits = magnitude.toString(2).length;
  let n = (bits >> 3) + 1;
  const bytes = new Uint8Array(n);
  let x = big < 0n ? (1n << BigInt(8 * n)) + big : big;
  for (let i = 0; i < n; i++) {
    bytes[i] = Number(x & 0xffn);
    x >>= 8n;
  }
  if (big < 0n && n > 1 && bytes[n - 1] === 0xff && ((bytes[n - 2] as number) & 0x80) !== 0) n -= 1;
  const out = new Uint8Array(n + 1);
  out[0] = n;
  out.set(bytes.subarray(0, n), 1);
  return out;
}

/**
 * Pickles `entries` (key → value, both integers) as one Python dict, protocol 2, byte for byte
 * as CPython writes it: the dict memoized as 0, a single pair as SETITEM, more in MARK …
 * SETITEMS batches of 1000 (an empty last batch when the size is a multiple of 1000, as CPython
 * writes it too).
 */
export function pickleIntDict(entries: Iterable<readonly [number, number]> | ReadonlyMap<number, number>): Buffer {
  const pairs = entries instanceof Map ? [...(entries as ReadonlyMap<number, number>).entries()] : [...entries];
  const out = new Bytes();
  out.byte(PROTO);
  out.byte(2);
  out.byte(EMPTY_DICT);
  out.byte(BINPUT);
  out.byte(0);
  if (pairs.length === 1) {
    const [k, v] = pairs[0] as readonly [number, number];
    writeInt(out, k);
    writeInt(out, v);
    out.byte(SETITEM);
  } else if (pairs.length > 1) {
    let i = 0;
    let inBatch: number;
    do {
      out.byte(MARK);
      inBatch = 0;
      while (i < pairs.length && inBatch < BATCH) {
        const [k, v] = pairs[i] as readonly [number, number];
        writeInt(out, k);
        writeInt(out, v);
        i++;
        inBatch++;
      }
      out.byte(SETITEMS);
    } while (inBatch === BATCH);
  }
  out.byte(STOP);
  return out.take();
}
