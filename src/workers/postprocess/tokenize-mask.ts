/**
 * The loss mask of a rendered conversation: which characters are the assistant's, and which
 * tokens cover them. See `conversationToRow` in tokenize.ts for the rule as a whole.
 *
 * Tokens are mapped to the text through their bytes: the tokenizers tokenmill supports are
 * byte-level BPE (Qwen, DeepSeek, Llama 3), whose every token is a run of UTF-8 bytes of the
 * (normalized) input, and whose added tokens (`<|im_end|>`) are their own text. The ids of a
 * whole conversation, encoded once, are laid end to end and checked byte for byte against the
 * text — as is, or NFC-normalized when the tokenizer normalizes (Qwen's does) — so a token's
 * byte range is exact, never guessed. A tokenizer whose tokens do not lay out the text
 * (SentencePiece without byte fallback, lowercasing normalizers) is refused with an
 * {@link EnvironmentError} rather than given an approximate mask.
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
 * `format` describes, in order, disjoint:
 *
 * scanning left to right, each occurrence of `format.header` opens a span right after it; the
 * span runs through the first `format.turnEnd` after that (the end-of-turn token and what the
 * template writes after it, e.g. `<|im_end|>\n`), inclusive, or to the end of the text when
 * there is none; the scan resumes after the span. When the span starts with one of
 * `format.ignorablePrefixes` (Qwen3's empty `<think>\n\n</think>\n\n`), that prefix is left out.
 * This is SpecForge's `GeneralParser` pattern (`header([\s\S]*?(?:end_of_turn|\Z))`) with its
 * `ignore_token` applied only where the template puts it, right after the header.
 */
export function findSupervisedSpans(text: string, format: AssistantTurnFormat): CharSpan[] {
  const spans: CharSpan[] = [];
  const { header, turnEnd, ignorablePrefixes } = format;
  let cursor = 0;
  for (;;) {
    const at = text.indexOf(header, cursor);
    if (at < 0) break;
    let start = at + header.length;
    const close = text.indexOf(turnEnd, start);
    const end = close < 0 ? text.length : close + turnEnd.length;
    for (const prefix of ignorablePrefixes) {
      if (start + prefix.length <= end && text.startsWith(prefix, start)) {
        start += prefix.length;
        break;
      }
    }
    if (start < end) spans.push({ start, end });
    cursor = end;
  }
  return spans;
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
export function maskFromSpans(tokenizer: ChatTokenizer, text: string, ids: readonly number[], spans: readonly CharSpan[]): number[] {
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
