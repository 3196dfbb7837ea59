// Tokenizing a conversation dataset on worker threads (src/workers/postprocess/tokenize-pool.ts)
// gives exactly what the one-thread path gives: the same rows, byte for byte, in the same order,
// and the same counters — on a file with invalid lines (bad JSON, a bad record, a conversation
// the chat template refuses), repeated ids (also of a refused line), conversations with nothing
// to supervise and blank lines, cut into many small batches so that they go around the threads
// and the read waits for the oldest batch. A thread that stops mid-read fails the read with an
// error naming the file, not a hang.
//
// The tokenizer is the bundled Qwen3 tokenizer with a ChatML template that refuses one message
// text (raise_exception), in a temporary folder the threads load on their own.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { bundledTokenizerPath, createRootLogger, loadTokenizer } from '../../src/shared/index.js';
import {
  createTokenizeContext,
  emptyConversationStats,
  rowsFromConversations,
  type ConversationTokenizeStats,
  type TokenizeContext,
  type TokenizedRow,
} from '../../src/workers/postprocess/tokenize.js';
import { rowsFromConversationsPooled, type TokenizePool } from '../../src/workers/postprocess/tokenize-pool.js';
import { conversationCorpus } from '../fixtures/conversations/corpus.js';
import { useHarness } from '../helpers/fixture.js';

const REFUSED = 'please refuse this conversation';
const TEMPLATE =
  "{%- for message in messages %}{%- if message.content == '" +
  REFUSED +
  "' %}{{ raise_exception('this conversation is refused') }}{%- endif %}" +
  "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";

const { tmp } = useHarness({ tmp: 'tm-tokenize-pool-' });
let file: string;
let ctx: TokenizeContext;

async function collect(gen: AsyncGenerator<TokenizedRow, unknown>): Promise<string[]> {
  const rows: string[] = [];
  for await (const row of gen) rows.push(JSON.stringify(row));
  return rows;
}

/** The corpus's lines, with the cases the accounting must count, spread through the file. */
function corpusLines(): string[] {
  const lines = conversationCorpus(360, 99).map((c) => JSON.stringify(c.record));
  const user = (content: string): object => ({ role: 'user', content });
  const special: [number, string][] = [
    [3, '{"id": "broken", "conversations": ['],
    [10, JSON.stringify({ id: 'no-turns', conversations: [] })],
    [20, JSON.stringify({ id: 'refused', conversations: [user(REFUSED), { role: 'assistant', content: 'x' }] })],
    [
      25,
      JSON.stringify({
        id: 'refused',
        conversations: [user('same id as a refused line'), { role: 'assistant', content: 'y' }],
      }),
    ],
    [
      40,
      JSON.stringify({ id: 'only-user', conversations: [{ role: 'system', content: 's' }, user('nobody answers')] }),
    ],
    [41, ''],
    [42, '   '],
    [300, JSON.stringify({ id: 'late-unsupervised', conversations: [user('still nobody')] })],
  ];
  for (const [at, text] of special) lines.splice(at, 0, text);
  // Repeats of earlier lines, some within a batch of 16 lines, some far apart.
  for (const at of [60, 61, 200, 350]) lines.splice(at + 1, 0, lines[at] ?? '');
  lines.push(lines[100] ?? '');
  return lines;
}

beforeAll(async () => {
  createRootLogger({ level: 'silent' });
  const tokenizerDir = path.join(tmp.dir, 'tokenizer');
  const bundled = bundledTokenizerPath();
  mkdirSync(tokenizerDir);
  copyFileSync(path.join(bundled, 'tokenizer.json'), path.join(tokenizerDir, 'tokenizer.json'));
  const config = JSON.parse(readFileSync(path.join(bundled, 'tokenizer_config.json'), 'utf8')) as Record<
    string,
    unknown
  >;
  writeFileSync(
    path.join(tokenizerDir, 'tokenizer_config.json'),
    JSON.stringify({ ...config, chat_template: TEMPLATE }),
  );
  ctx = createTokenizeContext(await loadTokenizer(tokenizerDir));
  file = path.join(tmp.dir, 'conversations.jsonl');
  writeFileSync(file, `${corpusLines().join('\n')}\n`);
});

describe('conversation datasets on worker threads', () => {
  it('gives the rows, order and counters of the one-thread path', async () => {
    const single: ConversationTokenizeStats = emptyConversationStats();
    const expected = await collect(rowsFromConversations(file, { ctx, dataset: 'd', stats: single }));

    const pooled: ConversationTokenizeStats = emptyConversationStats();
    let threads = 0;
    const got = await collect(
      rowsFromConversationsPooled(file, {
        ctx,
        dataset: 'd',
        stats: pooled,
        threads: 2,
        minPoolBytes: 0,
        batchLines: 16,
        onPoolStarted: (pool) => (threads = pool.size),
      }),
    );
    expect(threads).toBe(2);
    // The file holds every case the accounting distinguishes.
    expect(single.invalid).toBe(3);
    expect(single.invalidExamples.map((x) => x.line)).toEqual([4, 11, 21]);
    expect(single.invalidExamples[0]?.reason).toMatch(/^invalid JSON: /);
    expect(single.invalidExamples[2]?.reason).toMatch(/this conversation is refused/);
    expect(single.duplicates).toBeGreaterThanOrEqual(6);
    expect(single.droppedUnsupervised).toBeGreaterThanOrEqual(2);
    expect(single.kept).toBe(expected.length);
    expect(expected.length).toBeGreaterThan(300);

    expect(pooled).toEqual(single);
    expect(got.length).toBe(expected.length);
    const firstDifference = got.findIndex((row, i) => row !== expected[i]);
    expect(firstDifference).toBe(-1);
  });

  it('fails with the file named when a thread stops', async () => {
    let pool: TokenizePool | undefined;
    const gen = rowsFromConversationsPooled(file, {
      ctx,
      dataset: 'd',
      threads: 2,
      minPoolBytes: 0,
      batchLines: 4,
      onPoolStarted: (p) => (pool = p),
    });
    const first = await gen.next();
    expect(first.done).toBe(false);
    await pool?.crashThread(0);
    const rest = (async () => {
      for (;;) if ((await gen.next()).done === true) return 'finished';
    })();
    await expect(rest).rejects.toThrow(
      /tokenize thread 1 of 2 stopped \(exit code 1\) while tokenizing .*conversations\.jsonl, (lines \d+–\d+|no lines in hand)/,
    );
  });
});
