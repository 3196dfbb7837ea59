// The eval lines of `status` and the eval phase's detail, from the latest eval job and report:
// what is under way wins over an older report, a job that failed before measuring says why, and
// a change that rounds to zero is +0.00.
import { describe, expect, it } from 'vitest';
import {
  evalPhaseDetail,
  evalPointOf,
  formatEvalStatus,
  type EvalJobStatus,
  type EvalReportView,
  type EvalStatus,
} from '../../src/shared/index.js';

const section = (acceptLength: number, speedup: number, delta: EvalReportView['overall']['delta'] = null) => ({
  prompts: 4,
  drafter: { acceptLength, acceptRate: 0.5, tokensPerSec: 200 * speedup, failures: 0, requests: 4 },
  baseline: { tokensPerSec: 200, failures: 0, requests: 4 },
  speedup,
  delta,
});

const report = (attempt: string, extra: Partial<EvalReportView> = {}): EvalReportView & Record<string, unknown> => ({
  version: 1,
  run: 'r',
  attempt,
  drafter: `/out/r/train/${attempt}/checkpoints/step-9`,
  measuredAt: '2026-12-02T06:00:00.000Z',
  datasets: [
    { dataset: 'code', ...section(3.1, 2.2) },
    { dataset: 'chat', ...section(2.4, 1.7) },
  ],
  overall: section(2.7, 1.9, { acceptLength: -0.0004, acceptLengthChange: -0.0001, speedup: 0.051 }),
  previous: { attempt: '0001', comparable: true },
  warnings: [],
  failed: [],
  ok: true,
  ...extra,
});

const job = (state: EvalJobStatus['state'], extra: Partial<EvalJobStatus> = {}): EvalJobStatus => ({
  jobId: 'r-train-2-eval',
  state,
  attempt: '0002',
  drafter: null,
  detail: null,
  waiting: null,
  reason: null,
  servers: [],
  updatedAt: null,
  ...extra,
});

const status = (j: EvalJobStatus | null, r: (EvalReportView & Record<string, unknown>) | null): EvalStatus => ({
  job: j,
  attempts: r === null ? [] : [evalPointOf(r)],
  report: r,
});

describe('the eval status', () => {
  it('nothing before any eval', () => {
    expect(formatEvalStatus(null)).toEqual([]);
    expect(evalPhaseDetail(null)).toBe('');
  });

  it("a report: a line per dataset and overall, the change rounded to zero as +0.00, the report's figures in the phase", () => {
    const s = status(job('completed', { detail: 'accept len 2.70, speed-up 1.90x' }), report('0002'));
    expect(formatEvalStatus(s)).toEqual([
      'eval r-train-2-eval: completed, attempt 0002 — accept len 2.70, speed-up 1.90x',
      'eval of attempt 0002: passed (measured 2026-12-02T06:00:00.000Z, changes since attempt 0001)',
      '  code     accept len 3.10, speed-up 2.20x',
      '  chat     accept len 2.40, speed-up 1.70x',
      '  overall  accept len 2.70 (+0.00), speed-up 1.90x (+0.05)',
    ]);
    expect(evalPhaseDetail(s)).toBe('attempt 0002: accept len 2.70 (+0.00), speed-up 1.90x (+0.05)');
  });

  it('a job under way, or one that failed before measuring, is what the phase says; the older report stays listed', () => {
    const waiting = status(
      job('waiting', { waiting: 'eval servers: 2 GPU(s) needed; this worker has 1 GPU(s)' }),
      report('0001'),
    );
    expect(evalPhaseDetail(waiting)).toBe(
      'waiting, attempt 0002 — eval servers: 2 GPU(s) needed; this worker has 1 GPU(s)',
    );
    const failed = status(
      job('failed', { reason: 'eval: the drafter server (eval.server.command: sglang) exited (exit code 1)' }),
      report('0001'),
    );
    expect(evalPhaseDetail(failed)).toBe(
      'failed, attempt 0002 — eval: the drafter server (eval.server.command: sglang) exited (exit code 1)',
    );
    expect(formatEvalStatus(failed)[1]).toBe(
      'eval of attempt 0001: passed (measured 2026-12-02T06:00:00.000Z, changes since attempt 0001)',
    );
    // A skipped job (no new attempt) leaves the latest report's figures in the phase.
    expect(evalPhaseDetail(status(job('skipped', { attempt: null }), report('0001')))).toMatch(/^attempt 0001: /);
  });

  it('a failed verdict: FAILED in the phase, and the warnings and failed checks in words', () => {
    const r = report('0003', {
      ok: false,
      warnings: ['dataset chat: the drafter makes decoding slower: 160.0 vs 200.0 tok/s (speed-up 0.80x)'],
      failed: [{ check: 'minSpeedup', message: 'speed-up 0.90x (180.0 vs 200.0 tok/s) is below eval.minSpeedup 1.1' }],
    });
    const s = status(job('failed', { attempt: '0003', reason: 'below' }), r);
    expect(evalPhaseDetail(s)).toBe(
      'attempt 0003: accept len 2.70 (+0.00), speed-up 1.90x (+0.05), 1 warning, FAILED: speed-up 0.90x (180.0 vs 200.0 tok/s) is below eval.minSpeedup 1.1',
    );
    expect(formatEvalStatus(s).slice(-2)).toEqual([
      '  WARNING: dataset chat: the drafter makes decoding slower: 160.0 vs 200.0 tok/s (speed-up 0.80x)',
      '  FAILED: speed-up 0.90x (180.0 vs 200.0 tok/s) is below eval.minSpeedup 1.1',
    ]);
    expect(formatEvalStatus(s)[1]).toMatch(/^eval of attempt 0003: FAILED /);
  });

  it('a simulated report says so: in its status lines with the configured acceptance, in the phase, in its point', () => {
    const note =
      "SIMULATED: the acceptance is the simulator's configured one (accept len 2.60; code 3.10), not measured from the drafter; " +
      "its tok/s and the speed-up come from the simulator's load model (a verify step costs 1.25 decode steps)";
    const r = report('0002', {
      source: 'simulator',
      simulated: { acceptanceConfigured: true, meanAcceptLength: 2.6, datasets: { code: 3.1, chat: 2.6 }, note },
    });
    const s = status(null, r);
    expect(formatEvalStatus(s)).toEqual([
      'eval of attempt 0002: passed (simulated 2026-12-02T06:00:00.000Z, changes since attempt 0001)',
      `  ${note}`,
      '  code     accept len 3.10, speed-up 2.20x, configured 3.10',
      '  chat     accept len 2.40, speed-up 1.70x, configured 2.60',
      '  overall  accept len 2.70 (+0.00), speed-up 1.90x (+0.05)',
    ]);
    expect(evalPhaseDetail(s)).toBe('attempt 0002 (SIMULATED): accept len 2.70 (+0.00), speed-up 1.90x (+0.05)');
    expect(evalPointOf(r).source).toBe('simulator');
  });

  it('measured on SGLang, or from before the source was recorded: no word of simulation', () => {
    for (const r of [report('0002', { source: 'sglang', simulated: null }), report('0002')]) {
      const lines = formatEvalStatus(status(null, r));
      expect(lines[0]).toMatch(/^eval of attempt 0002: passed \(measured /);
      expect(lines.join('\n')).not.toMatch(/SIMULATED|simulated|configured/);
      expect(evalPhaseDetail(status(null, r))).toMatch(/^attempt 0002: accept len/);
    }
    expect(evalPointOf(report('0002', { source: 'sglang' })).source).toBe('sglang');
    expect(evalPointOf(report('0002')).source).toBeNull();
  });
});
