// The evaluation's arithmetic: token-weighted acceptance (a ratio of sums, not a mean of ratios),
// summed histograms, tokens/s and speed-up, deltas against the previous report, the warnings and
// the checks that fail.
import { describe, expect, it } from 'vitest';
import {
  addAnswer,
  addFailure,
  buildReport,
  emptyTotals,
  formatReport,
  parseReport,
  specStatsOf,
  type DatasetTotals,
  type EvalReport,
  type PhaseTotals,
  type ReportContext,
} from '../../src/workers/index.js';

/** A drafter answer's meta_info as SGLang 0.5.23 sends it. */
function specMeta(completion: number, verify: number, correct: number, proposed: number, histogram: number[]) {
  return {
    completion_tokens: completion,
    spec_verify_ct: verify,
    spec_accept_length: completion / verify,
    spec_accept_rate: correct / proposed,
    spec_num_correct_drafts: correct,
    spec_num_proposed_drafts: proposed,
    spec_correct_drafts_histogram: histogram,
  };
}

function totalsOf(
  answers: { completion: number; meta?: Record<string, unknown> }[],
  wallSec: number,
  failures = 0,
): PhaseTotals {
  const t = emptyTotals();
  for (const a of answers) {
    const spec = a.meta === undefined ? undefined : specStatsOf(a.meta);
    if (typeof spec === 'string') throw new Error(spec);
    addAnswer(t, { promptTokens: 10, completionTokens: a.completion, spec });
  }
  for (let i = 0; i < failures; i++) addFailure(t);
  t.wallSec = wallSec;
  return t;
}

const context = (over: Partial<ReportContext> = {}): ReportContext => ({
  run: 'r',
  attempt: '0002',
  drafter: '/x/train/0002/checkpoints/step-40',
  measuredAt: '2026-01-01T00:00:00.000Z',
  durationSec: 1,
  endpoints: [],
  baseline: [],
  settings: {
    concurrency: 16,
    maxNewTokens: 512,
    sampling: { temperature: 0 },
    maxPromptsPerDataset: 200,
    prompts: 'held-out',
  },
  skipped: [],
  thresholds: { maxAcceptDrop: 0.1 },
  ...over,
});

