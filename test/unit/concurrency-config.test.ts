import { describe, expect, it } from 'vitest';
import { ConfigError, autoConcurrencyOf, concurrencyCeiling, loadConfig } from '../../src/shared/index.js';

function load(sglang: Record<string, unknown>, text?: string): ReturnType<typeof loadConfig> {
  if (text !== undefined) return loadConfig({ baseDir: '/tmp', text });
  return loadConfig({
    baseDir: '/tmp',
    object: { run: 'r', sglang, datasets: [{ name: 'a', prompts: 'a.jsonl', tokenBudget: 10 }] },
  });
}

function issues(f: () => unknown): Record<string, string> {
  try {
    f();
  } catch (e: unknown) {
    if (e instanceof ConfigError) return Object.fromEntries(e.issues.map((i) => [i.path, i.message]));
    throw e;
  }
  throw new Error('expected a ConfigError');
}

describe('config: sglang.concurrency "auto"', () => {
  it('takes "auto" from YAML, with the documented bounds by default', () => {
    const c = load(
      {},
      [
        'run: r',
        'sglang:',
        '  concurrency: auto',
        'datasets:',
        '  - { name: a, prompts: a.jsonl, tokenBudget: 10 }',
      ].join('\n'),
    );
    expect(c.sglang.concurrency).toBe('auto');
    expect(autoConcurrencyOf(c.sglang)).toEqual({ min: 8, max: 1024, start: 32, intervalMs: 10_000, maxQueued: 8 });
    expect(concurrencyCeiling(c.sglang)).toBe(1024);
  });

  it('keeps a fixed number as it was; the ceiling is the number', () => {
    const c = load({ concurrency: 96, autoConcurrency: { max: 300 } });
    expect(c.sglang.concurrency).toBe(96);
    expect(concurrencyCeiling(c.sglang)).toBe(96);
    expect(concurrencyCeiling(load({ concurrency: 'auto', autoConcurrency: { max: 300 } }).sglang)).toBe(300);
  });

  it('names the path of a wrong value, and of bounds that do not fit together', () => {
    expect(issues(() => load({ concurrency: 'automatic' }))).toEqual({
      'sglang.concurrency': 'expected a positive integer, got "automatic"',
    });
    expect(issues(() => load({ concurrency: 0 }))).toEqual({
      'sglang.concurrency': 'expected a positive integer, got 0',
    });
    expect(issues(() => load({ concurrency: 'auto', autoConcurrency: { min: 64, max: 32 } }))).toEqual({
      'sglang.autoConcurrency.min': 'expected min <= max (32), got 64',
    });
    expect(issues(() => load({ concurrency: 'auto', autoConcurrency: { start: 4 } }))).toEqual({
      'sglang.autoConcurrency.start': 'expected start within [min, max] = [8, 1024], got 4',
    });
    expect(issues(() => load({ concurrency: 'auto', autoConcurrency: { steps: 3 } }))).toHaveProperty([
      'sglang.autoConcurrency.steps',
    ]);
  });
});
