// The tiktoken encoder's parts on small, hand-checked inputs: the rank file reader, the
// byte-pair merge, the split-pattern conversion (Rust regex → JavaScript `v`), Kimi's long-text
// cutting and special-token layout, and the loader's errors.
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { EnvironmentError } from '../../src/shared/errors.js';
import { BytePairEncoder, parseRankFile } from '../../src/shared/tokenizer/bpe.js';
import { loadTokenizer } from '../../src/shared/tokenizer/load.js';
import {
  KIMI_K2_PATTERN,
  O200K_PATTERN,
  compileSplitPattern,
  convertSplitPattern,
} from '../../src/shared/tokenizer/pattern.js';
import { TiktokenEncoder, chunkText } from '../../src/shared/tokenizer/tiktoken.js';
import { useTempDir } from '../helpers/temp.js';

const b64 = (s: string): string => Buffer.from(s, 'latin1').toString('base64');

/** A rank file of the given tokens, rank = position. */
function rankText(tokens: readonly string[]): string {
  return tokens.map((t, i) => `${b64(t)} ${i}`).join('\n') + '\n';
}

/** Every byte, then the listed merges: a complete tiny vocabulary. */
function tinyRanks(merges: readonly string[]): string {
  const bytes = Array.from({ length: 256 }, (_, b) => String.fromCharCode(b));
  return rankText([...bytes, ...merges]);
}

const pieces = (pattern: string, text: string): string[] =>
  [...text.matchAll(compileSplitPattern(pattern, 'test'))].map((m) => m[0]);

const tmp = useTempDir('tokenmill-tiktoken-unit-');

describe('rank file', () => {
  it('reads base64 tokens and ranks, CRLF and blank lines included', () => {
    const t = parseRankFile(`${b64('a')} 0\r\n\n${b64('bc')} 1\n`, 'f.tiktoken');
    expect(t.ranks.get('a')).toBe(0);
    expect(t.ranks.get('bc')).toBe(1);
    expect(t.bytesByRank).toEqual(['a', 'bc']);
  });

  it('names the file and line of a malformed entry or a repeated rank', () => {
    expect(() => parseRankFile(`${b64('a')} 0\nnot-base64! 1\n`, 'x.tiktoken')).toThrow(
      /x\.tiktoken:2: expected "<base64 token> <rank>"/,
    );
    expect(() => parseRankFile(`${b64('a')} zero\n`, 'x.tiktoken')).toThrow(/x\.tiktoken:1:/);
    expect(() => parseRankFile(`${b64('a')} 0\n${b64('b')} 0\n`, 'x.tiktoken')).toThrow(
      /x\.tiktoken:2: rank 0 appears twice/,
    );
    expect(() => parseRankFile('\n', 'x.tiktoken')).toThrow(EnvironmentError);
  });
});

describe('byte-pair merge (tiktoken _byte_pair_merge)', () => {
  const table = parseRankFile(tinyRanks(['ab', 'bc', 'abc', 'cd', 'aa']), 't');
  const id = (s: string): number => table.ranks.get(s) ?? -1;
  const bpe = new BytePairEncoder(table.ranks);
  const enc = (s: string): number[] => {
    const out: number[] = [];
    bpe.encodePiece(s, out);
    return out;
  };

  it('merges the lowest-ranked adjacent pair first, re-ranking its neighbours', () => {
    // abcd: ab(256) < bc(257) < cd(259) → [ab,c,d]; then abc(258) < cd → [abc,d]; abcd is no token.
    expect(enc('abcd')).toEqual([id('abc'), id('d')]);
    // bcd: bc(257) < cd(259) → [bc, d].
    expect(enc('bcd')).toEqual([id('bc'), id('d')]);
  });

  it('takes the leftmost of equal ranks, and a whole-piece token directly', () => {
    expect(enc('aaa')).toEqual([id('aa'), id('a')]);
    expect(enc('abc')).toEqual([id('abc')]);
    // Repeated pieces come from the cache, unchanged.
    expect(enc('aaa')).toEqual([id('aa'), id('a')]);
  });

  it('works on UTF-8 bytes', () => {
    expect(enc('é')).toEqual([0xc3, 0xa9]);
  });
});

