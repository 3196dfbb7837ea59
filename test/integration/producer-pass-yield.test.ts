// A pass tokenizes its prompts a piece at a time and lets the event loop run between pieces:
// an inference worker in the same process keeps sending and committing while the producer
// tokenizes, and a full batch is enqueued as soon as its prompts are tokenized.
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { ENCODE_CHUNK, runPass } from '../../src/producers/producer-pass.js';
import {
  PromptFileIndex,
  RunKeys,
  bundledTokenizerPath,
  loadTokenizer,
  withScripts,
  type ChatMessage,
  type ChatTokenizer,
  type Sample,
} from '../../src/shared/index.js';
import { loadTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { writePrompts } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true });
let tokenizer: ChatTokenizer;

beforeAll(async () => {
  tokenizer = await loadTokenizer(bundledTokenizerPath());
});

type Event = { kind: 'encode'; size: number; ticks: number } | { kind: 'batch'; size: number; ticks: number };

describe('producer pass: tokenizing in pieces', () => {
  it('tokenizes at most ENCODE_CHUNK prompts at once, yields between pieces, enqueues each batch once it is tokenized; the ids are those of one call', async () => {
    const n = 1_000;
    const batchSize = ENCODE_CHUNK;
    writePrompts(tmp.dir, 'pieces', n, (i) => ({
      id: `p-${i}`,
      prompt: `prompt number ${i} ${'word '.repeat(i % 7)}`,
    }));
    const cfg = loadTestConfig(tmp.dir, {
      run: 'pieces',
      redis,
      sim: 'http://127.0.0.1:1',
      sglang: { concurrency: 4 },
      datasets: [{ name: 'pieces', prompts: 'pieces.jsonl', tokenBudget: 1_000_000, maxNewTokens: 64, batchSize }],
    });
    const ds = cfg.datasets[0]!;
    const file = join(tmp.dir, 'pieces.jsonl');

    // A macrotask that reschedules itself: its count moves only when the event loop gets a turn.
    let ticks = 0;
    let ticking = true;
    const tick = (): void => {
      ticks += 1;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);

    const events: Event[] = [];
    const counted: Pick<ChatTokenizer, 'encodePrompts'> = {
      encodePrompts: async (prompts: readonly (readonly ChatMessage[])[]) => {
        events.push({ kind: 'encode', size: prompts.length, ticks });
        return tokenizer.encodePrompts(prompts);
      },
    };
    const samples: Sample[] = [];
    const conn = redis.connection('worker');
    try {
      const result = await runPass({
        redis: withScripts(conn),
        keys: new RunKeys(redis.prefix, 'pieces'),
        ds,
        file,
        index: await PromptFileIndex.build(file),
        tokenizer: counted as ChatTokenizer,
        contextLength: undefined,
        runDir: join(tmp.dir, 'out', 'pieces'),
        epoch: 0,
        fromLine: 0,
        log: quietLogger(),
        isStopping: () => false,
        addBatch: async (batch) => {
          events.push({ kind: 'batch', size: batch.length, ticks });
          samples.push(...batch);
          return true;
        },
      });
      expect(result).toMatchObject({ complete: true, enqueued: n, valid: n, rejected: 0 });
    } finally {
      ticking = false;
      await conn.quit();
    }

    const encodes = events.filter((e) => e.kind === 'encode');
    expect(encodes.length).toBe(Math.ceil(n / ENCODE_CHUNK));
    expect(Math.max(...encodes.map((e) => e.size))).toBeLessThanOrEqual(ENCODE_CHUNK);
    // The event loop ran between any two pieces.
    for (let i = 1; i < encodes.length; i += 1) expect(encodes[i]!.ticks).toBeGreaterThan(encodes[i - 1]!.ticks);
    // Encode, batch, encode, batch, ...: the first batch left before the second piece was tokenized.
    expect(events.slice(0, 4).map((e) => e.kind)).toEqual(['encode', 'batch', 'encode', 'batch']);

    // Pieces give the very ids that one call over every prompt gives.
    const whole = await tokenizer.encodePrompts(
      samples.map((s) => [
        { role: 'user', content: `prompt number ${s.line - 1} ${'word '.repeat((s.line - 1) % 7)}` },
      ]),
    );
    expect(samples.map((s) => s.id)).toEqual(Array.from({ length: n }, (_, i) => `p-${i}`));
    expect(samples.map((s) => s.promptIds)).toEqual(whole);
  }, 120_000);
});
