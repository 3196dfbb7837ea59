import { describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { PayloadError, type Sample } from '../../src/shared/index.js';
import { processGenerateBatch, type GenerateBatchDeps } from '../../src/workers/inference/processor.js';
import type { SampleOutcome, SampleRequest } from '../../src/workers/inference/dispatcher.js';

const sample = (id: string): Sample => ({ id, line: 1, promptIds: [1, 2, 3], maxNewTokens: 16 });

function payload(ids: string[]): unknown {
  return { dataset: 'd', batchId: 'd:e0:1-2', sampling: { temperature: 0.6 }, maxAttempts: 3, priorExpectedTokens: 8, samples: ids.map(sample) };
}

function deps(done: Set<string>, outcome: (req: SampleRequest) => SampleOutcome, attempts: Record<string, number> = {}): GenerateBatchDeps & { submitted: SampleRequest[] } {
  const submitted: SampleRequest[] = [];
  return {
    submitted,
    isDone: (_ds, ids) => Promise.resolve(ids.map((i) => done.has(i))),
    attemptsSpent: (_ds, ids) => Promise.resolve(ids.map((i) => attempts[i] ?? 0)),
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
      req.sample.id === 'c' ? { kind: 'failed', reason: '400' } : req.sample.id === 'd' ? { kind: 'skipped-budget' } : { kind: 'committed', completionTokens: 10 },
    );
    const r = await processGenerateBatch(payload(['a', 'b', 'c', 'd', 'e']), d);
    expect(d.submitted.map((s) => s.sample.id)).toEqual(['a', 'c', 'd', 'e']);
    expect(r).toEqual({ committed: 2, duplicates: 0, alreadyDone: 1, failed: 1, skippedByBudget: 1, outputTokens: 20, handedBack: 0 });
  });

  it('passes the batch settings and the attempts already spent to each sample', async () => {
    const d = deps(new Set(), () => ({ kind: 'duplicate' }), { a: 2 });
    const r = await processGenerateBatch(payload(['a']), d);
    expect(d.submitted[0]).toMatchObject({ dataset: 'd', maxAttempts: 3, priorExpectedTokens: 8, attemptsSpent: 2, sampling: { temperature: 0.6 } });
    expect(r.duplicates).toBe(1);
  });

  it('reports samples handed back by a stopping worker', async () => {
    const r = await processGenerateBatch(payload(['a', 'b']), deps(new Set(), () => ({ kind: 'handed-back' })));
    expect(r.handedBack).toBe(2);
  });

  it('refuses a payload that does not match the catalog with a PayloadError naming the field', async () => {
    await expect(processGenerateBatch({ dataset: 'd', samples: [] }, deps(new Set(), () => ({ kind: 'duplicate' })))).rejects.toThrow(PayloadError);
    await expect(processGenerateBatch({ ...(payload(['a']) as object), maxAttempts: 0 }, deps(new Set(), () => ({ kind: 'duplicate' })))).rejects.toThrow(/maxAttempts/);
  });
});
