/**
 * A full disk under the results sink (a real, small tmpfs; mounting needs root, so the test is
 * skipped elsewhere): `run` stops with one line naming the file and what to do — not
 * `unexpected error: ENOSPC … write` and a stack — and leaves no `.tmp-` checkpoint behind.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { afterAll, describe, expect, it } from 'vitest';

import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 32,
    seed: 8,
    contextLength: 2048,
    outputLength: { distribution: 'fixed', mean: 64 },
  },
  tmp: 'tm-disk-full-',
  cli: true,
});

function canMount(): boolean {
  if (process.getuid?.() !== 0) return false;
  try {
    execFileSync('mount', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

let mounted: string | undefined;
afterAll(() => {
  if (mounted !== undefined) execFileSync('umount', ['-l', mounted]);
});

describe.skipIf(!canMount())('a full disk under the results sink', () => {
  it('run stops with one line naming the part file and what to do; no temporary checkpoint left', async () => {
    const dir = path.join(tmp.dir, 'full');
    const out = path.join(dir, 'out');
    mkdirSync(out, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=96k', 'tmpfs', out]);
    mounted = out;
    writePrompts(dir, 'f', 400);
    const cfg = writeTestConfig(dir, {
      run: 'full',
      redis,
      sim,
      sglang: { contextLength: 2048 },
      datasets: [{ name: 'f', prompts: 'f.jsonl', tokenBudget: 10_000_000, maxNewTokens: 64, batchSize: 16 }],
    });
    const p = spawnCli(['run', '-c', cfg]);
    const code = await p.exited;
    const output = p.output();
    expect(code, output).not.toBe(0);
    const generations = path.join(out, 'full', 'f', 'generations');
    const lines = output.split('\n').filter((l) => l.startsWith('tokenmill:'));
    expect(lines.join('\n'), output).toMatch(
      new RegExp(
        `^tokenmill: cannot write ${generations.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}/(part-\\d+\\.jsonl|\\.sink-checkpoint\\.json): no space left on the device \\(ENOSPC\\)\\. Free space`,
        'm',
      ),
    );
    expect(output).not.toContain('unexpected error');
    expect(output).not.toMatch(/^\s+at /m);
    expect(readdirSync(generations).filter((n) => n.startsWith('.tmp-'))).toEqual([]);
  }, 120_000);
});

// A sink killed in the middle of a checkpoint write (or an older version's failed one) left a
// `.tmp-.sink-checkpoint.json-*` behind; the next sink removes it once it holds the lock.
describe('a temporary checkpoint left behind', () => {
  it('is removed when the next run starts its sink', async () => {
    const dir = path.join(tmp.dir, 'leftover');
    mkdirSync(dir, { recursive: true });
    writePrompts(dir, 'l', 6);
    const cfg = writeTestConfig(dir, {
      run: 'leftover',
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 2048 },
      datasets: [{ name: 'l', prompts: 'l.jsonl', tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 4 }],
    });
    const generations = path.join(dir, 'out', 'leftover', 'l', 'generations');
    mkdirSync(generations, { recursive: true });
    const leftover = path.join(generations, '.tmp-.sink-checkpoint.json-4242-deadbeef');
    writeFileSync(leftover, '{"part":"part-00000.jsonl","by');
    const p = spawnCli(['run', '-c', cfg]);
    expect(await p.exited, p.output()).toBe(0);
    expect(existsSync(leftover)).toBe(false);
    expect(readdirSync(generations).filter((n) => n.startsWith('.tmp-'))).toEqual([]);
  }, 90_000);
});
