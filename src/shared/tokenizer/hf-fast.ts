/**
 * A faster `encode` for the byte-level BPE tokenizers of `@huggingface/tokenizers` (Qwen,
 * Llama 3, DeepSeek-V3: a `ByteLevel` pre-tokenizer last, a `BPE` model).
 *
 * It runs the library's own parts — the added-token splitters, the normalizer, the `Split`
 * pre-tokenizers, the BPE merges — and replaces only the glue between them, which costs most of
 * the library's encode time: the byte-level mapping (a `TextEncoder` call, an array and a join
 * per word), the arrays flattened at each pre-tokenizer step, and the LRU bookkeeping of four
 * map operations per word. Words are mapped with a 256-entry table and their ids cached in a
 * plain bounded map.
 *
 * It is used only for tokenizers of the shape it knows (checked on the parsed parts) and only
 * when it gives the library's ids on a set of probe texts (multilingual text, whitespace runs,
 * digits, emoji, NFC-sensitive text, every added token); otherwise the library's encode is used
 * unchanged.
 */
import type { Tokenizer } from '@huggingface/tokenizers';

/** The parts of a library `Tokenizer` this module reads (not in its public types). */
interface LibTokenizer {
  normalizer: ((text: string) => string) | null;
  pre_tokenizer: LibPart | null;
  model: LibModel | null;
  post_processor: LibPart | null;
  splitter_unnormalized: { split(text: string): string[] };
  splitter_normalized: { split(text: string): string[] };
  added_tokens: { content: string; lstrip: boolean; rstrip: boolean }[];
  added_tokens_map: Map<string, { id: number }>;
  remove_space?: boolean;
  do_lowercase_and_remove_accent?: boolean;
}

interface LibPart {
  config?: { type?: string; add_prefix_space?: boolean; use_regex?: boolean; invert?: boolean; behavior?: string };
  tokenizers?: (LibPart | null)[];
  pattern?: RegExp | null;
  pre_tokenize_text?(text: string, options?: unknown): string[];
}

interface LibModel {
  config?: { type?: string };
  tokens_to_ids: Map<string, number>;
  unk_token?: string | null;
  unk_token_id?: number;
  byte_fallback?: boolean;
  ignore_merges?: boolean;
  bpe(token: string): string[];
}

/** GPT-2's byte-level alphabet: the character that stands for each byte. */
function byteLevelAlphabet(): string[] {
  const printable = (b: number): boolean => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const out = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCharCode(printable(b) ? b : 256 + extra++);
  return out;
}

const ALPHABET = byteLevelAlphabet();
const UTF8 = new TextEncoder();

/** `text` in the byte-level alphabet (its UTF-8 bytes, one character each). */
function toByteLevel(text: string): string {
  let out = '';
  let i = 0;
  for (; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x80) break;
    out += ALPHABET[c] ?? '';
  }
  if (i === text.length) return out;
  const bytes = UTF8.encode(text.slice(i));
  for (let j = 0; j < bytes.length; j++) out += ALPHABET[bytes[j] ?? 0] ?? '';
  return out;
}

/** Words at most this long are cached (the library caches the same). */
const MAX_CACHED_WORD = 256;
/** The word cache is emptied when it holds this many words. */
const CACHE_WORDS = 100_000;

/** Texts whose fast and library encodings must agree before the fast one is used. */
function probeTexts(lib: LibTokenizer): string[] {
  const added = lib.added_tokens.map((t) => t.content);
  return [
    "Hello, world! It's 2026; they're here, we've SEEN 1234567 things.\n\n  indented\tTAB\r\nwindows line\n",
    '   leading spaces and trailing   \n\n\n',
    'def f(x):\n    return x ** 2  # square\n\n\nprint(f(12))',
    '中文测试：你好，世界！日本語のテキスト、カタカナ。한국어 텍스트.',
    'emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 math ∑∫√ symbols ©®™ «quotes» — dashes – …',
    'e\u0301 cafe\u0301 Å A\u030A ﬁ ① ² ½ Ω Ω \u00a0nbsp \u200bzero-width',
    'numbers 3.14159 1,000,000 0x1F 2e-10 ٣٤٥ ๑๒๓',
    `mixed${added.join('x ')} ${added.join('\n')}end`,
    added.join(''),
    '',
    ' ',
    '\n',
  ];
}

