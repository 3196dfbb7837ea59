/**
 * The loss mask of a rendered conversation: which characters are the assistant's, and which
 * tokens they make supervised. See docs/design.md (Training rows) for the rule as a whole.
 *
 * The mask is SpecForge's (`GeneralParser.parse`, specforge/data/parse.py), token for token:
 * for each supervised span `[start, end)` of characters ({@link findSupervisedSpans}), the
 * tokens from `len(encode(text[:start]))` to `len(encode(text[:end]))` are 1; then, for every
 * occurrence of an ignorable string anywhere in the text (Qwen3's empty
 * `<think>\n\n</think>\n\n`, SpecForge's `ignore_token`), the tokens from
 * `len(encode(text[:a]))` to `len(encode(text[:b]))` are set back to 0 ({@link specForgeMask}).
 * Token positions come from encodings of the text's prefixes, not from where tokens fall in the
 * text. Where the two differ, SpecForge's rule wins, and that is a choice, not an accident: a
 * token that straddles a span start (Qwen's pre-tokenizer merges the header's `\n` with a
 * newline that opens the content into one `\n\n\n` token) is 0, because encoding the text up to
 * the span start ends with the header's own `\n`; and a token that straddles a span end
 * stays 1.
 *
 * The prefix encodings are not computed from scratch: a tokenizer splits its input at added
 * tokens (`<|im_end|>`, `<start_of_turn>`, Gemma's `\n`) before anything else and encodes the
 * pieces in between on their own, so `len(encode(text[:c]))` is the number of ids up to the last
 * added token that ends at or before `c`, plus the length of the encoding of the few characters
 * from there to `c`. Added tokens are found in the text leftmost-longest, as the tokenizer
 * matches them, and checked against the ids; where they do not line up, the prefixes are
 * encoded whole (slow, same result).
 *
 * {@link maskFromSpans} is the older rule on the bytes each token spells (1 on every token that
 * covers a byte of a span), kept for byte-level tokenizers that need a byte layout.
 */
import { EnvironmentError, type ChatTokenizer } from '../../shared/index.js';
import type { AssistantTurnFormat } from './tokenize-template.js';

/** A half-open range `[start, end)` of UTF-16 indices into a string. */
export interface CharSpan {
  start: number;
  end: number;
}

/**
 * The supervised character ranges of `text`, a conversation rendered by the template that
 * `format` describes, in order, disjoint: SpecForge's `GeneralParser` pattern
 * `header([\s\S]*?(?:turn_end|$))`, i.e. scanning left to right, each occurrence of
 * `format.header` opens a span right after it; the span runs through the first `format.turnEnd`
 * after that (the end-of-turn token and what the template writes after it, e.g. `<|im_end|>\n`),
 * inclusive, or, when there is none, to the end of the text less a final `\n` (Python's `$`
 * also matches before a newline that ends the string); the scan resumes after the span. When the
 * span starts with one of `format.ignorablePrefixes`, the span starts after it (the same tokens
 * as SpecForge's zeroing of its `ignore_token`, which {@link specForgeMask} also applies
 * everywhere else).
 */
export function findSupervisedSpans(text: string, format: AssistantTurnFormat): CharSpan[] {
  const spans: CharSpan[] = [];
  const { header, turnEnd, ignorablePrefixes } = format;
  const textEnd = text.endsWith('\n') ? text.length - 1 : text.length;
  let cursor = 0;
  for (;;) {
    const at = text.indexOf(header, cursor);
    if (at < 0) break;
    let start = at + header.length;
    const close = text.indexOf(turnEnd, start);
    const end = close < 0 ? Math.max(start, textEnd) : close + turnEnd.length;
    cursor = end;
    for (const prefix of ignorablePrefixes) {
      if (start + prefix.length <= end && text.startsWith(prefix, start)) {
        start += prefix.length;
        break;
      }
    }
    if (start < end) spans.push({ start, end });
  }
  return spans;
}

/** A node of the trie of added-token texts, by UTF-16 code unit. */
interface TrieNode {
  next: Map<number, TrieNode>;
  /** The id of the added token that ends here, if one does. */
  id: number;
}

/** One added token found in a text. */
interface AddedMatch {
  start: number;
  end: number;
  id: number;
}

/** The tokenizer's added tokens (ids outside its ordinary vocabulary), to find them in text. */
class AddedTokens {
  readonly #root: TrieNode = { next: new Map(), id: -1 };
  readonly #isAdded: Uint8Array;

