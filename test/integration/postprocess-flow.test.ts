// Post-process rounds in one process: generation records and a conversation file on disk →
// tokenize (one job per dataset) → one merge into the training dataset, with a real Redis and
// real files; the merged folder is loaded by Python's `datasets`.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPostprocess } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import {
  TOKENIZE_QUEUE,
  MERGE_QUEUE,
  bundledTokenizerPath,
  createRootLogger,
  loadConfig,
  loadTokenizer,
  postprocessOptions,
  readHfDataset,
  readRunStatus,
  rollbackTarget,
  type ChatTokenizer,
  type ConfigInput,
  type MergeJobResult,
} from '../../src/shared/index.js';
import {
  ensurePostprocessRound,
  planPostprocess,
  roundStagingDir,
  tokenizeJobId,
  waitForRound,
  type RoundOutcome,
} from '../../src/workers/postprocess/flow.js';
import { PostprocessWorker } from '../../src/workers/postprocess/worker.js';
import { useHarness } from '../helpers/fixture.js';
import type { GenerationRecord } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';
import { waitFor } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true });
let tok: ChatTokenizer;
const contexts: RunContext[] = [];

beforeAll(async () => {
  // The failure tests make workers log errors on purpose: quiet unless asked.
  createRootLogger({ level: process.env['TOKENMILL_TEST_LOG_LEVEL'] ?? 'fatal' });
  tok = await loadTokenizer(bundledTokenizerPath());
});

afterAll(async () => {
  for (const c of contexts) await c.close();
});

/** A generation record as the results sink writes it, with real Qwen3 ids. */
function record(dataset: string, id: string, finish: 'stop' | 'length' = 'stop'): GenerationRecord {
  const promptIds = tok.encodePrompt([
    { role: 'user', content: `Question ${id} of ${dataset}: what is ${id.length} squared?` },
  ]);
  const imEnd = tok.tokenToId('<|im_end|>') ?? -1;
  const answer = tok.encode(`The answer to ${id} is ${id.length * id.length}.`);
  const outputIds = finish === 'stop' ? [...answer, imEnd] : answer;
  return {
    id,
    dataset,
    prompt_ids: promptIds,
    output_ids: outputIds,
    prompt_tokens: promptIds.length,
    completion_tokens: outputIds.length,
    finish_reason: finish === 'stop' ? { type: 'stop', matched: imEnd } : { type: 'length', length: outputIds.length },
    endpoint: 'http://127.0.0.1:30000',
    worker: 'test',
    attempt: 1,
    ts: new Date().toISOString(),
  };
}

function writePart(runDir: string, dataset: string, part: number, lines: (GenerationRecord | string)[]): void {
  const dir = path.join(runDir, dataset, 'generations');
  mkdirSync(dir, { recursive: true });
  const text = lines.map((l) => (typeof l === 'string' ? l : JSON.stringify(l))).join('\n');
  writeFileSync(path.join(dir, `part-${String(part).padStart(5, '0')}.jsonl`), `${text}\n`);
}

function conversations(file: string, n: number): void {
  const lines = Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      id: `conv-${i}`,
      conversations: [
        { role: 'user', content: `Say hello number ${i}.` },
        { role: 'assistant', content: `Hello number ${i}!` },
      ],
    }),
  );
  writeFileSync(path.join(tmp.dir, file), `${lines.join('\n')}\n`);
}

async function openRun(run: string, datasets: ConfigInput['datasets']): Promise<RunContext> {
  const config = loadConfig({
    baseDir: tmp.dir,
    object: {
      run,
      redis: { url: redis.url, prefix: redis.prefix },
      datasets,
      output: { dir: 'out' },
      postprocess: { shardSizeMiB: 1 },
    },
  });
  const ctx = await openRunContextFor(config);
  contexts.push(ctx);
  return ctx;
}

/** One round, served by a worker in this process, to its end. */
async function round(ctx: RunContext): Promise<RoundOutcome> {
  const handle = await startPostprocess(ctx, { worker: true, wait: true });
  try {
    return await handle.finished;
  } finally {
    await handle.stop();
  }
}

function completed(outcome: RoundOutcome): MergeJobResult {
  if (outcome.status !== 'completed') throw new Error(`round failed: ${outcome.reason}`);
  return outcome.result;
}

interface TargetRow {
  id: string;
  dataset: string;
  input_ids: number[];
  loss_mask: number[];
}

