import { describe, expect, it } from 'vitest';
import type { Job } from 'bullmq';
import { pino } from 'pino';
import type { BatchProgress } from '../../src/shared/index.js';
import { BatchReporter } from '../../src/workers/inference/batch-report.js';

/** Records what the reporter asks of a job, with the time of each call. */
function recordingJob(): { job: Job; progress: { atMs: number; p: BatchProgress }[]; logs: string[] } {
  const progress: { atMs: number; p: BatchProgress }[] = [];
  const logs: string[] = [];
  const job = {
    id: 'j1',
    updateProgress: (p: BatchProgress) => {
      progress.push({ atMs: Date.now(), p });
      return Promise.resolve();
    },
    log: (line: string) => {
      logs.push(line);
      return Promise.resolve(logs.length);
    },
  } as unknown as Job;
  return { job, progress, logs };
}

const p = (committed: number): BatchProgress => ({ committed, failed: 0, skipped: 0, size: 100 });

describe('BatchReporter', () => {
  it('sends progress at most once per interval, always the newest counts, and the last on flush', async () => {
    const r = recordingJob();
    const reporter = new BatchReporter(r.job, pino({ level: 'silent' }), 100);
    const started = Date.now();
    for (let i = 1; i <= 50; i += 1) {
      reporter.progress(p(i));
      await new Promise((res) => setTimeout(res, 5));
    }
    await reporter.flush();
    const elapsed = Date.now() - started;
    // About one per 100 ms from the start, then the flush.
    expect(r.progress.length).toBeLessThanOrEqual(Math.ceil(elapsed / 100) + 2);
    expect(r.progress.length).toBeGreaterThanOrEqual(2);
    for (let i = 1; i < r.progress.length - 1; i += 1)
      expect((r.progress[i]?.atMs ?? 0) - (r.progress[i - 1]?.atMs ?? 0)).toBeGreaterThanOrEqual(95);
    expect(r.progress.at(-1)?.p).toEqual(p(50));
  });

  it('a batch done within the interval sends its final counts only', async () => {
    const r = recordingJob();
    const reporter = new BatchReporter(r.job, pino({ level: 'silent' }), 1_000);
    for (let i = 1; i <= 64; i += 1) reporter.progress(p(i));
    await reporter.flush();
    expect(r.progress.map((x) => x.p)).toEqual([p(64)]);
  });

  it('writes log lines in order and nothing once closed (the batch was lost to another worker)', async () => {
    const r = recordingJob();
    const reporter = new BatchReporter(r.job, pino({ level: 'silent' }), 1_000);
    reporter.line('a');
    reporter.line('b');
    reporter.close();
    reporter.line('c');
    reporter.progress(p(1));
    await reporter.flush();
    expect(r.logs).toEqual(['a', 'b']);
    expect(r.progress).toEqual([]);
  });
});