  constructor(tokenizer: ChatTokenizer) {
    this.#isAdded = new Uint8Array(tokenizer.vocabSize).fill(1);
    for (const r of tokenizer.ordinaryTokenIdRanges) this.#isAdded.fill(0, r.start, r.end);
    for (let id = 0; id < tokenizer.vocabSize; id++) {
      if (this.#isAdded[id] !== 1) continue;
      const text = tokenizer.idToToken(id);
      if (text === undefined || text === '') {
        this.#isAdded[id] = 0;
        continue;
      }
      let node = this.#root;
      for (let i = 0; i < text.length; i++) {
        const c = text.charCodeAt(i);
        let child = node.next.get(c);
        if (child === undefined) {
          child = { next: new Map(), id: -1 };
          node.next.set(c, child);
        }
        node = child;
      }
      node.id = id;
    }
  }

  isAdded(id: number): boolean {
    return this.#isAdded[id] === 1;
  }

  /** The added tokens of `text`, leftmost-longest, not overlapping. */
  find(text: string): AddedMatch[] {
    const out: AddedMatch[] = [];
    const root = this.#root.next;
    let i = 0;
    while (i < text.length) {
      let node = root.get(text.charCodeAt(i));
      if (node === undefined) {
        i++;
        continue;
      }
      let best = -1;
      let bestEnd = i;
      let j = i + 1;
      for (;;) {
        if (node.id >= 0) {
          best = node.id;
          bestEnd = j;
        }
        if (j >= text.length) break;
        const child: TrieNode | undefined = node.next.get(text.charCodeAt(j));
        if (child === undefined) break;
        node = child;
        j++;
      }
      if (best >= 0) {
        out.push({ start: i, end: bestEnd, id: best });
        i = bestEnd;
      } else {
        i++;
      }
    }
    return out;
  }
}

const addedTables = new WeakMap<ChatTokenizer, AddedTokens>();

function addedTokens(tokenizer: ChatTokenizer): AddedTokens {
  let table = addedTables.get(tokenizer);
  if (table === undefined) {
    table = new AddedTokens(tokenizer);
    addedTables.set(tokenizer, table);
  }
  return table;
}

/**
 * `c => len(tokenizer.encode(text.slice(0, c)))` for `text` whose encoding is `ids`, computed
 * from the added tokens (see the module comment), memoized.
 */
export function prefixTokenCounter(
  tokenizer: ChatTokenizer,
  text: string,
  ids: readonly number[],
): (c: number) => number {
  const table = addedTokens(tokenizer);
  const matches = table.find(text);
  const positions: number[] = [];
  for (let i = 0; i < ids.length; i++) if (table.isAdded(ids[i] ?? -1)) positions.push(i);
  let aligned = positions.length === matches.length;
  for (let k = 0; aligned && k < matches.length; k++) aligned = ids[positions[k] ?? -1] === matches[k]?.id;
  const memo = new Map<number, number>();
  return (c: number): number => {
    const known = memo.get(c);
    if (known !== undefined) return known;
    let count: number;
    if (!aligned) {
      count = c <= 0 ? 0 : tokenizer.encode(text.slice(0, c)).length;
    } else {
      // The last added token that ends at or before c.
      let lo = 0;
      let hi = matches.length - 1;
      let k = -1;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        if ((matches[mid]?.end ?? Infinity) <= c) {
          k = mid;
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
      const from = k < 0 ? 0 : (matches[k]?.end ?? 0);
      const before = k < 0 ? 0 : (positions[k] ?? 0) + 1;
      count = before + (c > from ? tokenizer.encode(text.slice(from, c)).length : 0);
    }
    memo.set(c, count);
    return count;
  };
}

/**
 * SpecForge's loss mask over `ids`, the encoding of `text` in one piece (see the module
 * comment): 1 on the tokens of each span in `spans`, by prefix-encoding lengths, then 0 on the
 * tokens of every occurrence of each `ignorable` string in the text.
 */
export function specForgeMask(
  tokenizer: ChatTokenizer,
  text: string,
  ids: readonly number[],
  spans: readonly CharSpan[],
  ignorable: readonly string[] = [],
): number[] {
  const n = ids.length;
  const mask = new Array<number>(n).fill(0);
  if (spans.length === 0) return mask;
  const count = prefixTokenCounter(tokenizer, text, ids);
  const set = (from: number, to: number, value: number): void => {
    const a = Math.min(count(from), n);
    const b = Math.min(count(to), n);
    for (let i = a; i < b; i++) mask[i] = value;
  };
  for (const s of spans) set(s.start, s.end, 1);
  for (const ignore of ignorable) {
    if (ignore === '') continue;
    for (let at = text.indexOf(ignore); at >= 0; at = text.indexOf(ignore, at + ignore.length))
      set(at, at + ignore.length, 0);
  }
  return mask;
}

/** GPT-2's byte-level alphabet: the character that stands for each byte, inverted. */
function byteLevelDecoder(): Int16Array {
  const decoder = new Int16Array(0x10000).fill(-1);
  const printable = (b: number): boolean => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    if (printable(b)) decoder[b] = b;
    else decoder[256 + extra++] = b;
  }
  return decoder;
}

const BYTE_LEVEL = byteLevelDecoder();

/** The bytes each token id stands for, computed on first use and cached per tokenizer. */
class TokenBytes {
  readonly #tokenizer: ChatTokenizer;
  readonly #ordinary: Uint8Array;
  readonly #cache: (Uint8Array | null | undefined)[];

