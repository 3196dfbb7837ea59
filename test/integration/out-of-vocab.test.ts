/**
 * A server answering output ids outside the run's vocabulary (`output_ids[0] = 999999999`):
 * the answer is refused before it is committed (an attempt, like any unusable answer), so it is
 * never counted against the budget nor written, and post-processing is never blocked by it.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { RunKeys, bundledTokenizerPath, loadTokenizer } from '../../src/shared/index.js';
import { OUT_OF_VOCAB_ID } from '../../src/sim/fault-replies.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 11,
    contextLength: 2048,
    outputLength: { distribution: 'fixed', mean: 16 },
  },
  tmp: 'tm-oov-',
  cli: true,
});

function setup(run: string, n: number, maxAttempts: number): string {
  const dir = path.join(tmp.dir, run);
  mkdirSync(dir, { recursive: true });
  writePrompts(dir, 'v', n);
  return writeTestConfig(dir, {
    run,
    redis,
    sim,
    sglang: { concurrency: 4, contextLength: 2048, maxAttempts, healthCheckIntervalMs: 200 },
    datasets: [{ name: 'v', prompts: 'v.jsonl', tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 4 }],
  });
}

describe('out-of-vocabulary output ids', () => {
  it('are refused before the commit: retried, never counted or written; the run and its post-processing complete', async () => {
    const vocabSize = (await loadTokenizer(bundledTokenizerPath())).vocabSize;
    const cfg = setup('oov-retry', 24, 20);
    sim.resetStats();
    sim.setFaults({ badAnswerRate: 0.3, badAnswer: 'out-of-vocab' });
    let code: number | string;
    let output: string;
    try {
      const p = spawnCli(['run', '-c', cfg]);
      code = await p.exited;
      output = p.output();
    } finally {
      sim.clearFaults();
    }
    expect(code, output).toBe(0);
    expect(output).toContain(`output_ids[0] is ${OUT_OF_VOCAB_ID}`);
    const runDir = path.join(tmp.dir, 'oov-retry', 'out', 'oov-retry');
    const generated = readGenerations(runDir, 'v');
    expect(generated).toHaveLength(24);
    expect(duplicates(generated.map((g) => g.id))).toEqual([]);
    for (const g of generated) expect(Math.max(...g.output_ids), g.id).toBeLessThan(vocabSize);
    const keys = new RunKeys(redis.prefix, 'oov-retry');
    const counted = Number(await redis.connection('client').hget(keys.stats('v'), 'outputTokens'));
    expect(counted).toBe(generated.reduce((n, g) => n + g.completion_tokens, 0));
  }, 120_000);

  it('after sglang.maxAttempts the sample ends failed with the reason; nothing committed or counted', async () => {
    const cfg = setup('oov-fail', 4, 1);
    sim.setFaults({ badAnswerRate: 1, badAnswer: 'out-of-vocab' });
    let output: string;
    try {
      const p = spawnCli(['run', '-c', cfg]);
      await p.exited;
      output = p.output();
    } finally {
      sim.clearFaults();
    }
    const keys = new RunKeys(redis.prefix, 'oov-fail');
    const r = redis.connection('client');
    const failed = Object.values(await r.hgetall(keys.failed('v'))).map((j) => JSON.parse(j) as { reason: string });
    expect(failed, output).toHaveLength(4);
    for (const f of failed) {
      expect(f.reason).toContain(
        `output_ids[0] is ${OUT_OF_VOCAB_ID}, not a token id of the run's tokenizer (vocabulary size`,
      );
    }
    expect(Number((await r.hget(keys.stats('v'), 'outputTokens')) ?? 0)).toBe(0);
    expect(await r.scard(keys.done('v'))).toBe(0);
  }, 120_000);
});
