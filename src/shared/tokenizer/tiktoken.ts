/**
 * The tiktoken encoding engine: a rank file, a split pattern and special tokens, encoding as
 * Python `tiktoken`'s `Encoding.encode(text, allowed_special="all")` does (what Kimi's
 * `tokenization_kimi.py` calls):
 *
 * - special tokens written in the text are matched first, as whole tokens (the leftmost; the
 *   longest of those starting there);
 * - the text between them is split by the pattern, and each piece is byte-pair merged over the
 *   ranks (bpe.ts);
 * - with the `kimi-k2` preset, the text is first cut as `tokenization_kimi.py` cuts it: into
 *   chunks of 400,000 code points, then where a run of whitespace or non-whitespace exceeds
 *   25,000 code points.
 *
 * Token strings (`idToToken`) are the byte-level (GPT-2 alphabet) spelling of the token's
 * bytes, as Kimi's tokenizer reports them; special tokens are their own text.
 */
import { BytePairEncoder, type RankTable } from './bpe.js';
import type { AddedTokenEntry } from './config-json.js';
import type { TokenEncoder } from './encoder.js';
import { compileSplitPattern } from './pattern.js';

/** GPT-2's byte-level alphabet: byte → the character that stands for it. */
const BYTE_TO_CHAR: string[] = (() => {
  const out: string[] = new Array<string>(256);
  const printable = (b: number): boolean => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let extra = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCharCode(printable(b) ? b : 256 + extra++);
  return out;
})();
const CHAR_TO_BYTE = new Map(BYTE_TO_CHAR.map((c, b) => [c, b]));

/** Python's `str.isspace()`: the characters Kimi's whitespace-run cut treats as space. */
const PY_SPACE = /[\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]/u;

/** How the text is cut before encoding (the `kimi-k2` preset), in code points. */
/** `tokenizer.preset`: a tiktoken tokenizer whose split pattern and limits tokenmill knows. */
export type TokenizerPreset = 'kimi-k2';

export interface ChunkLimits {
  maxChunkChars: number;
  maxRunChars: number;
}

/** `tokenization_kimi.py`'s limits. */
export const KIMI_CHUNK_LIMITS: ChunkLimits = { maxChunkChars: 400_000, maxRunChars: 25_000 };

/** What a {@link TiktokenEncoder} is built from. */
export interface TiktokenParams {
  ranks: RankTable;
  /** The split pattern, in tiktoken's (Rust regex) syntax. */
  pattern: string;
  /** Where the pattern came from, for errors. */
  patternSource: string;
  /** Special tokens: text → id, with whether transformers marks them special. */
  specialTokens: readonly AddedTokenEntry[];
  chunkLimits?: ChunkLimits;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
}

/** Cuts `text` as `tokenization_kimi.py` does (see the module comment). */
export function* chunkText(text: string, limits: ChunkLimits): Generator<string> {
  const cps = [...text];
  for (let i = 0; i < cps.length || (i === 0 && cps.length === 0); i += limits.maxChunkChars) {
    const chunk = cps.slice(i, i + limits.maxChunkChars);
    let runLen = 0;
    let runIsSpace = chunk.length > 0 && PY_SPACE.test(chunk[0] ?? '');
    let start = 0;
    for (let j = 0; j < chunk.length; j++) {
      const isSpace = PY_SPACE.test(chunk[j] ?? '');
      if (runIsSpace !== isSpace) {
        runLen = 1;
        runIsSpace = isSpace;
      } else if (++runLen > limits.maxRunChars) {
        yield chunk.slice(start, j).join('');
        start = j;
        runLen = 1;
      }
    }
    yield chunk.slice(start).join('');
    if (cps.length === 0) break;
  }
}

/** A {@link TokenEncoder} over a tiktoken rank file (see the module comment). */
export class TiktokenEncoder implements TokenEncoder {
  readonly kind = 'tiktoken' as const;
  readonly addedTokens: readonly AddedTokenEntry[];
  readonly size: number;
  readonly #table: RankTable;
  readonly #bpe: BytePairEncoder;
  readonly #split: RegExp;
  readonly #special: RegExp | undefined;
  readonly #specialByText = new Map<string, number>();
  readonly #specialById = new Map<number, AddedTokenEntry>();
  readonly #specialBytes = new Map<number, Uint8Array>();
  readonly #chunkLimits: ChunkLimits | undefined;
  readonly #decoder = new TextDecoder('utf-8');
  readonly #bytesCache: (Uint8Array | undefined)[] = [];

