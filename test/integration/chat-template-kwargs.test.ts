/**
 * `datasets[].chatTemplateKwargs` reaches every place the chat template is rendered: the
 * producer's prompts (turn 1), the worker's later turns and the export's check of each prompt
 * (without them every prompt would be left out as changed). With Qwen3's `enable_thinking: false` the
 * generation prompt ends with an empty think block, which the template writes only then.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { bundledTokenizerPath, loadTokenizer } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { writeConversations } from '../helpers/conversations.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 9, outputLength: { distribution: 'fixed', mean: 6 } },
  tmp: 'tm-kwargs-',
  cli: true,
});

const NO_THINK = { enable_thinking: false };
const EMPTY_THINK = '<|im_start|>assistant\n<think>\n\n</think>\n\n';

describe('chatTemplateKwargs', () => {
  it('renders with the dataset variables in generation (every turn) and export', async () => {
    const dir = path.join(tmp.dir, 'kw');
    mkdirSync(dir, { recursive: true });
    writePrompts(dir, 'p', 3);
    writeConversations(dir, 'c', 2, 2);
    const cfg = writeTestConfig(dir, {
      run: 'kw',
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 4096 },
      datasets: [
        { name: 'p', prompts: 'p.jsonl', tokenBudget: 1_000_000, maxNewTokens: 6, chatTemplateKwargs: NO_THINK },
        {
          name: 'c',
          prompts: 'c.jsonl',
          turns: 'all',
          tokenBudget: 1_000_000,
          maxNewTokens: 6,
          chatTemplateKwargs: NO_THINK,
        },
      ],
      postprocess: { keepTruncated: true, rows: 'per-turn' },
    });
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const tok = await loadTokenizer(bundledTokenizerPath());
    const runDir = path.join(dir, 'out', 'kw');

    // Generation: every prompt, turn 1 (the producer) and turn 2 (the worker), ends with the empty think block.
    for (const ds of ['p', 'c']) {
      const records = readGenerations(runDir, ds);
      expect(records.length).toBeGreaterThan(0);
      for (const r of records)
        expect(tok.decode(r.prompt_ids, { skipSpecialTokens: false }).endsWith(EMPTY_THINK), r.id).toBe(true);
    }
    expect(readGenerations(runDir, 'c').some((r) => r.id.endsWith('#t2'))).toBe(true);

    // Export: each prompt still renders (with the variables) to the record's ids: nothing left out.
    const out = path.join(dir, 'sf.jsonl');
    const sf = spawnCli(['export', '-c', cfg, '--format', 'specforge', '--out', out, '--dataset', 'p', 'c', '--json']);
    expect(await sf.exited, sf.output()).toBe(0);
    // One line per row: p's three prompts and each of c's turns (postprocess.rows: per-turn).
    const lines = readFileSync(out, 'utf8').trim().split('\n');
    expect(lines).toHaveLength(3 + readGenerations(runDir, 'c').length);
  }, 180_000);
});
