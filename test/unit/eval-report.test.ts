// The evaluation's arithmetic: token-weighted acceptance (a ratio of sums, not a mean of ratios),
// summed histograms, tokens/s and speed-up, deltas against the previous report, the warnings and
// the checks that fail.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  addAnswer,
  addFailure,
  buildReport,
  emptyTotals,
  formatReport,
  parseReport,
  simulatorOf,
  specStatsOf,
  type BaselineEndpointInfo,
  type DatasetTotals,
  type DrafterEndpointInfo,
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

/** A speculative endpoint; `simulator` as its /server_info announced it (null: SGLang). */
const drafterEndpoint = (simulator: DrafterEndpointInfo['simulator'], version = '0.5.4'): DrafterEndpointInfo => ({
  url: 'http://127.0.0.1:30001',
  version,
  modelPath: 'Qwen/Qwen3-8B',
  algorithm: 'EAGLE3',
  draftModelPath: '/x/train/0002/checkpoints/step-40',
  numSteps: 3,
  eagleTopk: 1,
  numDraftTokens: 4,
  simulator,
});
const baselineEndpoint = (simulator: BaselineEndpointInfo['simulator'], version = '0.5.4'): BaselineEndpointInfo => ({
  url: 'http://127.0.0.1:30002',
  version,
  modelPath: 'Qwen/Qwen3-8B',
  simulator,
});

/** /server_info of the simulator started with `--speculative-acceptance 2.4 --speculative-dataset code=3.1` (src/sim/announce.ts). */
const ANNOUNCED = {
  version: '0.5.4',
  model_path: 'Qwen/Qwen3-8B',
  speculative_algorithm: 'EAGLE3',
  tokenmill_simulator: {
    simulator: 'tokenmill sim',
    imitates: '0.5.4',
    note: 'a simulator of SGLang: its acceptance is the configured one below, not measured from the drafter; its speeds come from its load model',
    speculative: {
      algorithm: 'EAGLE3',
      num_steps: 3,
      block_size: null,
      acceptance: [0.58, 0.58, 0.58],
      mean_accept_length: 2.4,
      per_dataset: { code: { acceptance: [0.8, 0.8, 0.8], mean_accept_length: 3.1 } },
      draft_overhead: 0.25,
    },
  },
};

