import { describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { PayloadError, encodeBatchPayload, type Sample } from '../../src/shared/index.js';
import { processGenerateBatch, type GenerateBatchDeps } from '../../src/workers/inference/processor.js';
import type { SampleOutcome, SampleRequest } from '../../src/workers/inference/dispatcher.js';
import type { FailureRecord } from '../../src/workers/inference/failure-records.js';

const sample = (id: string): Sample => ({ id, line: 1, promptIds: [1, 2, 3], maxNewTokens: 16 });

function payload(ids: string[]): unknown {
  return {
    dataset: 'd',
    batchId: 'd:e0:1-2',
    sampling: { temperature: 0.6 },
    maxAttempts: 3,
    priorExpectedTokens: 8,
    samples: ids.map(sample),
  };
}

function deps(
  done: Set<string>,
  outcome: (req: SampleRequest) => SampleOutcome,
  attempts: Record<string, number> = {},
  failed: Record<string, FailureRecord> = {},
  claims: Record<string, number> = {},
): GenerateBatchDeps & { submitted: SampleRequest[]; released: string[]; logLines: string[] } {
  const submitted: SampleRequest[] = [];
  const released: string[] = [];
  const logLines: string[] = [];
  return {
    submitted,
    released,
    logLines,
    jobId: 'job-1',
    isDone: (_ds, ids) => Promise.resolve(ids.map((i) => done.has(i))),
    attemptsSpent: (_ds, ids) => Promise.resolve(ids.map((i) => attempts[i] ?? 0)),
    failures: (_ds, ids) => Promise.resolve(ids.map((i) => failed[i])),
    claimFailed: (_ds, ids) => Promise.resolve(ids.map((i) => claims[i] ?? -1)),
    releaseClaims: (_ds, ids) => {
      released.push(...ids);
      return Promise.resolve();
    },
    log: (line) => logLines.push(line),
    submit: (req) => {
      submitted.push(req);
      return Promise.resolve(outcome(req));
    },
    logger: pino({ level: 'silent' }),
  };
}

describe('processGenerateBatch', () => {
  it('never sends samples already committed, and counts each outcome', async () => {
    const d = deps(new Set(['b']), (req) =>
      req.sample.id === 'c'
        ? { kind: 'failed', reason: '400' }
        : req.sample.id === 'd'
          ? { kind: 'skipped-budget' }
          : { kind: 'committed', completionTokens: 10 },
    );
    const r = await processGenerateBatch(payload(['a', 'b', 'c', 'd', 'e']), d);
    expect(d.submitted.map((s) => s.sample.id)).toEqual(['a', 'c', 'd', 'e']);
    expect(r).toMatchObject({
      committed: 2,
      duplicates: 0,
      alreadyDone: 1,
      failed: 1,
      skippedByBudget: 1,
      outputTokens: 20,
      handedBack: 0,
    });
  });

  it('passes the batch settings and the attempts already spent to each sample', async () => {
    const d = deps(new Set(), () => ({ kind: 'duplicate' }), { a: 2 });
    const r = await processGenerateBatch(payload(['a']), d);
    expect(d.submitted[0]).toMatchObject({
      dataset: 'd',
      maxAttempts: 3,
      priorExpectedTokens: 8,
      attemptsSpent: 2,
      sampling: { temperature: 0.6 },
    });
    expect(r.duplicates).toBe(1);
  });

  it('reports samples handed back by a stopping worker', async () => {
    const r = await processGenerateBatch(
      payload(['a', 'b']),
      deps(new Set(), () => ({ kind: 'handed-back' })),
    );
    expect(r.handedBack).toBe(2);
  });

  it('a first delivery never re-sends a prompt that has a failure record; the job carries the failures that name it', async () => {
    const failed = { b: { reason: 'HTTP 500', status: 500, attempts: 3, job: 'job-1' } };
    const d = deps(
      new Set(),
      (req) =>
        req.sample.id === 'c'
          ? { kind: 'failed', reason: 'boom', status: 500, attempts: 3 }
          : { kind: 'committed', completionTokens: 5 },
      {},
      failed,
    );
    const r = await processGenerateBatch(payload(['a', 'b', 'c']), d);
    expect(d.submitted.map((s) => s.sample.id)).toEqual(['a', 'c']);
    expect(d.submitted.every((s) => s.jobId === 'job-1')).toBe(true);
    expect(r.failed).toBe(2);
    // Only b's record names the job in this fake (c's failure is recorded by the dispatcher, not here).
    expect(r.failures.map((f) => f.sample.id)).toEqual(['b']);
    expect(d.logLines.some((l) => l.includes('line 1 (id c): failed (HTTP 500) after 3 attempt(s): boom'))).toBe(true);
  });

  it('a retried failed job sends only the prompts it claimed, with the attempts read after the claim', async () => {
    const d = deps(
      new Set(['a']),
      (req) => (req.sample.id === 'd' ? { kind: 'skipped-budget' } : { kind: 'committed', completionTokens: 7 }),
      { b: 0 },
      {},
      { b: 1, c: -2, d: 1, e: 0 },
    );
    const r = await processGenerateBatch({ ...(payload(['a', 'b', 'c', 'd', 'e']) as object), retryOfFailed: true }, d);
    expect(d.submitted.map((s) => s.sample.id)).toEqual(['b', 'd']);
    expect(r).toMatchObject({ committed: 1, alreadyDone: 2, skippedByBudget: 1, failed: 0 });
    // d ended skipped: its claim is released, so it counts as skipped, not failed.
    expect(d.released).toEqual(['d']);
    expect(d.logLines.filter((l) => l.includes('sent again with fresh attempts'))).toHaveLength(2);
  });

  it('reads the compact payload the producer writes (token ids base64, last)', async () => {
    const p = encodeBatchPayload(
      { dataset: 'd', batchId: 'd:e0:1-2', sampling: {}, maxAttempts: 2, priorExpectedTokens: 8 },
      [{ id: 'x', line: 3, promptIds: [0, 1, 151_643, 4_294_967_295], maxNewTokens: 16 }],
    );
    expect(Object.keys(p)[0]).toBe('dataset');
    expect(Object.keys(p).at(-1)).toBe('prompts');
    expect(p.samples[0]).toEqual({ id: 'x', line: 3, maxNewTokens: 16 });
    const d = deps(new Set(), () => ({ kind: 'committed', completionTokens: 1 }));
    await processGenerateBatch(JSON.parse(JSON.stringify(p)), d);
    expect(d.submitted[0]?.sample.promptIds).toEqual([0, 1, 151_643, 4_294_967_295]);
  });

  it('refuses a payload that does not match the catalog with a PayloadError naming the field', async () => {
    await expect(
      processGenerateBatch(
        { dataset: 'd', samples: [] },
        deps(new Set(), () => ({ kind: 'duplicate' })),
      ),
    ).rejects.toThrow(PayloadError);
    await expect(
      processGenerateBatch(
        { ...(payload(['a']) as object), maxAttempts: 0 },
        deps(new Set(), () => ({ kind: 'duplicate' })),
      ),
    ).rejects.toThrow(/maxAttempts/);
  });
});
