/**
 * tiktoken's byte-pair encoding, over a rank file (`tiktoken.model`, `*.tiktoken`: one
 * `<base64 token bytes> <rank>` per line).
 *
 * A regex piece's UTF-8 bytes are merged exactly as tiktoken's `_byte_pair_merge` does: start
 * from single bytes, repeatedly merge the adjacent pair whose concatenation has the lowest rank
 * (the leftmost one on ties), until no adjacent pair is in the ranks; a piece that is itself a
 * token is that token. Byte strings are held as latin-1 JS strings (one char per byte), which
 * makes the rank table a plain `Map` and slices cheap. Pieces are cached (bounded), so
 * repeated words cost one lookup.
 */
import { readFile } from 'node:fs/promises';

import { EnvironmentError, errorMessage } from '../errors.js';

/** Parsed rank file: token bytes (latin-1 string) → rank, and rank → bytes. */
export interface RankTable {
  /** Token bytes as a latin-1 string → rank. */
  ranks: Map<string, number>;
  /** Rank → token bytes as a latin-1 string; holes (ranks no line gave) are undefined. */
  bytesByRank: (string | undefined)[];
}

/**
 * Parses rank-file text. Throws an {@link EnvironmentError} naming `file` and the line of a
 * malformed entry or a repeated rank.
 */
export function parseRankFile(text: string, file: string): RankTable {
  const ranks = new Map<string, number>();
  const bytesByRank: (string | undefined)[] = [];
  let lineNo = 0;
  let start = 0;
  while (start < text.length) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    lineNo++;
    const lineStart = start;
    start = end + 1;
    if (end > lineStart && text.charCodeAt(end - 1) === 13) end--;
    if (end === lineStart) continue;
    const space = text.indexOf(' ', lineStart);
    const rank = space < 0 || space >= end ? NaN : Number(text.slice(space + 1, end));
    let key: string | undefined;
    try {
      key = Number.isInteger(rank) && rank >= 0 ? atob(text.slice(lineStart, space)) : undefined;
    } catch {
      key = undefined;
    }
    if (key === undefined) {
      throw new EnvironmentError(
        `tiktoken rank file ${file}:${lineNo}: expected "<base64 token> <rank>", got ${JSON.stringify(text.slice(lineStart, Math.min(end, lineStart + 80)))}`,
      );
    }
    if (bytesByRank[rank] !== undefined)
      throw new EnvironmentError(`tiktoken rank file ${file}:${lineNo}: rank ${rank} appears twice`);
    ranks.set(key, rank);
    bytesByRank[rank] = key;
  }
  if (ranks.size === 0) throw new EnvironmentError(`tiktoken rank file ${file} holds no tokens`);
  return { ranks, bytesByRank };
}

/** Reads and parses a rank file; errors name the file. */
export async function readRankFile(file: string): Promise<RankTable> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e: unknown) {
    throw new EnvironmentError(`tiktoken rank file ${file} cannot be read: ${errorMessage(e)}`, { cause: e });
  }
  return parseRankFile(text, file);
}

/** Pieces remembered with their ids; the cache is dropped whole when it grows past this. */
const PIECE_CACHE_LIMIT = 200_000;
const NO_RANK = 0x7fffffff;

/** Merges byte pieces into ranks (see the module comment). */
export class BytePairEncoder {
  readonly #ranks: Map<string, number>;
  readonly #cache = new Map<string, readonly number[]>();
  /** Scratch arrays, grown as needed: part start offsets and the rank of each part with its successor. */
  #starts = new Int32Array(64);
  #pairRanks = new Int32Array(64);

  constructor(ranks: Map<string, number>) {
    this.#ranks = ranks;
  }

  /** Appends the ids of `piece` (a regex match, as text) to `out`. */
  encodePiece(piece: string, out: number[]): void {
    const cached = this.#cache.get(piece);
    if (cached !== undefined) {
      for (const id of cached) out.push(id);
      return;
    }
    const bytes = Buffer.from(piece, 'utf8').toString('latin1');
    const whole = this.#ranks.get(bytes);
    const ids = whole !== undefined ? [whole] : this.#merge(bytes);
    if (this.#cache.size >= PIECE_CACHE_LIMIT) this.#cache.clear();
    this.#cache.set(piece, ids);
    for (const id of ids) out.push(id);
  }

  #rank(bytes: string, from: number, to: number): number {
    return this.#ranks.get(bytes.slice(from, to)) ?? NO_RANK;
  }

  /** tiktoken's `_byte_pair_merge` followed by the rank lookup of each part. */
  #merge(bytes: string): number[] {
    const n = bytes.length;
    if (n === 0) return [];
    if (this.#starts.length < n + 1) {
      this.#starts = new Int32Array(2 * (n + 1));
      this.#pairRanks = new Int32Array(2 * (n + 1));
    }
    const starts = this.#starts;
    const pairRanks = this.#pairRanks;
    // parts[i] = (starts[i], pairRanks[i]) for i < len; the last two are sentinels, as in tiktoken.
    let len = n + 1;
    for (let i = 0; i < n - 1; i++) {
      starts[i] = i;
      pairRanks[i] = this.#rank(bytes, i, i + 2);
    }
    starts[n - 1] = n - 1;
    pairRanks[n - 1] = NO_RANK;
    starts[n] = n;
    pairRanks[n] = NO_RANK;
    const rankAfterMerge = (i: number): number =>
      i + 3 < len ? this.#rank(bytes, starts[i] ?? 0, starts[i + 3] ?? 0) : NO_RANK;
    for (;;) {
      let minRank = NO_RANK;
      let at = -1;
      for (let i = 0; i < len - 1; i++) {
        const r = pairRanks[i] ?? NO_RANK;
        if (r < minRank) {
          minRank = r;
          at = i;
        }
      }
      if (at < 0) break;
      if (at > 0) pairRanks[at - 1] = rankAfterMerge(at - 1);
      pairRanks[at] = rankAfterMerge(at);
      starts.copyWithin(at + 1, at + 2, len);
      pairRanks.copyWithin(at + 1, at + 2, len);
      len--;
    }
    const ids: number[] = [];
    for (let i = 0; i < len - 1; i++) {
      const id = this.#ranks.get(bytes.slice(starts[i] ?? 0, starts[i + 1] ?? 0));
      if (id === undefined) {
        throw new EnvironmentError(
          'tiktoken ranks lack a single byte that the text needs: the rank file is incomplete',
        );
      }
      ids.push(id);
    }
    return ids;
  }
}
