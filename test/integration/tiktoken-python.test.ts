// Parity of tokenmill's tiktoken encoder with Python `tiktoken` loading the same local rank file
// (o200k_base, written from js-tiktoken's shipped ranks): ids and decoded text, on multilingual
// text, code, whitespace and special tokens, with three split patterns: o200k's own, cl100k_base's
// (possessive quantifiers) and the Kimi K2 family's (loaded from the Kimi-like tokenizer folder,
// so detection, the preset's pattern and its special-token layout are checked too). One Python
// process for the whole file.
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { readRankFile, type RankTable } from '../../src/shared/tokenizer/bpe.js';
import { KIMI_K2_PATTERN, O200K_PATTERN } from '../../src/shared/tokenizer/pattern.js';
import { TiktokenEncoder } from '../../src/shared/tokenizer/tiktoken.js';
import { loadTokenizer, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { useHarness } from '../helpers/fixture.js';
import { runPythonJson } from '../helpers/python.js';
import { makeKimiLikeTokenizer, o200kRanks, writeO200kRankFile } from '../helpers/tiktoken-fixture.js';

interface PyReport {
  version: string;
  n_ranks: number;
  cases: { name: string; ids: number[][]; decoded: string[] }[];
}

/** Hand-picked texts: each script and construct the split patterns treat specially. */
const FIXED_TEXTS = [
  'Hello, world! This is a test.',
  '你好，世界！今天天气很好。我们去公园散步吧。',
  '日本語のテキスト、です。「カタカナ」とひらがな、ー（長音）々〆〜。',
  '한국어 텍스트입니다. 안녕하세요!',
  'Café crème brûlée, naïve façade, Ångström, Œuvre, straße.',
  'Cafe\u0301 with a combining accent, n\u0303, a\u0308\u0301 stacked.',
  '1234567890 3.14159 1,000,000 0x1F 2024-11-30 12:34:56 ٣٤٥ ४५६',
  'Emoji 🙂😀🎉 family 👨‍👩‍👧‍👦 couple 👩‍❤️‍👨 flags 🇯🇵🇫🇷 skin 👍🏽👋🏿 keycap 1️⃣ ZWJ alone \u200d.',
  'def f(x):\n    return x**2  # square\n\nclass A:\n\tpass\n',
  'const add = (a, b) => { return a + b; };\n// comment\n/* block */ if (x !== y) { y++; }',
  '   leading spaces\t\ttabs\n\n\n\nnewlines   \r\n\r\ncrlf    trailing   ',
  "I'm sure it's fine, they'll say we've done what you'd want. IT'S LOUD, WE'LL GO.",
  "Odd folds: I'ſ ſtrange, KELVIN \u212a, 's at start.",
  'HTTPServer camelCaseWord snake_case_word SCREAMING_CASE mixedUP ABCdef',
  'Русский текст, Ελληνικά γράμματα, العربية الفصحى, עברית, हिन्दी भाषा, ภาษาไทย.',
  'Special <|im_end|> inside, <|im_user|>user<|im_middle|> and <|endoftext|> and [EOS] partial <|im_end and <|im_end|x.',
  'NBSP\u00a0here, ideographic\u3000space, BOM\ufeffin text, zero width\u200bspace, line\u2028sep.',
  'URLs https://example.com/path?q=1&r=2#frag and emails a.b@example.org; paths C:\\Users\\x /usr/bin/env',
  'Math: ∑_{i=1}^{n} i² = n(n+1)/2, α+β≥γ, √2≈1.414, ∞.',
  '漢字とEnglishが混ざったtext、そして数字123と😀。中文English混合123。',
  '中文 中文 漢字 世界 你好 天气 日本 東京 大阪 北京 上海 說明 文字 数据 模型',
  '',
  ' ',
  '\n',
  'a',
];

/** Deterministic pseudo-random texts over a mixed alphabet, for what hand-picking misses. */
function randomTexts(count: number, seed: number): string[] {
  const pools = [
    'abcdefghijklmnopqrstuvwxyz',
    'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
    '0123456789',
    '     \t\n\r',
    '.,;:!?\'"()[]{}<>/\\|-_=+*&^%$#@~`',
    '你好世界中文字漢語',
    'ひらがなカタカナー、。',
    '한국어텍스트',
    'éèêëàâäôöûüçñßœ',
    '🙂😀🎉👍🏽👨‍👩‍👧\u200d\ufe0f',
    'ſK\u00a0\u3000\u2028\u200b',
    'абвгдежзαβγδ',
  ];
  let state = seed;
  const next = (n: number): number => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return state % n;
  };
  const out: string[] = [];
  for (let k = 0; k < count; k++) {
    let s = '';
    const len = 1 + next(80);
    for (let i = 0; i < len; i++) {
      const pool = [...(pools[next(pools.length)] ?? 'a')];
      const run = 1 + next(6);
      for (let j = 0; j < run; j++) s += pool[next(pool.length)] ?? '';
    }
    out.push(s);
  }
  return out;
}

const TEXTS = [...FIXED_TEXTS, ...randomTexts(300, 7)];

/** tiktoken's cl100k_base pattern: possessive quantifiers and `$`. */
const CL100K_PATTERN =
  "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";

