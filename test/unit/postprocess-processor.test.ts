import { describe, expect, it } from 'vitest';
import {
  DatasetMergeError,
  MERGE_QUEUE,
  MergePayloadSchema,
  PayloadError,
  TOKENIZE_QUEUE,
  TokenizePayloadSchema,
  createRootLogger,
  type MergeJobResult,
  type MergeOptions,
  type MergeReport,
  type TokenizeResult,
} from '../../src/shared/index.js';
import {
  invalidLinesError,
  processMerge,
  processTokenize,
  type MergeDeps,
  type TokenizeDeps,
} from '../../src/workers/postprocess/processor.js';
import {
  buildRoundFlow,
  roundFlowId,
  stagedDirOf,
  tokenizeJobId,
  type PostprocessPlan,
} from '../../src/workers/postprocess/flow.js';
import { formatPostprocessResult } from '../../src/cli/commands/postprocess.js';

const log = createRootLogger({ level: 'silent' });

/** Staged folders that do not exist: the processors under test never read them. */
const NOWHERE = '/nonexistent/tokenmill-unit';

function tokenizeResult(dataset: string, rows: number, extra: Partial<TokenizeResult> = {}): TokenizeResult {
  return {
    dataset,
    kind: 'generations',
    stagedDir: `${NOWHERE}/pp/${dataset}`,
    lines: rows + 1,
    rows,
    tokens: rows * 100,
    supervisedTokens: rows * 60,
    alreadyMerged: 0,
    keptTruncated: 0,
    stopWithoutEndOfTurn: 0,
    droppedTruncated: 1,
    droppedAborted: 0,
    droppedEmpty: 0,
    droppedUnsupervised: 0,
    duplicates: 0,
    invalid: 0,
    invalidExamples: [],
    durationMs: 5,
    ...extra,
  };
}

const mergePayload = {
  flowId: 'r-pp-3',
  target: `${NOWHERE}/target`,
  runDir: `${NOWHERE}/run`,
  shardSizeMiB: 64,
  mergeKey: 'r-pp-3/abcd1234',
};

function report(overrides: Partial<MergeReport> = {}): MergeReport {
  return {
    ok: true,
    mergeId: 'm1',
    target: mergePayload.target,
    createdAt: '2026-01-01T00:00:00.000Z',
    firstMerge: false,
    oldRows: 10,
    newRows: 5,
    rows: 15,
    oldTokens: 1000,
    newTokens: 500,
    tokens: 1500,
    oldSupervisedTokens: 600,
    newSupervisedTokens: 300,
    supervisedTokens: 900,
    lossMaskCoverage: 0.6,
    newLossMaskCoverage: 0.6,
    shards: 3,
    newShards: ['data-00002-of-00003.arrow'],
    linkedShards: 2,
    copiedShards: 0,
    columns: 'id: string',
    droppedColumns: [],
    checkedSamples: 5,
    samples: [],
    problems: [],
    warnings: [],
    environment: { node: 'v20', platform: 'linux-x64', host: 'h', pid: 1 },
    durationMs: 10,
    ...overrides,
  };
}

interface Recorder {
  phases: string[];
  completed: MergeJobResult[];
  merges: MergeOptions[];
}

function mergeDeps(children: unknown[], merge?: MergeDeps['merge']): { deps: MergeDeps; rec: Recorder } {
  const rec: Recorder = { phases: [], completed: [], merges: [] };
  const deps: MergeDeps = {
    childResults: () => Promise.resolve(children),
    setPhase: (phase, state) => {
      rec.phases.push(`${phase}:${state}`);
      return Promise.resolve();
    },
    roundCompleted: (r) => {
      rec.completed.push(r);
      return Promise.resolve();
    },
    logger: log,
  };
  if (merge !== undefined) {
    deps.merge = (opts) => {
      rec.merges.push(opts);
      return merge(opts);
    };
  }
  return { deps, rec };
}