async function targetRows(target: string): Promise<TargetRow[]> {
  const ds = await readHfDataset(target);
  const out: TargetRow[] = [];
  for await (const r of ds.rows()) {
    out.push({
      id: r['id'] as string,
      dataset: r['dataset'] as string,
      input_ids: Array.from(r['input_ids'] as number[]),
      loss_mask: Array.from(r['loss_mask'] as number[]),
    });
  }
  return out;
}

const keyOf = (r: { dataset: string; id: string }): string => `${r.dataset}/${r.id}`;

describe('post-process rounds', () => {
  let ctx: RunContext;
  let target: string;
  let A: GenerationRecord[];

  beforeAll(async () => {
    A = ['a-0', 'a-1', 'a-2'].map((id) => record('A', id));
    conversations('c.jsonl', 2);
    ctx = await openRun('pp', [
      { name: 'A', prompts: 'a.jsonl', tokenBudget: 1000 },
      { name: 'B', prompts: 'b.jsonl', tokenBudget: 1000 },
      { name: 'C', conversations: 'c.jsonl' },
      // Not generated yet: no generations folder, not part of any round.
      { name: 'D', prompts: 'd.jsonl', tokenBudget: 1000 },
    ]);
    target = ctx.config.postprocess.target;
  });

  it('tokenizes every dataset and merges them in one merge; the target loads in Python with the expected rows', async () => {
    writePart(ctx.runDir, 'A', 0, [...A, record('A', 'a-cut', 'length')]);
    writePart(ctx.runDir, 'B', 0, [record('B', 'b-0'), record('B', 'b-1')]);
    const result = completed(await round(ctx));

    expect(result.flowId).toBe('pp-pp-1');
    expect(result.status).toBe('merged');
    expect(result.datasets.map((d) => [d.dataset, d.kind, d.rows, d.droppedTruncated])).toEqual([
      ['A', 'generations', 3, 1],
      ['B', 'generations', 2, 0],
      ['C', 'conversations', 2, 0],
    ]);
    expect(result.report).toMatchObject({ firstMerge: true, oldRows: 0, newRows: 7, rows: 7, problems: [] });
    expect(existsSync(result.report?.reportPath ?? '')).toBe(true);
    expect(existsSync(roundStagingDir(ctx.runDir, 'pp-pp-1'))).toBe(false);

    const py = await runPythonJson<{ results: { ok: boolean; num_rows: number; data: Record<string, unknown[]> }[] }>(
      'hf_datasets.py',
      [],
      {
        ops: [{ op: 'load', dir: target, data: true }],
      },
    );
    const loaded = py.results[0];
    expect(loaded?.ok).toBe(true);
    expect(loaded?.num_rows).toBe(7);
    const ids = (loaded?.data['id'] ?? []) as string[];
    const datasets = (loaded?.data['dataset'] ?? []) as string[];
    expect(ids.map((id, i) => `${datasets[i]}/${id}`).sort()).toEqual([
      'A/a-0',
      'A/a-1',
      'A/a-2',
      'B/b-0',
      'B/b-1',
      'C/conv-0',
      'C/conv-1',
    ]);
    // A generation row is the prompt, the output and the template's "\n" after <|im_end|>; only the output is supervised.
    const i = ids.indexOf('a-1');
    const a1 = A[1] as GenerationRecord;
    const newline = tok.encode('\n');
    expect((loaded?.data['input_ids'] ?? [])[i]).toEqual([...a1.prompt_ids, ...a1.output_ids, ...newline]);
    expect((loaded?.data['loss_mask'] ?? [])[i]).toEqual([
      ...a1.prompt_ids.map(() => 0),
      ...a1.output_ids.map(() => 1),
      ...newline.map(() => 1),
    ]);

    const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
    expect(
      status.phases
        .filter((p) => p.name === 'tokenize' || p.name === 'merge')
        .map(({ name, status }) => ({ name, status })),
    ).toEqual([
      { name: 'tokenize', status: 'completed' },
      { name: 'merge', status: 'completed' },
    ]);
    expect(await ctx.redis.hgetall(ctx.keys.postprocess())).toMatchObject({
      round: '1',
      flowId: 'pp-pp-1',
      status: 'completed',
    });
  });

  it('a later round merges only what was generated since; rows already merged are never added twice', async () => {
    // New records, and one that repeats an id of an earlier part (the first copy wins).
    writePart(ctx.runDir, 'A', 1, [record('A', 'a-3'), record('A', 'a-4'), record('A', 'a-0')]);
    const result = completed(await round(ctx));
    expect(result.flowId).toBe('pp-pp-2');
    expect(result.status).toBe('merged');
    const byName = Object.fromEntries(result.datasets.map((d) => [d.dataset, d]));
    // Only the lines written since round 1 are read: part 1 of A (a-0 there is already merged), nothing of B.
    expect(byName['A']).toMatchObject({ lines: 3, rows: 2, alreadyMerged: 1, duplicates: 0 });
    expect(byName['B']).toMatchObject({ lines: 0, rows: 0, alreadyMerged: 0 });
    expect(byName['C']).toMatchObject({ rows: 0, alreadyMerged: 2 });
    expect(result.report).toMatchObject({ firstMerge: false, oldRows: 7, newRows: 2, rows: 9 });
    const rows = await targetRows(target);
    const keys = rows.map(keyOf);
    expect(new Set(keys).size).toBe(keys.length);
    expect(keys.filter((k) => k.startsWith('A/')).sort()).toEqual(['A/a-0', 'A/a-1', 'A/a-2', 'A/a-3', 'A/a-4']);
  });

  it('a round with nothing new merges nothing and leaves the target as it was', async () => {
    const before = readFileSync(path.join(target, 'state.json'), 'utf8');
    const result = completed(await round(ctx));
    expect(result.flowId).toBe('pp-pp-3');
    expect(result.status).toBe('nothing-new');
    expect(result.report).toBeNull();
    expect(readFileSync(path.join(target, 'state.json'), 'utf8')).toBe(before);
    expect((await targetRows(target)).length).toBe(9);
  });

  it('after a rollback, the next round adds back the rows the rollback removed', async () => {
    const undone = await rollbackTarget({ target, runDir: ctx.runDir });
    expect(undone.undoneNewRows).toBe(2);
    expect((await targetRows(target)).length).toBe(7);
    const result = completed(await round(ctx));
    expect(result.report).toMatchObject({ oldRows: 7, newRows: 2, rows: 9 });
    const keys = (await targetRows(target)).map(keyOf);
    expect(new Set(keys).size).toBe(9);
  });

  it('joining a round in progress reuses it: children already finished are not run again', async () => {
    writePart(ctx.runDir, 'B', 1, [record('B', 'b-2')]);
    const plan = await planPostprocess(ctx.config, ctx.runDir);
    // Only tokenize workers: the children finish, the merge waits.
    const tokenizeOnly = new PostprocessWorker({
      ...postprocessOptions(ctx.config),
      redisUrl: redis.url,
      keys: ctx.keys,
      keepTruncated: false,
      stages: ['tokenize'],
      logger: quietLogger(),
    });
    await tokenizeOnly.start();
    const first = await ensurePostprocessRound(ctx.redis, ctx.keys, plan, quietLogger());
    expect(first.reused).toBe(false);
    const tokenizeQueue = new Queue(TOKENIZE_QUEUE, { connection: redis.connection(), prefix: ctx.keys.bullPrefix });
    const mergeQueue = new Queue(MERGE_QUEUE, { connection: redis.connection(), prefix: ctx.keys.bullPrefix });
    const childIds = plan.datasets.map((d) => tokenizeJobId(first.flowId, d.name));
    const finishedOn = async (): Promise<(number | undefined)[]> =>
      Promise.all(childIds.map(async (id) => (await Job.fromId(tokenizeQueue, id))?.finishedOn));
    await waitFor(
      async () => (await finishedOn()).every((t) => t !== undefined),
      'every tokenize job finished',
      30_000,
    );
    await tokenizeOnly.stop();
    const done = await finishedOn();
    expect(await (await Job.fromId(mergeQueue, first.flowId))?.getState()).toBe('waiting');

    const again = await ensurePostprocessRound(ctx.redis, ctx.keys, plan, quietLogger());
    expect(again).toMatchObject({ flowId: first.flowId, round: first.round, reused: true });
    expect(again.datasets).toEqual(plan.datasets.map((d) => d.name).sort());
    const result = completed(await round(ctx));
    expect(result.flowId).toBe(first.flowId);
    expect(result.report).toMatchObject({ newRows: 1, rows: 10 });
    expect(await finishedOn()).toEqual(done);
    for (const id of childIds) expect((await Job.fromId(tokenizeQueue, id))?.attemptsStarted, id).toBe(1);
    await tokenizeQueue.close();
    await mergeQueue.close();
  });
});