const { tmp } = useHarness({ tmp: 'tokenmill-tiktoken-' });
let report: PyReport;
let o200k: TiktokenEncoder;
let o200kTable: RankTable;
let kimi: ChatTokenizer;
let kimiSpecials: Record<string, number>;

beforeAll(async () => {
  const rankFile = await writeO200kRankFile(path.join(tmp.dir, 'o200k_base.tiktoken'));
  const kimiDir = await makeKimiLikeTokenizer(path.join(tmp.dir, 'kimi-like'));
  const ranks = await readRankFile(rankFile);
  o200kTable = ranks;
  const o200kSpecials = o200kRanks().specialTokens;
  o200k = new TiktokenEncoder({
    ranks,
    pattern: O200K_PATTERN,
    patternSource: 'o200k',
    specialTokens: Object.entries(o200kSpecials).map(([content, id]) => ({ content, id, special: true })),
  });
  kimi = await loadTokenizer(kimiDir);
  kimiSpecials = {};
  for (let id = 0; id < kimi.vocabSize; id++) {
    if (kimi.isSpecialTokenId(id)) kimiSpecials[kimi.idToToken(id) ?? ''] = id;
  }
  report = await runPythonJson<PyReport>('tiktoken_parity.py', [], {
    rank_file: rankFile,
    cases: [
      { name: 'o200k', pat_str: O200K_PATTERN, special_tokens: o200kSpecials, texts: TEXTS },
      { name: 'kimi', pat_str: KIMI_K2_PATTERN, special_tokens: kimiSpecials, texts: TEXTS },
      { name: 'cl100k-pattern', pat_str: CL100K_PATTERN, special_tokens: o200kSpecials, texts: TEXTS },
    ],
  });
}, 180_000);

/** Empty when equal, else where the lists first differ, with the text around it. */
function difference(text: string, actual: readonly number[], expected: readonly number[]): string {
  let i = 0;
  while (i < actual.length && i < expected.length && actual[i] === expected[i]) i++;
  if (i === actual.length && i === expected.length) return '';
  return `${JSON.stringify(text.slice(0, 120))}: first difference at token ${i}: ts ${JSON.stringify(actual.slice(i, i + 6))} python ${JSON.stringify(expected.slice(i, i + 6))}`;
}

describe('tiktoken encoder against Python tiktoken on the same rank file', () => {
  it('reads the rank file Python reads', () => {
    expect(report.version).toBe('0.14.0');
    expect(report.n_ranks).toBe(199_998);
  });

  it('encodes and decodes like tiktoken with the o200k_base pattern', () => {
    const py = report.cases.find((c) => c.name === 'o200k');
    const diffs: string[] = [];
    TEXTS.forEach((text, i) => {
      const ids = o200k.encode(text);
      const d = difference(text, ids, py?.ids[i] ?? []);
      if (d !== '') diffs.push(d);
      else if (o200k.decode(ids, false) !== py?.decoded[i]) diffs.push(`${JSON.stringify(text)}: decoded text differs`);
    });
    expect(diffs).toEqual([]);
    // The corpus is not trivially tokenized: special tokens and multi-token texts occur.
    expect(TEXTS.some((t) => o200k.encode(t).includes(199_999))).toBe(true);
  });

  it("encodes like tiktoken with cl100k_base's pattern (possessive quantifiers)", () => {
    const cl = new TiktokenEncoder({
      ranks: o200kTable,
      pattern: CL100K_PATTERN,
      patternSource: 'cl100k',
      specialTokens: Object.entries(o200kRanks().specialTokens).map(([content, id]) => ({
        content,
        id,
        special: true,
      })),
    });
    const py = report.cases.find((c) => c.name === 'cl100k-pattern');
    const diffs = TEXTS.map((text, i) => difference(text, cl.encode(text), py?.ids[i] ?? [])).filter((d) => d !== '');
    expect(diffs).toEqual([]);
  });

  it('encodes like tiktoken with the Kimi K2 pattern and special tokens (the Kimi-like folder)', () => {
    expect(kimi.encoderKind).toBe('tiktoken');
    expect(kimiSpecials['<|im_end|>']).toBe(200_000);
    expect(kimiSpecials['<|reserved_token_200003|>']).toBe(200_003);
    const py = report.cases.find((c) => c.name === 'kimi');
    const diffs: string[] = [];
    TEXTS.forEach((text, i) => {
      const ids = kimi.encode(text);
      const d = difference(text, ids, py?.ids[i] ?? []);
      if (d !== '') diffs.push(d);
      else if (kimi.decode(ids) !== py?.decoded[i]) diffs.push(`${JSON.stringify(text)}: decoded text differs`);
    });
    expect(diffs).toEqual([]);
  });

  it('the patterns tokenize part of the corpus differently, so each case tests its own pattern', () => {
    const py = (name: string): number[][] => report.cases.find((c) => c.name === name)?.ids ?? [];
    const plain = TEXTS.flatMap((t, i) => (t.includes('<|') || t.includes('[EOS]') ? [] : [i]));
    const differing = (a: number[][], b: number[][]): number =>
      plain.filter((i) => JSON.stringify(a[i]) !== JSON.stringify(b[i])).length;
    expect(differing(py('o200k'), py('kimi'))).toBeGreaterThanOrEqual(2);
    expect(differing(py('o200k'), py('cl100k-pattern'))).toBeGreaterThanOrEqual(2);
  });
});
