// Drafters side by side (src/workers/eval/compare.ts): an EAGLE-3 attempt, a DFlash attempt and
// no speculation per dataset and overall, from the attempts' reports; a report measured with
// other settings is left out and said; figures the simulator produced are marked, and a simulated
// report is not set beside one measured on SGLang.
import { describe, expect, it } from 'vitest';
import { compareReports, formatComparison } from '../../src/workers/eval/compare.js';
import type { EvalReport, EvalSection } from '../../src/workers/eval/report.js';

function section(prompts: number, acceptLength: number, tokensPerSec: number, baseline: number): EvalSection {
  return {
    prompts,
    drafter: { acceptLength, tokensPerSec } as EvalSection['drafter'],
    baseline: { tokensPerSec: baseline } as NonNullable<EvalSection['baseline']>,
    speedup: tokensPerSec / baseline,
    delta: null,
  };
}

function report(attempt: string, algorithm: string, accept: number, tps: number, concurrency = 8): EvalReport {
  const dflash = algorithm === 'DFLASH';
  return {
    run: 'demo',
    attempt,
    measuredAt: `2026-01-0${attempt.slice(-1)}T00:00:00Z`,
    endpoints: [
      {
        url: 'http://x',
        version: '0.5.23',
        modelPath: 'm',
        algorithm,
        draftModelPath: 'd',
        numSteps: dflash ? 1 : 3,
        eagleTopk: 1,
        numDraftTokens: dflash ? 8 : 4,
      },
    ],
    settings: {
      concurrency,
      maxNewTokens: 128,
      sampling: { temperature: 0 },
      maxPromptsPerDataset: 4,
      prompts: 'held-out',
    },
    datasets: [
      { dataset: 'code', promptFile: 'f', ...section(4, accept + 0.5, tps * 1.2, 1000) },
      { dataset: 'chat', promptFile: 'f', ...section(4, accept, tps, 1000) },
    ],
    overall: section(8, accept + 0.2, tps * 1.1, 1000),
  } as unknown as EvalReport;
}

describe('compareReports', () => {
  it('lists no speculation, then each evaluated drafter, per dataset and overall', () => {
    const c = compareReports([
      { attempt: '0001', file: 'a', report: report('0001', 'EAGLE3', 2.6, 1800) },
      { attempt: '0002', file: 'b', report: report('0002', 'DFLASH', 3.4, 2300) },
    ]);
    expect(c.drafters.map((d) => d.label)).toEqual(['EAGLE3 (3 steps)', 'DFLASH (block 8)']);
    expect(c.rows.filter((r) => r.dataset === 'chat')).toEqual([
      {
        dataset: 'chat',
        attempt: null,
        drafter: 'no speculation',
        prompts: 4,
        acceptLength: null,
        tokensPerSec: 1000,
        speedup: 1,
        simulated: false,
      },
      {
        dataset: 'chat',
        attempt: '0001',
        drafter: '0001 EAGLE3 (3 steps)',
        prompts: 4,
        acceptLength: 2.6,
        tokensPerSec: 1800,
        speedup: 1.8,
        simulated: false,
      },
      {
        dataset: 'chat',
        attempt: '0002',
        drafter: '0002 DFLASH (block 8)',
        prompts: 4,
        acceptLength: 3.4,
        tokensPerSec: 2300,
        speedup: 2.3,
        simulated: false,
      },
    ]);
    expect(c.rows.map((r) => r.dataset)).toEqual([
      'code',
      'code',
      'code',
      'chat',
      'chat',
      'chat',
      'overall',
      'overall',
      'overall',
    ]);
    const text = formatComparison(c);
    expect(text).toContain('drafters compared on the same held-out prompts, run demo:');
    expect(text).toMatch(/^chat\s+0002 DFLASH \(block 8\)\s+4\s+3\.40\s+2300\.0\s+2\.30x$/m);
    expect(text).toMatch(/^chat\s+no speculation\s+4\s+-\s+1000\.0\s+1\.00x$/m);
  });

  it('leaves out a report measured with other settings than the newest, and says so', () => {
    const c = compareReports([
      { attempt: '0001', file: 'a', report: report('0001', 'EAGLE3', 2.6, 1800, 16) },
      { attempt: '0002', file: 'b', report: report('0002', 'DFLASH', 3.4, 2300) },
    ]);
    expect(c.drafters.map((d) => d.attempt)).toEqual(['0002']);
    expect(c.notes[0]).toMatch(/attempt 0001 was measured with other settings \(concurrency 16 → 8\): left out/);
  });

  it('with no evaluated attempt, says so', () => {
    expect(formatComparison(compareReports([]))).toContain('no evaluated attempt');
  });

  it("marks the simulator's figures, and leaves a simulated report out beside one measured on SGLang", () => {
    const simulated = (r: EvalReport): EvalReport =>
      ({
        ...r,
        source: 'simulator',
        endpoints: r.endpoints.map((e) => ({ ...e, simulator: { imitates: '0.5.4' } }) as (typeof r.endpoints)[number]),
        baseline: [{ url: 'http://b', version: '0.5.4', modelPath: 'm', simulator: { imitates: '0.5.4' } }],
      }) as EvalReport;
    const both = compareReports([
      { attempt: '0001', file: 'a', report: simulated(report('0001', 'EAGLE3', 2.6, 1800)) },
      { attempt: '0002', file: 'b', report: simulated(report('0002', 'DFLASH', 3.4, 2300)) },
    ]);
    expect(both.drafters.map((d) => d.source)).toEqual(['simulator', 'simulator']);
    expect(both.rows.every((r) => r.simulated)).toBe(true);
    const text = formatComparison(both);
    expect(text).toContain(
      "  SIMULATED (*): attempts 0001, 0002 ran against tokenmill's SGLang simulator: the acceptance is its configured one",
    );
    expect(text).toMatch(/^chat\s+0002 DFLASH \(block 8\) \*\s+4\s+3\.40\s+2300\.0\s+2\.30x$/m);
    expect(text).toMatch(/^chat\s+no speculation \*\s+4\s+-\s+1000\.0\s+1\.00x$/m);

    const mixed = compareReports([
      { attempt: '0001', file: 'a', report: simulated(report('0001', 'EAGLE3', 2.6, 1800)) },
      { attempt: '0002', file: 'b', report: { ...report('0002', 'DFLASH', 3.4, 2300), source: 'sglang' } },
    ]);
    expect(mixed.drafters.map((d) => d.attempt)).toEqual(['0002']);
    expect(mixed.notes).toEqual([
      'attempt 0001 was evaluated on the simulator (its configured acceptance), the newest on SGLang: left out',
    ]);
    expect(formatComparison(mixed)).not.toMatch(/SIMULATED|\*/);
  });
});
