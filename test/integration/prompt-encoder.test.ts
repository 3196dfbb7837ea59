// The producer's tokenize thread (src/producers/prompt-encoder.ts): a real worker thread with
// its own tokenizer gives the very ids the main thread gives, in order, template errors
// included; a thread that cannot load its tokenizer leaves the main thread encoding.
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ThreadedPromptEncoder, promptEncoder } from '../../src/producers/prompt-encoder.js';
import { bundledTokenizerPath, loadTokenizer, type ChatMessage } from '../../src/shared/index.js';
import { quietLogger } from '../helpers/redis.js';
import { waitFor } from '../helpers/pipeline.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** Prompts of every shape the producer sends: plain, multi-turn, system, unicode, blank, and one the template rejects. */
function conversations(n: number): ChatMessage[][] {
  const out: ChatMessage[][] = [];
  for (let i = 0; i < n; i += 1) {
    switch (i % 5) {
      case 0:
        out.push([{ role: 'user', content: `Prompt ${i}: write a function that adds ${i} to x.` }]);
        break;
      case 1:
        out.push([
          { role: 'system', content: 'Answer briefly.' },
          { role: 'user', content: `你好 ${i} 🙂\n\ttabbed  spaced` },
        ]);
        break;
      case 2:
        out.push([
          { role: 'user', content: `first ${i}` },
          { role: 'assistant', content: 'an answer' },
          { role: 'user', content: 'and again' },
        ]);
        break;
      case 3:
        out.push([{ role: 'user', content: ' ' }]);
        break;
      default:
        // No message at all: the template cannot render it (an Error in its place).
        out.push([]);
    }
  }
  return out;
}

function same(a: readonly (number[] | Error)[], b: readonly (number[] | Error)[]): void {
  expect(a.length).toBe(b.length);
  a.forEach((x, i) => {
    const y = b[i];
    if (x instanceof Error) expect(y instanceof Error ? y.message : y).toBe(x.message);
    else expect(y).toEqual(x);
  });
}

describe('the producer\'s prompt encoder', () => {
  it('encodes on its thread once ready, with the main thread\'s ids, in order, template errors included', async () => {
    const tokenizer = await loadTokenizer(bundledTokenizerPath());
    const encoder = promptEncoder(tokenizer, { logger: quietLogger() });
    expect(encoder).toBeInstanceOf(ThreadedPromptEncoder);
    const threaded = encoder as ThreadedPromptEncoder;
    try {
      await waitFor(() => threaded.threaded, 'the tokenize thread ready', 60_000);
      const convs = conversations(200);
      const expected = await tokenizer.encodePrompts(convs);
      expect(expected.filter((x) => x instanceof Error)).toHaveLength(40);
      // Several pieces at once: each answer goes to its own call.
      const pieces = [convs.slice(0, 64), convs.slice(64, 128), convs.slice(128)];
      const got = await Promise.all(pieces.map((p) => encoder.encodePrompts(p)));
      expect(threaded.threaded).toBe(true);
      same(expected, got.flat());
    } finally {
      await encoder.close();
    }
    // Closed: the main thread encodes.
    expect(threaded.threaded).toBe(false);
    same(await tokenizer.encodePrompts(conversations(5)), await encoder.encodePrompts(conversations(5)));
  }, 90_000);

  it('a thread that cannot load its tokenizer leaves the main thread encoding, every prompt answered', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'tokenmill-encoder-'));
    dirs.push(dir);
    const copy = path.join(dir, 'tok');
    cpSync(bundledTokenizerPath(), copy, { recursive: true });
    const tokenizer = await loadTokenizer(copy);
    // Gone before the thread reads it.
    rmSync(copy, { recursive: true, force: true });
    const encoder = promptEncoder(tokenizer, { logger: quietLogger() }) as ThreadedPromptEncoder;
    try {
      const convs = conversations(50);
      const expected = await tokenizer.encodePrompts(convs);
      // Ask while the thread starts and after it failed: the answers are the main thread's.
      same(expected, await encoder.encodePrompts(convs));
      await new Promise((r) => setTimeout(r, 3_000));
      expect(encoder.threaded).toBe(false);
      same(expected, await encoder.encodePrompts(convs));
    } finally {
      await encoder.close();
    }
  }, 60_000);

  it('`thread: false` uses no thread', async () => {
    const tokenizer = await loadTokenizer(bundledTokenizerPath());
    const encoder = promptEncoder(tokenizer, { thread: false });
    expect(encoder).not.toBeInstanceOf(ThreadedPromptEncoder);
    same(await tokenizer.encodePrompts(conversations(10)), await encoder.encodePrompts(conversations(10)));
    await encoder.close();
  });
});