  constructor(tokenizer: ChatTokenizer) {
    this.#tokenizer = tokenizer;
    this.#ordinary = new Uint8Array(tokenizer.vocabSize);
    for (const r of tokenizer.ordinaryTokenIdRanges) this.#ordinary.fill(1, r.start, r.end);
    this.#cache = new Array<Uint8Array | null | undefined>(tokenizer.vocabSize);
  }

  /** The token's bytes, or null when it is not a byte-level token. */
  of(id: number): Uint8Array | null {
    const cached = this.#cache[id];
    if (cached !== undefined) return cached;
    const token = this.#tokenizer.idToToken(id);
    if (token === undefined) return null;
    let bytes: Uint8Array | null;
    if (this.#ordinary[id] !== 1) {
      bytes = Buffer.from(token, 'utf8');
    } else {
      const decoded = new Uint8Array(token.length);
      bytes = decoded;
      for (let i = 0; i < token.length; i++) {
        const b = BYTE_LEVEL[token.charCodeAt(i)] ?? -1;
        if (b < 0) {
          bytes = null;
          break;
        }
        decoded[i] = b;
      }
    }
    this.#cache[id] = bytes;
    return bytes;
  }
}

const tables = new WeakMap<ChatTokenizer, TokenBytes>();

function tokenBytes(tokenizer: ChatTokenizer): TokenBytes {
  let table = tables.get(tokenizer);
  if (table === undefined) {
    table = new TokenBytes(tokenizer);
    if (tokenizer.encoderKind === 'tiktoken') {
      // A tiktoken token is its rank file's bytes (or a special token's text): the encoder knows them.
      table.of = (id: number): Uint8Array | null => tokenizer.tokenBytes(id) ?? null;
    }
    tables.set(tokenizer, table);
  }
  return table;
}

/** Byte offset where each token starts in `expected`, plus the end; null when the tokens do not spell `expected`. */
function layOut(ids: readonly number[], table: TokenBytes, expected: Uint8Array): Float64Array | null {
  const starts = new Float64Array(ids.length + 1);
  let at = 0;
  for (let i = 0; i < ids.length; i++) {
    starts[i] = at;
    const bytes = table.of(ids[i] ?? -1);
    if (bytes === null || at + bytes.length > expected.length) return null;
    for (let j = 0; j < bytes.length; j++) if (bytes[j] !== expected[at + j]) return null;
    at += bytes.length;
  }
  starts[ids.length] = at;
  return at === expected.length ? starts : null;
}

/**
 * Byte offsets, in `target` (the text the tokenizer saw), of the ascending UTF-16 indices
 * `points` of `text`. With `nfc`, each piece between two points is normalized on its own and
 * must equal the same piece of `target`, i.e. normalization does not reach across a point.
 */
function byteOffsets(text: string, points: readonly number[], target: Uint8Array, nfc: boolean): number[] | null {
  const out: number[] = [];
  let prev = 0;
  let at = 0;
  const piece = (from: number, to: number): boolean => {
    const s = text.slice(from, to);
    if (!nfc) {
      at += Buffer.byteLength(s, 'utf8');
      return true;
    }
    const b = Buffer.from(s.normalize('NFC'), 'utf8');
    if (!b.equals(target.subarray(at, at + b.length))) return false;
    at += b.length;
    return true;
  };
  for (const p of points) {
    if (!piece(prev, p)) return null;
    out.push(at);
    prev = p;
  }
  if (!piece(prev, text.length) || at !== target.length) return null;
  return out;
}

/**
 * The 0/1 mask over `ids` (the encoding of `text`, in one piece): 1 on every token that
 * covers at least one byte of a span's characters, 0 elsewhere. Throws an
 * {@link EnvironmentError} when the tokens cannot be laid out over the text.
 */
export function maskFromSpans(
  tokenizer: ChatTokenizer,
  text: string,
  ids: readonly number[],
  spans: readonly CharSpan[],
): number[] {
  const table = tokenBytes(tokenizer);
  const raw = Buffer.from(text, 'utf8');
  let nfc = false;
  let target: Uint8Array = raw;
  let starts = layOut(ids, table, raw);
  if (starts === null) {
    const normalized = text.normalize('NFC');
    if (normalized !== text) {
      target = Buffer.from(normalized, 'utf8');
      starts = layOut(ids, table, target);
      nfc = true;
    }
  }
  const points: number[] = [];
  for (const s of spans) points.push(s.start, s.end);
  const offsets = starts === null ? null : byteOffsets(text, points, target, nfc);
  if (starts === null || offsets === null) {
    throw new EnvironmentError(
      `tokenizer ${tokenizer.name}: its tokens do not lay out the rendered text byte for byte ` +
        '(only byte-level BPE tokenizers, with at most NFC normalization, are supported for conversation masks)',
    );
  }
  const mask = new Array<number>(ids.length).fill(0);
  let k = 0;
  for (let i = 0; i < ids.length; i++) {
    const a = starts[i] ?? 0;
    const b = starts[i + 1] ?? 0;
    while (k < spans.length && (offsets[2 * k + 1] ?? 0) <= a) k++;
    if (k < spans.length && (offsets[2 * k] ?? 0) < b) mask[i] = 1;
  }
  return mask;
}
