// A Kimi K2-style tokenizer folder (tiktoken rank file, no tokenizer.json; see
// test/fixtures/tokenizers/kimi-like) end to end: detection, the chat template, the derived
// assistant-turn format, a generation record and a conversation tokenized into training rows,
// with their loss masks checked token by token.
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { loadTokenizer, type ChatMessage, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import {
  conversationToRow,
  createTokenizeContext,
  findSupervisedSpans,
  maskFromSpans,
  recordToRow,
  type TokenizeContext,
} from '../../src/workers/postprocess/tokenize.js';
import { makeKimiLikeTokenizer, O200K_RANK_COUNT } from '../helpers/tiktoken-fixture.js';
import { useTempDir } from '../helpers/temp.js';

const IM_END = O200K_RANK_COUNT + 2;
const EOS = O200K_RANK_COUNT + 1;

const tmp = useTempDir('tokenmill-kimi-');
let kimi: ChatTokenizer;
let ctx: TokenizeContext;

beforeAll(async () => {
  kimi = await loadTokenizer(await makeKimiLikeTokenizer(path.join(tmp, 'Kimi-K2.5')));
  ctx = createTokenizeContext(kimi);
}, 60_000);

/** (token text, mask) pairs of a row, for readable expectations. */
function pairs(ids: readonly number[], mask: readonly number[]): [string, number][] {
  return ids.map((id, i) => [kimi.decode([id]), mask[i] ?? -1]);
}

describe('Kimi-like tokenizer folder', () => {
  it('is detected as tiktoken with the kimi-k2 preset, with its special and end-of-turn tokens', () => {
    expect(kimi.encoderKind).toBe('tiktoken');
    expect(kimi.name).toBe('Kimi-K2.5');
    expect(kimi.vocabSize).toBe(O200K_RANK_COUNT + 256);
    expect(kimi.eosTokenId).toBe(EOS);
    expect(kimi.endOfTurnTokenIds).toEqual([EOS, IM_END]);
    expect(kimi.templateEndOfTurnTokenId).toBe(IM_END);
    expect(kimi.isSpecialTokenId(O200K_RANK_COUNT + 100)).toBe(true);
    expect(kimi.ordinaryTokenCount).toBe(O200K_RANK_COUNT);
  });

  it('renders and encodes a prompt with the generation prompt, special tokens as single ids', () => {
    const ids = kimi.encodePrompt([{ role: 'user', content: '你好, Kimi!' }]);
    const text = kimi.applyChatTemplate([{ role: 'user', content: '你好, Kimi!' }], { addGenerationPrompt: true });
    expect(
      text.endsWith('<|im_user|>user<|im_middle|>你好, Kimi!<|im_end|><|im_assistant|>assistant<|im_middle|>'),
    ).toBe(true);
    expect(kimi.decode(ids)).toBe(text);
    expect(ids.slice(-3)).toEqual([O200K_RANK_COUNT + 4, kimi.encode('assistant')[0], O200K_RANK_COUNT + 17]);
    expect(ids.filter((id) => id === IM_END)).toHaveLength(2);
  });

  it("sorts tool schemas' keys before rendering, as Kimi's tokenizer does", () => {
    const text = kimi.applyChatTemplate([{ role: 'user', content: 'q' }], {
      addGenerationPrompt: true,
      tools: [{ type: 'function', function: { name: 'f', description: 'd' } }],
    });
    expect(text).toContain('{"function": {"description": "d", "name": "f"}, "type": "function"}');
  });

  it('derives the assistant turn: header, <|im_end|> and nothing after it', () => {
    expect(ctx.format.header).toBe('<|im_assistant|>assistant<|im_middle|>');
    expect(ctx.format.endOfTurnTokenId).toBe(IM_END);
    expect(ctx.format.turnEnd).toBe('<|im_end|>');
    expect(ctx.format.suffixIds).toEqual([]);
  });

  it('turns a generation record into a row: prompt unsupervised, the answer and <|im_end|> supervised', () => {
    const prompt = kimi.encodePrompt([{ role: 'user', content: 'Say hi.' }]);
    const output = [...kimi.encode('Hi! 👋'), IM_END];
    const outcome = recordToRow(
      { id: 'r1', prompt_ids: prompt, output_ids: output, finish_reason: { type: 'stop', matched: IM_END } },
      ctx,
      'B1',
    );
    expect(outcome.status).toBe('kept');
    if (outcome.status !== 'kept') return;
    expect(outcome.closedTurn).toBe(true);
    expect(outcome.row.input_ids).toEqual([...prompt, ...output]);
    expect(outcome.row.loss_mask).toEqual([...prompt.map(() => 0), ...output.map(() => 1)]);
  });

  it('tokenizes a conversation into ids and a mask over every assistant turn and its <|im_end|>', () => {
    const messages: ChatMessage[] = [
      { role: 'system', content: 'S' },
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello' },
      { role: 'user', content: '日本語?' },
      { role: 'assistant', content: 'はい、日本語です。' },
    ];
    const row = conversationToRow({ id: 'c1', messages }, ctx, 'A1');
    const text = kimi.applyChatTemplate(messages, { addGenerationPrompt: false });
    expect(row.input_ids).toEqual(kimi.encode(text));
    expect(pairs(row.input_ids, row.loss_mask)).toEqual([
      ['<|im_system|>', 0],
      ['system', 0],
      ['<|im_middle|>', 0],
      ['S', 0],
      ['<|im_end|>', 0],
      ['<|im_user|>', 0],
      ['user', 0],
      ['<|im_middle|>', 0],
      ['Hi', 0],
      ['<|im_end|>', 0],
      ['<|im_assistant|>', 0],
      ['assistant', 0],
      ['<|im_middle|>', 0],
      ['Hello', 1],
      ['<|im_end|>', 1],
      ['<|im_user|>', 0],
      ['user', 0],
      ['<|im_middle|>', 0],
      ...kimi.encode('日本語?').map((id): [string, number] => [kimi.decode([id]), 0]),
      ['<|im_end|>', 0],
      ['<|im_assistant|>', 0],
      ['assistant', 0],
      ['<|im_middle|>', 0],
      ...kimi.encode('はい、日本語です。').map((id): [string, number] => [kimi.decode([id]), 1]),
      ['<|im_end|>', 1],
    ]);
  });

  it('lays its tokens out byte for byte over the text (the byte-layout mask agrees)', () => {
    const messages: ChatMessage[] = [
      { role: 'user', content: 'Emoji 👨‍👩‍👧 and café' },
      { role: 'assistant', content: 'Sure: 👍🏽 naïve façade 漢字' },
    ];
    const row = conversationToRow({ id: 'c2', messages }, ctx, 'A1');
    const text = kimi.applyChatTemplate(messages, { addGenerationPrompt: false });
    expect(maskFromSpans(kimi, text, row.input_ids, findSupervisedSpans(text, ctx.format))).toEqual(row.loss_mask);
    expect(row.loss_mask.reduce((a, b) => a + b, 0)).toBe(kimi.encode('Sure: 👍🏽 naïve façade 漢字').length + 1);
  });
});
