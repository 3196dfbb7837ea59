// The post-process summary's account of what was left out: the headline of a round that merged
// nothing says why, each dataset's drops come with what to do, and a large share gets a warning.
import { describe, expect, it } from 'vitest';
import { formatPostprocessResult } from '../../src/cli/commands/postprocess.js';
import type { MergeJobResult, TokenizeResult } from '../../src/shared/index.js';
import { datasetDrops, LARGE_DROP_FRACTION } from '../../src/cli/drop-summary.js';

function result(dataset: string, counts: Partial<TokenizeResult>): TokenizeResult {
  return {
    dataset,
    kind: 'generations',
    stagedDir: `/nowhere/${dataset}`,
    lines: 0,
    rows: 0,
    tokens: 0,
    supervisedTokens: 0,
    alreadyMerged: 0,
    keptTruncated: 0,
    stopWithoutEndOfTurn: 0,
    droppedTruncated: 0,
    droppedAborted: 0,
    droppedEmpty: 0,
    droppedUnsupervised: 0,
    duplicates: 0,
    invalid: 0,
    invalidExamples: [],
    durationMs: 1,
    ...counts,
  };
}

function nothingNew(...datasets: TokenizeResult[]): MergeJobResult {
  return { flowId: 'r-pp-2', status: 'nothing-new', datasets, report: null };
}

describe('post-process summary of dropped records', () => {
  it('every record truncated: "nothing merged", the count, the reason and what to do — not "already holds every row"', () => {
    const text = formatPostprocessResult(nothingNew(result('B1', { lines: 200_000, droppedTruncated: 200_000 })), {
      maxNewTokens: () => 10240,
    });
    expect(text).not.toContain('already holds every row');
    expect(text).toContain(
      'post-processing r-pp-2: nothing merged: 200,000 of 200,000 records were dropped (200,000 finish_reason length (cut at maxNewTokens))',
    );
    expect(text).toContain(
      '  B1: 200,000 of 200,000 records (100.0%) — 200,000 dropped: finish_reason length (cut at maxNewTokens) — raise maxNewTokens of dataset B1 (now 10240) or set postprocess.keepTruncated: true',
    );
    expect(text).toContain('warning: B1: 100.0% of its records were dropped (more than 20.0%)');
  });

  it('a round where every record is already merged still says so, with no drop section', () => {
    const text = formatPostprocessResult(nothingNew(result('B1', { lines: 50, alreadyMerged: 50 })));
    expect(text).toContain('nothing new: the training dataset already holds every row');
    expect(text).not.toContain('dropped\n');
    expect(text).not.toContain('warning');
  });

  it('already merged and dropped: both counted; no records at all: says so', () => {
    const text = formatPostprocessResult(
      nothingNew(
        result('A', { lines: 10, alreadyMerged: 7, droppedAborted: 3 }),
        result('B', { lines: 5, alreadyMerged: 5 }),
      ),
    );
    expect(text).toContain(
      'nothing new: 12 rows are already in the training dataset and 3 records were dropped (3 finish_reason abort',
    );
    expect(text).toContain(
      '  A: 3 of 10 records (30.0%) — 3 dropped: finish_reason abort (partial outputs: stopped at the budget by budget: strict, or aborted by the server) — set postprocess.keepTruncated: true to keep them like truncated ones; for aborts by the server, see its log',
    );
    expect(formatPostprocessResult(nothingNew(result('A', {})))).toContain(
      'nothing to merge: no dataset has records on disk yet',
    );
  });

  it('warns above the threshold only, naming each reason, largest first', () => {
    expect(LARGE_DROP_FRACTION).toBe(0.2);
    expect(datasetDrops(result('A', { lines: 100, rows: 80, droppedTruncated: 20 })).large).toBe(false);
    const d = datasetDrops(
      result('A', {
        lines: 100,
        rows: 79,
        droppedEmpty: 1,
        droppedTruncated: 15,
        invalid: 5,
        invalidExamples: [{ file: 'g/part-1.jsonl', line: 4, reason: 'bad json' }],
      }),
    );
    expect(d).toMatchObject({ total: 21, large: true });
    expect(d.byReason.map((c) => c.reason)).toEqual(['truncated', 'invalid', 'empty']);
    expect(d.byReason[1]?.fix).toBe('first: g/part-1.jsonl:4: bad json');
  });
});