  constructor(p: TiktokenParams) {
    this.#table = p.ranks;
    this.#bpe = new BytePairEncoder(p.ranks.ranks);
    this.#split = compileSplitPattern(p.pattern, p.patternSource);
    this.#chunkLimits = p.chunkLimits;
    this.addedTokens = p.specialTokens;
    let maxId = p.ranks.bytesByRank.length - 1;
    for (const t of p.specialTokens) {
      this.#specialByText.set(t.content, t.id);
      this.#specialById.set(t.id, t);
      this.#specialBytes.set(t.id, new Uint8Array(Buffer.from(t.content, 'utf8')));
      if (t.id > maxId) maxId = t.id;
    }
    this.size = maxId + 1;
    const texts = [...this.#specialByText.keys()].filter((t) => t !== '').sort((a, b) => b.length - a.length);
    this.#special = texts.length === 0 ? undefined : new RegExp(texts.map(escapeRegExp).join('|'), 'gu');
  }

  *baseIds(): Iterable<number> {
    const bytes = this.#table.bytesByRank;
    for (let id = 0; id < bytes.length; id++) if (bytes[id] !== undefined && !this.#specialById.has(id)) yield id;
  }

  encode(text: string): number[] {
    const out: number[] = [];
    const special = this.#special;
    if (special === undefined) {
      this.#encodeOrdinary(text, out);
      return out;
    }
    special.lastIndex = 0;
    let from = 0;
    for (let m = special.exec(text); m !== null; m = special.exec(text)) {
      if (m.index > from) this.#encodeOrdinary(text.slice(from, m.index), out);
      out.push(this.#specialByText.get(m[0]) ?? -1);
      from = m.index + m[0].length;
    }
    if (from < text.length) this.#encodeOrdinary(from === 0 ? text : text.slice(from), out);
    return out;
  }

  #encodeOrdinary(text: string, out: number[]): void {
    if (this.#chunkLimits !== undefined && text.length > this.#chunkLimits.maxRunChars) {
      for (const chunk of chunkText(text, this.#chunkLimits)) this.#encodeChunk(chunk, out);
    } else {
      this.#encodeChunk(text, out);
    }
  }

  #encodeChunk(text: string, out: number[]): void {
    const re = this.#split;
    re.lastIndex = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      const piece = m[0];
      if (piece === '') {
        re.lastIndex += (text.codePointAt(re.lastIndex) ?? 0) > 0xffff ? 2 : 1;
        continue;
      }
      this.#bpe.encodePiece(piece, out);
    }
  }

  decode(ids: readonly number[], skipSpecial: boolean): string {
    const parts: Uint8Array[] = [];
    let total = 0;
    for (const id of ids) {
      const special = this.#specialById.get(id);
      if (special !== undefined && skipSpecial && special.special) continue;
      const bytes = this.tokenBytes(id);
      if (bytes === undefined) continue;
      parts.push(bytes);
      total += bytes.length;
    }
    const all = new Uint8Array(total);
    let at = 0;
    for (const p of parts) {
      all.set(p, at);
      at += p.length;
    }
    return this.#decoder.decode(all);
  }

  tokenToId(token: string): number | undefined {
    const special = this.#specialByText.get(token);
    if (special !== undefined) return special;
    let key = '';
    for (const ch of token) {
      const b = CHAR_TO_BYTE.get(ch);
      if (b === undefined) return undefined;
      key += String.fromCharCode(b);
    }
    return this.#table.ranks.get(key);
  }

  idToToken(id: number): string | undefined {
    const special = this.#specialById.get(id);
    if (special !== undefined) return special.content;
    const bytes = this.#table.bytesByRank[id];
    if (bytes === undefined) return undefined;
    let s = '';
    for (let i = 0; i < bytes.length; i++) s += BYTE_TO_CHAR[bytes.charCodeAt(i)] ?? '';
    return s;
  }

  tokenBytes(id: number): Uint8Array | undefined {
    const special = this.#specialBytes.get(id);
    if (special !== undefined) return special;
    let bytes = this.#bytesCache[id];
    if (bytes === undefined) {
      const key = this.#table.bytesByRank[id];
      if (key === undefined) return undefined;
      bytes = new Uint8Array(key.length);
      for (let i = 0; i < key.length; i++) bytes[i] = key.charCodeAt(i);
      this.#bytesCache[id] = bytes;
    }
    return bytes;
  }
}
