// The README's quick start: `tokenmill demo` as a real child process (the CLI from source), on
// its embedded defaults: a private redis-server, the built-in simulator, the bundled datasets and
// tokenizer. It must run every phase to the end and its status table must show each dataset that
// ended by budget within a few percent of it (the demo's budget-bound datasets are strict). The run
// is the one the trainers' loader tests read too (test/helpers/shared-demo.ts): this file only reads it.

import { describe, expect, it } from 'vitest';
import { DEMO_DATASETS } from '../../src/cli/commands/demo.js';
import { demoTrainerPython } from '../../src/cli/commands/demo-train.js';
import { readGenerations, repoRoot } from '../helpers/pipeline.js';
import { sharedDemo } from '../helpers/shared-demo.js';

/** "Within a few percent". */
const MAX_OVER = 0.03;

interface DemoDatasetStatus {
  name: string;
  records: number;
  outputTokens: number;
  tokenBudget: number;
  skipped: number;
  failed: number;
  status: string;
  conversations?: { complete: number; partial: number; ended: number; turns: number };
}

interface DemoStatus {
  phases: { name: string; status: string; configured: boolean }[];
  datasets: DemoDatasetStatus[];
}

describe('tokenmill demo', () => {
  it('runs generate, tokenize and merge to the end; every dataset that ended by budget lands within a few percent of it', async () => {
    const demo = await sharedDemo();
    const status = demo.json as DemoStatus;

    for (const phase of ['prepare', 'generate', 'tokenize', 'merge']) {
      expect(status.phases.find((p) => p.name === phase)?.status, phase).toBe('completed');
    }
    // With the trainer environment, the training and the eval step after it ran too.
    if (demoTrainerPython(repoRoot) !== null)
      for (const phase of ['train', 'eval'])
        expect(status.phases.find((p) => p.name === phase)?.status, phase).toBe('completed');
    expect(status.datasets.map((d) => d.name)).toEqual(DEMO_DATASETS.map((d) => d.name));
    let byBudget = 0;
    for (const d of status.datasets) {
      expect(d.status, d.name).toBe('completed');
      expect(d.failed, d.name).toBe(0);
      if (d.outputTokens >= d.tokenBudget) {
        // Ended by budget: the rest of its prompts skipped, the total on the budget.
        byBudget += 1;
        expect(d.skipped, d.name).toBeGreaterThan(0);
        expect(
          d.outputTokens / d.tokenBudget - 1,
          `${d.name}: ${d.outputTokens} / ${d.tokenBudget}`,
        ).toBeLessThanOrEqual(MAX_OVER);
      } else {
        // Ended by running out of prompts: nothing skipped by budget.
        expect(d.skipped, d.name).toBe(0);
      }
    }
    // The demo is a mix: most datasets end by budget (B8's budget is beyond its prompts).
    expect(byBudget).toBeGreaterThanOrEqual(5);

    // B5_sharegpt is regenerated turn by turn: its records are turns of its conversations, and
    // conversations of several turns got their later turns.
    const b5 = status.datasets.find((d) => d.name === 'B5_sharegpt');
    expect(b5?.conversations, 'B5 counts conversations').toBeDefined();
    expect(b5?.conversations?.turns).toBe(b5?.records);
    const turns = readGenerations(demo.runDir, 'B5_sharegpt') as unknown as { turn?: number }[];
    expect(turns.length).toBe(b5?.records);
    expect(turns.every((t) => typeof t.turn === 'number')).toBe(true);
    expect(turns.some((t) => (t.turn ?? 0) >= 2)).toBe(true);
  }, 300_000);
});