describe('eval aggregation', () => {
  it('acceptance length is Σ completion tokens / Σ verify steps, not the mean of per-answer ratios', () => {
    // A short answer that accepted everything (4 tokens per step) and a long one that accepted little (1.25).
    const drafter = totalsOf(
      [
        { completion: 8, meta: specMeta(8, 2, 6, 6, [0, 0, 0, 2]) },
        { completion: 500, meta: specMeta(500, 400, 100, 1200, [300, 100, 0, 0]) },
      ],
      10,
    );
    const r = buildReport(
      [{ dataset: 'a', promptFile: 'f', prompts: 2, drafter, baseline: null }],
      context({ baseline: null }),
    );
    const d = r.datasets[0];
    expect(d?.drafter.acceptLength).toBeCloseTo(508 / 402, 12);
    // The mean of ratios would be (4 + 1.25) / 2 = 2.625: far from what the server's tokens/step is.
    expect(d?.drafter.acceptLength).not.toBeCloseTo(2.625, 1);
    expect(d?.drafter.acceptRate).toBeCloseTo(106 / 1206, 12);
    expect(d?.drafter.histogram).toEqual([300, 100, 0, 2]);
    expect(d?.drafter.tokensPerSec).toBeCloseTo(50.8, 12);
    expect(d?.speedup).toBeNull();
  });

  it('histograms of different lengths sum entry by entry; overall sums datasets and their wall times', () => {
    const a = totalsOf([{ completion: 10, meta: specMeta(10, 5, 5, 15, [2, 1]) }], 2);
    const b = totalsOf([{ completion: 30, meta: specMeta(30, 10, 20, 30, [1, 2, 3, 4]) }], 3);
    const base = (n: number, s: number) => totalsOf([{ completion: n }], s);
    const r = buildReport(
      [
        { dataset: 'a', promptFile: 'fa', prompts: 1, drafter: a, baseline: base(10, 4) },
        { dataset: 'b', promptFile: 'fb', prompts: 1, drafter: b, baseline: base(30, 6) },
      ],
      context(),
    );
    expect(r.overall.drafter.histogram).toEqual([3, 3, 3, 4]);
    expect(r.overall.drafter.acceptLength).toBeCloseTo(40 / 15, 12);
    expect(r.overall.drafter.tokensPerSec).toBeCloseTo(40 / 5, 12);
    expect(r.overall.baseline?.tokensPerSec).toBeCloseTo(40 / 10, 12);
    expect(r.overall.speedup).toBeCloseTo(2, 12);
    expect(r.datasets[0]?.speedup).toBeCloseTo(5 / 2.5, 12);
    expect(r.overall.prompts).toBe(2);
    expect(r.ok).toBe(true);
    expect(r.warnings).toEqual([]);
  });

  it('failed requests are counted, left out of the figures, and warned about', () => {
    const drafter = totalsOf([{ completion: 20, meta: specMeta(20, 10, 10, 30, [5, 5]) }], 1, 2);
    const r = buildReport(
      [{ dataset: 'a', promptFile: 'f', prompts: 3, drafter, baseline: null }],
      context({ baseline: null }),
    );
    expect(r.datasets[0]?.drafter.requests).toBe(3);
    expect(r.datasets[0]?.drafter.failures).toBe(2);
    expect(r.datasets[0]?.drafter.acceptLength).toBe(2);
    expect(r.warnings.some((w) => w.includes('2 of 3 drafter requests failed'))).toBe(true);
  });

  it('a slower drafter warns with both speeds; thresholds fail the report and say why', () => {
    const drafter = totalsOf([{ completion: 823, meta: specMeta(823, 392, 431, 1176, [100, 150, 142]) }], 10);
    const baseline = totalsOf([{ completion: 900 }], 10);
    const r = buildReport(
      [{ dataset: 'chat', promptFile: 'f', prompts: 1, drafter, baseline }],
      context({ thresholds: { maxAcceptDrop: 0.1, minAcceptLength: 2.5, minSpeedup: 1.2 } }),
    );
    expect(r.overall.speedup).toBeCloseTo(823 / 900, 12);
    expect(r.warnings).toContain(
      'dataset chat: the drafter makes decoding slower: 82.3 vs 90.0 tok/s (speed-up 0.91x)',
    );
    // One dataset: the overall figures are its own, warned about once.
    expect(r.warnings).toHaveLength(1);
    expect(r.ok).toBe(false);
    expect(r.failed.map((f) => f.check)).toEqual(['minAcceptLength', 'minSpeedup']);
    expect(r.failed[0]?.message).toBe('acceptance length 2.10 is below eval.minAcceptLength 2.5');
    expect(r.failed[1]?.value).toBeCloseTo(0.914, 3);
    const table = formatReport(r);
    expect(table).toContain('WARNING: dataset chat: the drafter makes decoding slower: 82.3 vs 90.0 tok/s');
    expect(table).toContain('FAILED: speed-up 0.91x');
    expect(table).toMatch(/chat\s+1\s+2\.10\s+0\.366\s+82\.3\s+90\.0\s+0\.91x\s+0/);
  });

  it('deltas against the previous report, per dataset and overall; a drop beyond maxAcceptDrop warns', () => {
    const mk = (completion: number, verify: number, wall: number): DatasetTotals[] => [
      {
        dataset: 'a',
        promptFile: 'f',
        prompts: 1,
        drafter: totalsOf(
          [{ completion, meta: specMeta(completion, verify, completion - verify, verify * 3, [verify]) }],
          wall,
        ),
        baseline: totalsOf([{ completion }], 2 * wall),
      },
    ];
    const prev: EvalReport = buildReport(mk(300, 100, 1), context({ attempt: '0001' }));
    const cur = buildReport(mk(300, 150, 1.5), context({ previous: { report: prev, file: '/p/eval.json' } }));
    const d = cur.datasets[0]?.delta;
    expect(d?.acceptLength).toBeCloseTo(2 - 3, 12);
    expect(d?.acceptLengthChange).toBeCloseTo(-1 / 3, 12);
    expect(d?.speedup).toBeCloseTo(0, 12);
    expect(d?.drafterTokensPerSec).toBeCloseTo(200 - 300, 12);
    expect(cur.overall.delta?.acceptLength).toBeCloseTo(-1, 12);
    expect(cur.previous).toEqual({
      attempt: '0001',
      file: '/p/eval.json',
      measuredAt: prev.measuredAt,
      comparable: true,
    });
    expect(cur.warnings).toContain(
      'dataset a: acceptance length fell by 33.3 % since attempt 0001: 3.00 → 2.00 (eval.maxAcceptDrop 0.1)',
    );
    // Within the allowed drop: no warning.
    const tolerant = buildReport(
      mk(300, 150, 1.5),
      context({ previous: { report: prev, file: '/p/eval.json' }, thresholds: { maxAcceptDrop: 0.5 } }),
    );
    expect(tolerant.warnings).toEqual([]);
    // The table shows the deltas.
    expect(formatReport(cur)).toMatch(/Δ accept len/);
    expect(formatReport(cur)).toMatch(/a\s+1\s+2\.00\s+.*-1\.00\s+\+0\.00/);
  });

  it('reports measured with other settings are compared but flagged', () => {
    const t = totalsOf([{ completion: 10, meta: specMeta(10, 5, 5, 15, [5]) }], 1);
    const prev = buildReport([{ dataset: 'a', promptFile: 'f', prompts: 1, drafter: t, baseline: null }], context());
    const cur = buildReport(
      [{ dataset: 'a', promptFile: 'f', prompts: 1, drafter: t, baseline: null }],
      context({
        settings: { ...context().settings, concurrency: 4 },
        previous: { report: prev, file: '/p/eval.json' },
      }),
    );
    expect(cur.previous?.comparable).toBe(false);
    expect(cur.warnings.some((w) => w.includes('other settings'))).toBe(true);
  });

  it('specStatsOf: absent without spec_verify_ct, a reason for malformed fields', () => {
    expect(specStatsOf({ completion_tokens: 3 })).toBeUndefined();
    expect(specStatsOf({ spec_verify_ct: -1 })).toMatch(/spec_verify_ct/);
    expect(specStatsOf({ spec_verify_ct: 2, spec_correct_drafts_histogram: [1, 'x'] })).toMatch(/histogram/);
    expect(specStatsOf({ spec_verify_ct: 2 })).toEqual({
      verifySteps: 2,
      correctDrafts: undefined,
      proposedDrafts: undefined,
      histogram: undefined,
    });
  });

  it('parseReport reads back what buildReport wrote, and refuses anything else', () => {
    const t = totalsOf([{ completion: 10, meta: specMeta(10, 5, 5, 15, [5]) }], 1);
    const r = buildReport([{ dataset: 'a', promptFile: 'f', prompts: 1, drafter: t, baseline: null }], context());
    expect(parseReport(JSON.stringify(r), 'x.json')).toEqual(r);
    expect(parseReport('{', 'x.json')).toMatch(/^x\.json: not JSON/);
    expect(parseReport('{"version":99}', 'x.json')).toMatch(/not an eval report/);
  });
});