describe('tokenize processor', () => {
  it('refuses a payload that does not match its schema before touching anything', async () => {
    const calls: string[] = [];
    const deps: TokenizeDeps = {
      tokenizeContext: () => {
        calls.push('context');
        return Promise.reject(new Error('not reached'));
      },
      setPhase: () => {
        calls.push('phase');
        return Promise.resolve();
      },
      logger: log,
    };
    await expect(processTokenize({ dataset: 'A', kind: 'pictures' }, deps)).rejects.toThrow(PayloadError);
    await expect(processTokenize({ dataset: 'A', kind: 'pictures' }, deps)).rejects.toThrow(
      /tokenize: invalid payload at/,
    );
    expect(calls).toEqual([]);
  });

  it('fails a source by its share of invalid lines, naming the first ones', () => {
    const examples = [
      { file: '/r/A/generations/part-00000.jsonl', line: 3, reason: 'invalid JSON: Unexpected token' },
      { file: '/r/A/generations/part-00000.jsonl', line: 9, reason: 'prompt_ids[0] is -1' },
    ];
    expect(invalidLinesError('A', { lines: 100, invalid: 0, invalidExamples: [] }, 0)).toBeUndefined();
    const none = invalidLinesError('A', { lines: 100, invalid: 2, invalidExamples: examples }, 0);
    expect(none).toBeInstanceOf(PayloadError);
    expect(none?.message).toContain('dataset A: 2 of 100 lines are invalid (none allowed)');
    expect(none?.message).toContain('/r/A/generations/part-00000.jsonl:3: invalid JSON');
    expect(none?.message).toContain(':9: prompt_ids[0] is -1');
    expect(invalidLinesError('C', { lines: 100, invalid: 5, invalidExamples: examples }, 0.05)).toBeUndefined();
    expect(invalidLinesError('C', { lines: 100, invalid: 6, invalidExamples: examples }, 0.05)?.message).toContain(
      'at most 5% allowed',
    );
  });
});

describe('merge processor', () => {
  it('refuses a bad payload, and a child result that is not a tokenize result', async () => {
    const { deps } = mergeDeps([]);
    await expect(processMerge({ ...mergePayload, mergeKey: '' }, deps)).rejects.toThrow(
      /merge: invalid payload at mergeKey/,
    );
    const bad = mergeDeps([tokenizeResult('A', 2), { dataset: 'B', rows: 'many' }]);
    await expect(processMerge(mergePayload, bad.deps)).rejects.toThrow(/result of tokenize job 2: invalid payload/);
    expect(bad.rec.completed).toEqual([]);
  });

  it('merges nothing when no dataset has new rows, and still completes the round', async () => {
    const { deps, rec } = mergeDeps([tokenizeResult('B', 0, { alreadyMerged: 7 }), tokenizeResult('A', 0)], () =>
      Promise.reject(new Error('must not merge')),
    );
    const result = await processMerge(mergePayload, deps);
    expect(result.status).toBe('nothing-new');
    expect(result.report).toBeNull();
    expect(result.datasets.map((d) => d.dataset)).toEqual(['A', 'B']);
    expect(rec.merges).toEqual([]);
    expect(rec.phases).toEqual(['tokenize:completed', 'merge:in_progress', 'merge:completed']);
    expect(rec.completed).toEqual([result]);
  });

  it('makes one merge of the datasets with new rows, keyed by the round, and returns the report in brief', async () => {
    const { deps, rec } = mergeDeps([tokenizeResult('B', 3), tokenizeResult('A', 2), tokenizeResult('C', 0)], () =>
      Promise.resolve({
        report: report(),
        reportPath: `${NOWHERE}/run/merge-report-m1.json`,
        repaired: [],
        alreadyMerged: false,
      }),
    );
    const result = await processMerge(mergePayload, deps);
    expect(rec.merges).toHaveLength(1);
    const opts = rec.merges[0];
    expect(opts?.mergeKey).toBe('r-pp-3/abcd1234');
    expect(opts?.target).toBe(mergePayload.target);
    expect(opts?.runDir).toBe(mergePayload.runDir);
    expect(opts?.shardSizeMiB).toBe(64);
    expect(result.status).toBe('merged');
    expect(result.report).toMatchObject({
      oldRows: 10,
      newRows: 5,
      rows: 15,
      shards: 3,
      newShards: 1,
      lossMaskCoverage: 0.6,
      reportPath: `${NOWHERE}/run/merge-report-m1.json`,
    });
    expect(rec.phases).toEqual(['tokenize:completed', 'merge:in_progress', 'merge:completed']);
    expect(rec.completed).toHaveLength(1);
  });

  it('reports a merge that an earlier attempt made as already merged', async () => {
    const { deps } = mergeDeps([tokenizeResult('A', 2)], () =>
      Promise.resolve({ report: report(), reportPath: 'p', repaired: [], alreadyMerged: true }),
    );
    expect((await processMerge(mergePayload, deps)).status).toBe('already-merged');
  });

  it('fails without completing the round when the merge is refused; other errors name the round', async () => {
    const refused = mergeDeps([tokenizeResult('A', 2)], () =>
      Promise.reject(new DatasetMergeError('merge refused, the target is unchanged: x')),
    );
    await expect(processMerge(mergePayload, refused.deps)).rejects.toThrow(/merge refused/);
    expect(refused.rec.completed).toEqual([]);
    expect(refused.rec.phases).not.toContain('merge:completed');
    const broken = mergeDeps([tokenizeResult('A', 2)], () => Promise.reject(new Error('ENOENT: no such file')));
    const err: unknown = await processMerge(mergePayload, broken.deps).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toBe('merge of r-pp-3 failed: ENOENT: no such file');
  });
});

