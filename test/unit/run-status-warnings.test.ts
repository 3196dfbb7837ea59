// How `status` and the progress line say that a run is not moving: a stalled dataset, no healthy
// endpoint, no inference worker reporting — and nothing extra when all is well.
import { describe, expect, it } from 'vitest';
import { formatProgressLine } from '../../src/cli/progress.js';
import {
  formatRunStatus,
  runStatusWarnings,
  type DatasetStatus,
  type EndpointHealthSummary,
  type RunStatus,
} from '../../src/shared/index.js';

const NOW = 1_700_000_000_000;
const URL = 'http://gpu-1:30000';

function dataset(o: Partial<DatasetStatus> = {}): DatasetStatus {
  return {
    name: 'B1_glaive',
    records: 146,
    outputTokens: 5_000,
    tokenBudget: 100_000,
    inFlight: 0,
    failed: 0,
    skipped: 0,
    rejected: 0,
    tokensPerSec: 0,
    etaSeconds: { low: null, high: null },
    status: 'in_progress',
    paused: false,
    jobs: {},
    stalled: null,
    ...o,
  };
}

function endpoints(up: boolean | null, reason: string | null = null): EndpointHealthSummary {
  return {
    total: 1,
    healthy: up === true ? 1 : 0,
    reported: up === null ? 0 : 1,
    endpoints: [{ url: URL, up, reason, sinceMs: up === null ? null : NOW - 1_000, workers: up === null ? 0 : 1 }],
  };
}

function status(d: DatasetStatus, e: EndpointHealthSummary): RunStatus {
  return {
    run: 'r',
    phases: [{ name: 'generate', status: 'in_progress', configured: true, detail: '' }],
    datasets: [d],
    endpoints: e,
    endpointRequests: [],
    workers: [],
  };
}

const stalled = {
  sinceMs: NOW - 125_000,
  reason: '3 batch job(s) pending (0 waiting, 3 active), 0 requests in flight, 1/1 endpoints healthy',
};

describe('status warnings', () => {
  it('a stalled dataset gets a warning line in the table and in the progress line; its status stays in_progress', () => {
    const s = status(dataset({ stalled }), endpoints(true));
    const table = formatRunStatus(s, NOW);
    expect(table).toMatch(/B1_glaive\s+in_progress/);
    expect(table.split('\n').at(-1)).toBe(
      `! B1_glaive stalled for 2m: ${stalled.reason} — a bug; see the producer's log`,
    );
    expect(table).toMatch(/^endpoints: 1\/1 endpoints healthy$/m);
    expect(formatProgressLine(s, 600, NOW)).toBe(
      `[600s] generate: 0/1 datasets completed, 5,000 tokens, 0 in flight, 0 tok/s, ETA unknown, endpoints 1/1 healthy; STALLED: B1_glaive for 125s (${stalled.reason}; a bug, see the log)`,
    );
  });

  it('no healthy endpoint: "waiting: 0/1 endpoints healthy" with the reason', () => {
    const s = status(dataset(), endpoints(false, 'connect ECONNREFUSED 10.0.0.1:30000'));
    expect(runStatusWarnings(s, NOW)).toEqual([
      `waiting: 0/1 endpoints healthy (${URL}: connect ECONNREFUSED 10.0.0.1:30000)`,
    ]);
    expect(formatProgressLine(s, 5, NOW)).toMatch(
      /; waiting: 0\/1 endpoints healthy \(http:\/\/gpu-1:30000: connect ECONNREFUSED/,
    );
  });

  it('no inference worker reporting: status says so; the progress line does not guess', () => {
    const s = status(dataset(), endpoints(null));
    expect(runStatusWarnings(s, NOW)).toEqual(['waiting: 0/1 endpoints healthy (no inference worker reporting)']);
    expect(formatRunStatus(s, NOW)).not.toMatch(/^endpoints:/m);
    expect(formatProgressLine(s, 5, NOW)).not.toMatch(/waiting|STALLED/);
  });

  it('all well, or the dataset completed: no warning', () => {
    expect(runStatusWarnings(status(dataset({ inFlight: 16, tokensPerSec: 900 }), endpoints(true)), NOW)).toEqual([]);
    expect(runStatusWarnings(status(dataset({ status: 'completed' }), endpoints(false, 'down')), NOW)).toEqual([]);
    expect(formatProgressLine(status(dataset({ inFlight: 16, tokensPerSec: 900 }), endpoints(true)), 5, NOW)).toBe(
      '[5s] generate: 0/1 datasets completed, 5,000 tokens, 16 in flight, 900 tok/s, ETA unknown, endpoints 1/1 healthy',
    );
    // With a known ETA per dataset, the line shows the range of the slowest one.
    expect(
      formatProgressLine(
        status(dataset({ inFlight: 16, tokensPerSec: 900, etaSeconds: { low: 100, high: 300 } }), endpoints(true)),
        5,
        NOW,
      ),
    ).toBe(
      '[5s] generate: 0/1 datasets completed, 5,000 tokens, 16 in flight, 900 tok/s, ETA 2m–5m, endpoints 1/1 healthy',
    );
  });

  // A paused dataset used to make `run` print "0 in flight, 0 tok/s" with no word of why.
  it('a paused dataset: the progress line says so, with the command that resumes it', () => {
    const s = status(dataset({ status: 'paused', paused: true }), endpoints(true));
    const line = formatProgressLine(s, 40, NOW, '/runs/my run.yaml');
    expect(line).toContain("; paused: B1_glaive (resume with `tokenmill resume -c '/runs/my run.yaml' B1_glaive`)");
    expect(line).not.toContain('ETA');
    expect(formatProgressLine(s, 40, NOW, 'tokenmill.yaml')).toContain(
      '`tokenmill resume -c tokenmill.yaml B1_glaive`',
    );
  });
});