describe('a failed tokenize job', () => {
  it('fails its round with the job’s own reason, at once; the next round starts afresh', async () => {
    const ctx = await openRun('bad', [
      { name: 'G', prompts: 'g.jsonl', tokenBudget: 1000 },
      { name: 'H', prompts: 'h.jsonl', tokenBudget: 1000 },
    ]);
    writePart(ctx.runDir, 'G', 0, [record('G', 'g-0')]);
    writePart(ctx.runDir, 'H', 0, [record('H', 'h-0'), '{"id": "h-1", "prompt_ids": [1, 2', record('H', 'h-2')]);
    const started = Date.now();
    const outcome = await round(ctx);
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(outcome.status).toBe('failed');
    const reason = outcome.status === 'failed' ? outcome.reason : '';
    expect(reason).toContain('tokenize H: dataset H: 1 of 3 lines are invalid (at most 5% allowed)');
    expect(reason).toContain('fix or delete the lines named');
    expect(reason).toContain(`${path.join(ctx.runDir, 'H', 'generations', 'part-00000.jsonl')}:2: invalid JSON`);
    expect(existsSync(ctx.config.postprocess.target)).toBe(false);
    // The worker records the failure in the checklist and the round's hash.
    await waitFor(
      async () => (await ctx.redis.hget(ctx.keys.postprocess(), 'status')) === 'failed',
      'the round marked failed',
      10_000,
    );
    expect(await ctx.redis.hget(ctx.keys.postprocess(), 'reason')).toContain('tokenize H: dataset H');
    // What G staged is not left behind, whether G finished before H failed or after.
    const tokenizeQueue = new Queue(TOKENIZE_QUEUE, { connection: redis.connection(), prefix: ctx.keys.bullPrefix });
    await waitFor(
      async () => (await Job.fromId(tokenizeQueue, tokenizeJobId('bad-pp-1', 'G')))?.finishedOn !== undefined,
      'G finished',
      10_000,
    );
    await tokenizeQueue.close();
    await waitFor(
      () => !existsSync(roundStagingDir(ctx.runDir, 'bad-pp-1')),
      "the failed round's staged rows removed",
      10_000,
    );
    const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
    expect(
      status.phases
        .filter((p) => p.name === 'tokenize' || p.name === 'merge')
        .map(({ name, status }) => ({ name, status })),
    ).toEqual([
      { name: 'tokenize', status: 'failed' },
      { name: 'merge', status: 'failed' },
    ]);

    // Fixed: the next round is a new one, and succeeds.
    writePart(ctx.runDir, 'H', 0, [record('H', 'h-0'), record('H', 'h-1'), record('H', 'h-2')]);
    const fixed = completed(await round(ctx));
    expect(fixed.flowId).toBe('bad-pp-2');
    expect(fixed.report).toMatchObject({ newRows: 4, rows: 4 });
  });

  // A record with an id outside the vocabulary (written by a version that did not refuse it)
  // used to fail every later round ("1 of 21 lines are invalid (none allowed)").
  it('one out-of-vocabulary record among 21 lines is skipped, named in the report; the round completes', async () => {
    const ctx = await openRun('oov', [{ name: 'V', prompts: 'v.jsonl', tokenBudget: 1000 }]);
    const bad = { ...record('V', 'v-bad'), output_ids: [999_999_999, 1, 2] };
    bad.completion_tokens = bad.output_ids.length;
    const lines = Array.from({ length: 20 }, (_, i) => record('V', `v-${i}`));
    writePart(ctx.runDir, 'V', 0, [...lines.slice(0, 7), bad, ...lines.slice(7)]);
    const result = completed(await round(ctx));
    expect(result.report).toMatchObject({ newRows: 20, rows: 20 });
    const text = JSON.stringify(result);
    expect(text).toContain('output_ids[0] is 999999999');
    expect(text).toContain(`${path.join(ctx.runDir, 'V', 'generations', 'part-00000.jsonl')}`);
  });

  it('a conversation file that cannot be read fails the round, naming the file', async () => {
    const ctx = await openRun('unreadable', [{ name: 'M', conversations: 'missing.jsonl' }]);
    const outcome = await round(ctx);
    expect(outcome.status).toBe('failed');
    expect(outcome.status === 'failed' ? outcome.reason : '').toMatch(
      /^tokenize M: conversation file .*missing\.jsonl cannot be read/,
    );
    // Waiting again on the finished round answers at once with the same reason.
    const flowId = (await ctx.redis.hget(ctx.keys.postprocess(), 'flowId')) ?? '';
    expect(await waitForRound(ctx.redis, ctx.keys, flowId)).toEqual(outcome);
  });
});