describe('post-process round flow', () => {
  const plan: PostprocessPlan = {
    run: 'r',
    runDir: '/out/r',
    target: '/out/r/train-dataset',
    shardSizeMiB: 500,
    datasets: [
      { name: 'B1_glaive', kind: 'generations', source: '/out/r/B1_glaive/generations' },
      { name: 'A1', kind: 'conversations', source: '/data/A1.jsonl' },
    ],
  };

  it('has deterministic ids, one tokenize child per dataset that fails its parent, checked payloads', () => {
    const flowId = roundFlowId('r', 4);
    expect(flowId).toBe('r-pp-4');
    const flow = buildRoundFlow(plan, flowId, 'r-pp-4/00ff');
    expect(flow.queueName).toBe(MERGE_QUEUE);
    expect(flow.opts?.jobId).toBe('r-pp-4');
    expect(MergePayloadSchema.parse(flow.data)).toEqual({
      flowId,
      target: plan.target,
      runDir: plan.runDir,
      shardSizeMiB: 500,
      mergeKey: 'r-pp-4/00ff',
    });
    const children = flow.children ?? [];
    expect(children.map((c) => c.opts?.jobId)).toEqual([
      tokenizeJobId(flowId, 'B1_glaive'),
      tokenizeJobId(flowId, 'A1'),
    ]);
    expect(children.map((c) => c.opts?.jobId)).toEqual(['r-pp-4-B1_glaive', 'r-pp-4-A1']);
    for (const c of children) {
      expect(c.queueName).toBe(TOKENIZE_QUEUE);
      expect(c.opts?.failParentOnFailure).toBe(true);
      expect(String(c.opts?.jobId)).not.toContain(':');
    }
    const [gen, conv] = children.map((c) => TokenizePayloadSchema.parse(c.data));
    expect(gen).toMatchObject({
      kind: 'generations',
      source: plan.datasets[0]?.source,
      stagedDir: stagedDirOf('/out/r', flowId, 'B1_glaive'),
      maxInvalidFraction: 0.05,
    });
    expect(gen?.stagedDir).toBe('/out/r/postprocess/r-pp-4/B1_glaive');
    expect(conv).toMatchObject({ kind: 'conversations', maxInvalidFraction: 0.05, target: plan.target });
    // The same plan and round give the same flow.
    expect(buildRoundFlow(plan, flowId, 'r-pp-4/00ff')).toEqual(flow);
  });
});

describe('post-process output', () => {
  it('prints the per-dataset counts and the validation report', () => {
    const text = formatPostprocessResult({
      flowId: 'r-pp-3',
      status: 'merged',
      datasets: [tokenizeResult('A', 2, { alreadyMerged: 4 })],
      report: {
        mergeId: 'm1',
        target: '/t',
        reportPath: '/run/merge-report-m1.json',
        firstMerge: false,
        oldRows: 10,
        newRows: 5,
        rows: 15,
        oldTokens: 1000,
        newTokens: 500,
        tokens: 1500,
        supervisedTokens: 900,
        lossMaskCoverage: 0.6,
        newLossMaskCoverage: 0.625,
        shards: 3,
        newShards: 1,
        checkedSamples: 5,
        problems: [],
        warnings: ['columns the target does not have were left out: extra'],
      },
    });
    expect(text).toContain('post-processing r-pp-3: merged into the training dataset');
    expect(text).toMatch(/A\s+generations\s+3\s+2\s+200\s+60\.0%\s+4\s+1\s+0\s+0/);
    expect(text).toContain('rows                10 -> 15 (+5)');
    expect(text).toContain('tokens              1,000 -> 1,500 (+500)');
    expect(text).toContain('loss-mask coverage  60.0% (new rows: 62.5%)');
    expect(text).toContain('shards              3 (+1)');
    expect(text).toContain('problems            none');
    expect(text).toContain('warning             columns the target does not have were left out: extra');
  });
});