/** The BPE model's ids for `word` (already in the byte-level alphabet), as the library's `encode` gives them. */
function wordIds(lib: LibTokenizer, model: LibModel, word: string, out: number[]): void {
  const pieces = model.ignore_merges === true && model.tokens_to_ids.has(word) ? [word] : model.bpe(word);
  for (const piece of pieces) {
    let token: string | undefined = piece;
    if (!model.tokens_to_ids.has(piece)) {
      if (model.unk_token === null || model.unk_token === undefined) continue;
      token = model.unk_token;
    }
    const id = lib.added_tokens_map.get(token)?.id ?? model.tokens_to_ids.get(token) ?? model.unk_token_id;
    if (id !== undefined) out.push(id);
  }
}

/**
 * A faster equivalent of `tokenizer.encode(text, { add_special_tokens: false }).ids`, or
 * undefined when `tokenizer` is not a byte-level BPE tokenizer of the supported shape or the
 * two disagree on a probe text.
 */
export function fastByteLevelEncoder(tokenizer: Tokenizer): ((text: string) => number[]) | undefined {
  const lib = tokenizer as unknown as LibTokenizer;
  const model = lib.model;
  const pre = lib.pre_tokenizer;
  if (model === null || model.config?.type !== 'BPE' || model.byte_fallback === true || typeof model.bpe !== 'function')
    return undefined;
  if (pre === null || lib.remove_space === true || lib.do_lowercase_and_remove_accent === true) return undefined;
  if (lib.added_tokens.some((t) => t.lstrip || t.rstrip)) return undefined;
  // ByteLevel alone, or a Sequence of Split pre-tokenizers ending with ByteLevel.
  const chain = Array.isArray(pre.tokenizers) ? pre.tokenizers : [pre];
  const last = chain[chain.length - 1];
  if (last === null || last === undefined || last.config?.type !== 'ByteLevel' || last.config.add_prefix_space === true)
    return undefined;
  const lastRegex = last.config.use_regex === false ? null : (last.pattern ?? null);
  if (last.config.use_regex !== false && lastRegex === null) return undefined;
  const splits: LibPart[] = [];
  for (const part of chain.slice(0, -1)) {
    if (part === null || part.config?.type !== 'Split' || typeof part.pre_tokenize_text !== 'function')
      return undefined;
    splits.push(part);
  }
  // Post-processors that leave the tokens alone without special tokens.
  const post = lib.post_processor?.config?.type;
  if (post !== undefined && post !== 'ByteLevel' && post !== 'TemplateProcessing' && post !== 'Sequence')
    return undefined;

  const cache = new Map<string, number[]>();
  const encodeWord = (word: string, out: number[]): void => {
    const mapped = toByteLevel(word);
    if (mapped.length > MAX_CACHED_WORD) {
      wordIds(lib, model, mapped, out);
      return;
    }
    let ids = cache.get(mapped);
    if (ids === undefined) {
      ids = [];
      wordIds(lib, model, mapped, ids);
      if (cache.size >= CACHE_WORDS) cache.clear();
      cache.set(mapped, ids);
    }
    for (let i = 0; i < ids.length; i++) out.push(ids[i] ?? 0);
  };
  const encodePiece = (piece: string, out: number[]): void => {
    let words = [piece];
    for (const split of splits) {
      const next: string[] = [];
      for (const w of words) for (const x of split.pre_tokenize_text?.(w) ?? []) next.push(x);
      words = next;
    }
    for (const w of words) {
      if (lastRegex === null) encodeWord(w, out);
      else for (const x of w.match(lastRegex) ?? []) encodeWord(x, out);
    }
  };
  const encode = (text: string): number[] => {
    const out: number[] = [];
    for (const section of lib.splitter_unnormalized.split(text)) {
      if (section.length === 0) continue;
      const added = lib.added_tokens_map.get(section);
      if (added !== undefined) {
        out.push(added.id);
        continue;
      }
      const normalized = lib.normalizer === null ? section : lib.normalizer(section);
      if (normalized.length === 0) continue;
      for (const sub of lib.splitter_normalized.split(normalized)) {
        if (sub.length === 0) continue;
        const addedSub = lib.added_tokens_map.get(sub);
        if (addedSub !== undefined) out.push(addedSub.id);
        else encodePiece(sub, out);
      }
    }
    return out;
  };

  try {
    for (const probe of probeTexts(lib)) {
      const expected = tokenizer.encode(probe, { add_special_tokens: false }).ids;
      const got = encode(probe);
      if (got.length !== expected.length || got.some((id, i) => id !== expected[i])) return undefined;
    }
  } catch {
    return undefined;
  }
  return encode;
}
