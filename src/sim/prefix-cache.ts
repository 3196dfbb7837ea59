/**
 * A stand-in for SGLang's radix cache: remembers prompt prefixes in blocks of `blockTokens`
 * and reports how many leading tokens of a new prompt were seen before (`cached_tokens`).
 * Bounded: the least recently used blocks are forgotten first.
 */
export class PrefixCache {
  private readonly blocks = new Map<string, true>();

  constructor(
    private readonly blockTokens = 16,
    private readonly maxBlocks = 500_000,
  ) {}

  /** Cached prefix length of `ids` (whole blocks, at most `ids.length - 1`); records the prompt. */
  lookupAndInsert(ids: readonly number[]): number {
    let h1 = 0x811c9dc5;
    let h2 = 0x9747b28c;
    let cached = 0;
    let missed = false;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i] ?? 0;
      h1 = Math.imul(h1 ^ id, 0x01000193) >>> 0;
      h2 = Math.imul(h2 ^ (id + 0x9e3779b9), 0x5bd1e995) >>> 0;
      h2 ^= h2 >>> 15;
      if ((i + 1) % this.blockTokens !== 0) continue;
      const key = `${i + 1}:${h1}:${h2}`;
      if (!missed && this.blocks.has(key)) {
        this.blocks.delete(key);
        cached = i + 1;
      } else {
        missed = true;
      }
      this.blocks.set(key, true);
    }
    while (this.blocks.size > this.maxBlocks) {
      const oldest = this.blocks.keys().next();
      if (oldest.done === true) break;
      this.blocks.delete(oldest.value);
    }
    return Math.max(0, Math.min(cached, ids.length - 1));
  }

  clear(): void {
    this.blocks.clear();
  }
}