describe('split pattern conversion', () => {
  it("splits with Kimi's pattern: Han runs apart from other letters, contractions, digits by three", () => {
    expect(pieces(KIMI_K2_PATTERN, '漢字abc')).toEqual(['漢字', 'abc']);
    expect(pieces(O200K_PATTERN, '漢字abc')).toEqual(['漢字abc']);
    expect(pieces(KIMI_K2_PATTERN, "it'S 12345")).toEqual(["it'S", ' ', '123', '45']);
    expect(pieces(KIMI_K2_PATTERN, 'Hello 世界')).toEqual(['Hello', ' ', '世界']);
  });

  it('folds case as Rust does inside (?i:...): ſ matches s', () => {
    expect(pieces(O200K_PATTERN, "I'ſ")).toEqual(["I'ſ"]);
    expect(pieces(O200K_PATTERN, "I'x")).toEqual(['I', "'x"]);
  });

  it('reads a bare script name as the script, and \\s \\d \\w as Unicode classes', () => {
    expect(pieces('\\p{Han}', '漢々〆、')).toEqual(['漢', '々']);
    expect(pieces('\\s+', 'a\u00a0\u3000b\ufeffc')).toEqual(['\u00a0\u3000']);
    expect(pieces('\\d+', '12٣४x')).toEqual(['12٣४']);
    expect(pieces('\\w+', 'añ_1 é')).toEqual(['añ_1', 'é']);
    expect(pieces('.+', 'a\rb\nc')).toEqual(['a\rb', 'c']);
  });

  it('matches possessive quantifiers and atomic groups without backtracking into them', () => {
    // a++ takes every a, so "a++a" never matches; a greedy a+ would give back one.
    expect(pieces('a++a|a', 'aaa')).toEqual(['a', 'a', 'a']);
    expect(pieces('a+a|a', 'aaa')).toEqual(['aaa']);
    expect(pieces('(?>a+)b|a', 'aaab')).toEqual(['aaab']);
    expect(pieces('(?>a|ab)c|.', 'abc')).toEqual(['a', 'b', 'c']);
    expect(pieces('\\p{N}{1,3}+', '12345')).toEqual(['123', '45']);
  });

  it('turns class intersection and subtraction into v-flag classes', () => {
    expect(convertSplitPattern('[\\p{L}\\p{M}&&[^\\p{Han}]]', 't')).toBe('[[\\p{L}\\p{M}]&&[^\\p{sc=Han}]]');
    expect(pieces('[\\p{L}--[a-c]]+', 'abcdef')).toEqual(['def']);
    expect(pieces('[\\r\\n/]+|[-x]', 'a/\n-x')).toEqual(['/\n', '-', 'x']);
  });

  it('refuses what has no exact equivalent, naming the construct and its offset', () => {
    expect(() => convertSplitPattern('\\bx', 'tokenizer.pattern')).toThrow(
      /tokenizer\.pattern: the split pattern uses the escape "\\b" at offset 0/,
    );
    expect(() => convertSplitPattern('+a', 'p')).toThrow(/nothing to repeat/);
    expect(() => convertSplitPattern('(?x)a', 'p')).toThrow(/"\(\?x\)"/);
    expect(() => convertSplitPattern('\\p{NoSuchProperty}', 'p')).toThrow(/NoSuchProperty/);
    expect(() => convertSplitPattern('[a~~b]', 'p')).toThrow(/symmetric difference/);
    expect(() => convertSplitPattern('(a', 'p')).toThrow(/unbalanced/);
  });
});

describe("Kimi's long-text cutting", () => {
  it('cuts runs of whitespace or non-whitespace longer than the limit, and fixed-size chunks', () => {
    // As tokenization_kimi.py: a cut only when a run grows past the limit; the rest stays whole.
    expect([...chunkText('aaaaa  bb', { maxChunkChars: 100, maxRunChars: 2 })]).toEqual(['aa', 'aa', 'a  bb']);
    expect([...chunkText('a\u3000\u3000\u3000b', { maxChunkChars: 100, maxRunChars: 2 })]).toEqual([
      'a\u3000\u3000',
      '\u3000b',
    ]);
    expect([...chunkText('abcdef', { maxChunkChars: 4, maxRunChars: 100 })]).toEqual(['abcd', 'ef']);
    expect([...chunkText('', { maxChunkChars: 4, maxRunChars: 2 })]).toEqual(['']);
  });
});

