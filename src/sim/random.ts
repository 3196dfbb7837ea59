/**
 * The simulator's deterministic randomness: a string hash and a small PRNG, and the stream of one
 * request (a pure function of the seed, the rid and the prompt length), so that a request repeated
 * with the same rid gets the same output.
 */

export type Rng = () => number;

/** 32-bit FNV-1a of a string, finished with a murmur3 mix. */
export function hashString(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** mulberry32: a small, fast, well-distributed 32-bit PRNG returning floats in [0, 1). */
export function mulberry32(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The PRNG stream of one request; `stream` separates independent draws (length, ids). */
export function requestRng(seed: number, rid: string, promptTokens: number, stream: string): Rng {
  return mulberry32(hashString(`${seed}\u0000${rid}\u0000${promptTokens}\u0000${stream}`));
}
