/**
 * An edited line of a `prompts:` file (the same id, other content) after its generation: the old
 * generation is kept, as before, but no longer silently — the next run warns naming the file,
 * the line and the id, and what to do. Lines left as they were and content-hash ids do not warn.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 12,
    contextLength: 2048,
    outputLength: { distribution: 'fixed', mean: 16 },
  },
  tmp: 'tm-prompt-edited-',
  cli: true,
});

describe('an edited prompt line with the same id', () => {
  it('keeps the old generation and warns, naming the file, the line and the id', async () => {
    const dir = path.join(tmp.dir, 'edited');
    mkdirSync(dir, { recursive: true });
    const file = path.join(dir, 'e.jsonl');
    const lines = Array.from({ length: 6 }, (_, i) =>
      JSON.stringify({ id: `e-${i}`, prompt: `Question ${i}: say something short.` }),
    );
    lines.push(JSON.stringify({ prompt: 'A prompt without an id.' }));
    writeFileSync(file, `${lines.join('\n')}\n`);
    const cfg = writeTestConfig(dir, {
      run: 'edited',
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 2048 },
      datasets: [{ name: 'e', prompts: 'e.jsonl', tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 4 }],
    });
    const first = spawnCli(['run', '-c', cfg]);
    expect(await first.exited, first.output()).toBe(0);
    expect(first.output()).not.toContain('changed since it was generated');

    // Line 3 (id e-2) edited; line 7 (no id) edited too: it gets a new content-hash id.
    const edited = readFileSync(file, 'utf8').split('\n');
    edited[2] = JSON.stringify({ id: 'e-2', prompt: 'Question 2, reworded: say something else.' });
    edited[6] = JSON.stringify({ prompt: 'A prompt without an id, reworded.' });
    writeFileSync(file, edited.join('\n'));
    const second = spawnCli(['run', '-c', cfg]);
    expect(await second.exited, second.output()).toBe(0);
    const warnings = second
      .output()
      .split('\n')
      .filter((l) => l.includes('changed since it was generated'));
    expect(warnings, second.output()).toHaveLength(1);
    expect(warnings[0]).toContain(
      'e.jsonl:3: the prompt with id \\"e-2\\" changed since it was generated; its old generation is kept',
    );
    expect(warnings[0]).toContain('give the line a new id');
    const generated = readGenerations(path.join(dir, 'out', 'edited'), 'e');
    expect(generated.filter((g) => g.id === 'e-2')).toHaveLength(1);
    // The id-less line's new content is a new sample: 8 in all.
    expect(generated).toHaveLength(8);
  }, 120_000);
});