describe('where the figures come from', () => {
  const totals = (): DatasetTotals[] => [
    {
      dataset: 'code',
      promptFile: 'fc',
      prompts: 2,
      drafter: totalsOf([{ completion: 31, meta: specMeta(31, 10, 21, 30, [1, 2, 3, 4]) }], 1),
      baseline: totalsOf([{ completion: 31 }], 2),
    },
    {
      dataset: 'chat',
      promptFile: 'fh',
      prompts: 2,
      drafter: totalsOf([{ completion: 24, meta: specMeta(24, 10, 14, 30, [4, 3, 2, 1]) }], 1),
      baseline: totalsOf([{ completion: 24 }], 2),
    },
  ];

  it("simulatorOf: the simulator's announcement read; a real SGLang's /server_info (no announcement) is none", () => {
    expect(simulatorOf(ANNOUNCED)).toEqual({
      imitates: '0.5.4',
      meanAcceptLength: 2.4,
      acceptance: [0.58, 0.58, 0.58],
      perDataset: { code: 3.1 },
      draftOverhead: 0.25,
    });
    // SGLang 0.5.23's own /server_info (a real answer, 556 keys): no announcement among them.
    const real = JSON.parse(
      readFileSync(new URL('../fixtures/sglang/server_info-0.5.23-plain.json', import.meta.url), 'utf8'),
    ) as Record<string, unknown>;
    expect(real.version).toBe('0.5.23');
    expect(simulatorOf(real)).toBeNull();
    // A baseline simulator announces itself without speculation; an unreadable announcement still says "simulator".
    expect(
      simulatorOf({ tokenmill_simulator: { simulator: 'tokenmill sim', imitates: '0.5.4', speculative: null } }),
    ).toEqual({
      imitates: '0.5.4',
      meanAcceptLength: null,
      acceptance: null,
      perDataset: {},
      draftOverhead: null,
    });
    expect(simulatorOf({ tokenmill_simulator: 'yes' })).toMatchObject({ imitates: null, meanAcceptLength: null });
  });

  it('against the simulator: source simulator, the configured acceptance per dataset, SIMULATED in the table with a configured column', () => {
    const sim = simulatorOf(ANNOUNCED);
    const r = buildReport(
      totals(),
      context({
        endpoints: [drafterEndpoint(sim)],
        baseline: [baselineEndpoint(simulatorOf({ tokenmill_simulator: { imitates: '0.5.4', speculative: null } }))],
      }),
    );
    expect(r.source).toBe('simulator');
    expect(r.simulated).toEqual({
      endpoints: ['http://127.0.0.1:30001', 'http://127.0.0.1:30002'],
      acceptanceConfigured: true,
      meanAcceptLength: 2.4,
      datasets: { code: 3.1, chat: 2.4 },
      draftOverhead: 0.25,
      note:
        "SIMULATED: the acceptance is the simulator's configured one (accept len 2.40; code 3.10), not measured from the drafter; " +
        "its tok/s and the speed-up come from the simulator's load model (a verify step costs 1.25 decode steps)",
    });
    const text = formatReport(r);
    expect(text.split('\n').slice(1, 4)).toEqual([
      "  SIMULATED: the acceptance is the simulator's configured one (accept len 2.40; code 3.10), not",
      "             measured from the drafter; its tok/s and the speed-up come from the simulator's load",
      '             model (a verify step costs 1.25 decode steps)',
    ]);
    expect(text).toContain(
      '  drafter   http://127.0.0.1:30001: EAGLE3, 3 steps, topk 1, 4 draft tokens (tokenmill sim, imitating SGLang 0.5.4)\n',
    );
    expect(text).toContain(
      '  baseline  http://127.0.0.1:30002: no speculation (tokenmill sim, imitating SGLang 0.5.4)\n',
    );
    expect(text).toMatch(/^dataset +prompts +accept len +configured +accept rate +drafter tok\/s/m);
    expect(text).toMatch(/^code +2 +3\.10 +3\.10 +0\.700 /m);
    expect(text).toMatch(/^chat +2 +2\.40 +2\.40 +0\.467 /m);
    // Overall: no one configured figure when the datasets have their own.
    expect(text).toMatch(/^overall +4 +2\.75 +- +/m);
    expect(parseReport(JSON.stringify(r), 'x.json')).toEqual(r);
  });

  it('against SGLang: source sglang, no simulated figures, nothing SIMULATED in the table', () => {
    const r = buildReport(
      totals(),
      context({ endpoints: [drafterEndpoint(null, '0.5.23')], baseline: [baselineEndpoint(null, '0.5.23')] }),
    );
    expect(r.source).toBe('sglang');
    expect(r.simulated).toBeNull();
    const text = formatReport(r);
    expect(text).not.toMatch(/SIMULATED|configured|tokenmill sim/);
    expect(text).toContain('4 draft tokens (SGLang 0.5.23)\n');
    expect(text).toMatch(/^dataset +prompts +accept len +accept rate +drafter tok\/s/m);
  });

  it('a real drafter endpoint beside a simulated baseline: measured acceptance, a speed-up against the simulator', () => {
    const r = buildReport(
      totals(),
      context({
        endpoints: [drafterEndpoint(null, '0.5.23')],
        baseline: [baselineEndpoint(simulatorOf({ tokenmill_simulator: { imitates: '0.5.4' } }))],
      }),
    );
    expect(r.source).toBe('simulator');
    expect(r.simulated).toMatchObject({ acceptanceConfigured: false, meanAcceptLength: null, datasets: {} });
    expect(r.simulated?.note).toBe(
      "SIMULATED: the baseline is the simulator: its tok/s, and so the speed-up, come from the simulator's load model",
    );
    expect(formatReport(r)).not.toMatch(/configured/);
  });

  it('a simulated report and one measured on SGLang are not compared as like for like', () => {
    const sim = buildReport(
      totals(),
      context({ endpoints: [drafterEndpoint(simulatorOf(ANNOUNCED))], baseline: null }),
    );
    const real = buildReport(
      totals(),
      context({
        endpoints: [drafterEndpoint(null, '0.5.23')],
        baseline: null,
        previous: { report: sim, file: '/p/eval.json' },
      }),
    );
    expect(real.previous?.comparable).toBe(false);
    expect(real.warnings).toContain(
      'the previous report (/p/eval.json) was simulated, this one on SGLang: its deltas are not comparable',
    );
    // A report from before the source was recorded compares as before.
    const old: Partial<EvalReport> = { ...sim };
    delete old.source;
    delete old.simulated;
    const after = buildReport(
      totals(),
      context({
        endpoints: [drafterEndpoint(null)],
        baseline: null,
        previous: { report: old as EvalReport, file: '/p/eval.json' },
      }),
    );
    expect(after.previous?.comparable).toBe(true);
  });
});