describe('tiktoken encoder', () => {
  const table = parseRankFile(tinyRanks(['ab', ' a']), 't');
  const enc = new TiktokenEncoder({
    ranks: table,
    pattern: ' ?\\p{L}+|\\s+|[^\\s\\p{L}]+',
    patternSource: 'test',
    specialTokens: [
      { id: 300, content: '<|end|>', special: true },
      { id: 301, content: '<|end|>x', special: true },
    ],
  });

  it('matches special tokens leftmost-longest, and encodes the text between them', () => {
    expect(enc.encode('ab<|end|>x<|end|>')).toEqual([256, 301, 300]);
    // ' ab' is one piece: 'ab' (256) outranks ' a' (257), so the space stays alone.
    expect(enc.encode(' ab')).toEqual([32, 256]);
    expect(enc.encode(' a')).toEqual([257]);
    expect(enc.size).toBe(302);
  });

  it('decodes, skipping special tokens when asked; spells tokens in the byte-level alphabet', () => {
    expect(enc.decode([256, 300, 32], false)).toBe('ab<|end|> ');
    expect(enc.decode([256, 300, 32], true)).toBe('ab ');
    expect(enc.idToToken(257)).toBe('Ġa');
    expect(enc.tokenToId('Ġa')).toBe(257);
    expect(enc.idToToken(300)).toBe('<|end|>');
    expect([...(enc.tokenBytes(257) ?? [])]).toEqual([32, 97]);
  });
});

describe('loading a tiktoken folder', () => {
  async function folder(name: string, files: Record<string, string>): Promise<string> {
    const dir = path.join(tmp, name);
    await mkdir(dir, { recursive: true });
    for (const [f, text] of Object.entries(files)) await writeFile(path.join(dir, f), text);
    return dir;
  }
  const config = (extra: Record<string, unknown> = {}): string =>
    JSON.stringify({
      eos_token: '[EOS]',
      added_tokens_decoder: { '258': { content: '[EOS]', special: true } },
      ...extra,
    });

  it("lays out Kimi's special tokens: the config's names, reserved names for the rest, 256 in all", async () => {
    const dir = await folder('kimi', {
      'tiktoken.model': tinyRanks(['ab', 'cd']),
      'tokenizer_config.json': config({ auto_map: { AutoTokenizer: ['tokenization_kimi.TikTokenTokenizer', null] } }),
    });
    const t = await loadTokenizer(dir);
    expect(t.encoderKind).toBe('tiktoken');
    expect(t.vocabSize).toBe(258 + 256);
    expect(t.eosTokenId).toBe(258);
    expect(t.idToToken(259)).toBe('<|reserved_token_259|>');
    expect(t.encode('<|reserved_token_259|>ab')).toEqual([259, 256]);
  });

  it('refuses a folder without a pattern, with several rank files, or without a rank file', async () => {
    const noPattern = await folder('no-pattern', { 'x.tiktoken': tinyRanks([]), 'tokenizer_config.json': config() });
    await expect(loadTokenizer(noPattern)).rejects.toThrow(/no split pattern; set tokenizer\.pattern/);
    await expect(loadTokenizer(noPattern, { pattern: '\\bx' })).rejects.toThrow(/tokenizer\.pattern: .*"\\b"/);
    const withPattern = await loadTokenizer(noPattern, { pattern: '\\p{L}+|\\s+|\\p{N}+|[^\\s\\p{L}\\p{N}]+' });
    expect(withPattern.encode('[EOS]a')).toEqual([258, 97]);
    const two = await folder('two', {
      'a.tiktoken': tinyRanks([]),
      'b.tiktoken': tinyRanks([]),
      'tokenizer_config.json': config(),
    });
    await expect(loadTokenizer(two, { kind: 'tiktoken' })).rejects.toThrow(
      /several tiktoken rank files \(a\.tiktoken, b\.tiktoken\)/,
    );
    const none = await folder('none', { 'tokenizer_config.json': config() });
    await expect(loadTokenizer(none, { kind: 'tiktoken' })).rejects.toThrow(/has no tiktoken rank file/);
    await expect(loadTokenizer(none)).rejects.toThrow(/tokenizer\.json is missing.*tokenizer\.kind: server/);
  });
});
