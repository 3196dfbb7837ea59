/**
 * `turns: all` against a token budget, a context length and a turn the server refuses (real CLI,
 * real Redis, the simulator over HTTP): every turn's tokens count against the budget and nothing
 * starts once it is met; a conversation cut short by the budget keeps its turns, is not finished,
 * and resumes at its next turn on the same history once the budget is raised; a conversation whose
 * prompt outgrows the context ends `context: …`, one whose turn gets a 400 ends `failed: turn k
 * (HTTP 400) …`, each keeping its earlier turns, while the others complete.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { RunKeys, bundledTokenizerPath, loadTokenizer } from '../../src/shared/index.js';
import type { SimulatorHandle } from '../../src/sim/index.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import {
  byConversation,
  expectTurnChains,
  readConversationFile,
  writeConversations,
  type TurnRecord,
} from '../helpers/conversations.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, sampleIdOfRid, spawnCli } from '../helpers/pipeline.js';

const { redis, tmp, startSim } = useHarness({ redis: true, tmp: 'tm-mt-budget-', cli: true });

type Rec = TurnRecord & { completion_tokens: number; ts: string };

function configFor(
  dir: string,
  run: string,
  sim: SimulatorHandle,
  prompts: string,
  extra: { tokenBudget: number; contextLength: number; maxNewTokens: number; strict?: boolean },
): string {
  const config: TestConfigSpec = {
    run,
    redis,
    sim,
    sglang: { concurrency: 4, contextLength: extra.contextLength },
    datasets: [
      {
        name: 'c',
        prompts,
        turns: 'all',
        tokenBudget: extra.tokenBudget,
        maxNewTokens: extra.maxNewTokens,
        batchSize: 2,
        ...(extra.strict === true ? { budget: 'strict' as const, budgetMarginSd: 0 } : {}),
      },
    ],
    postprocess: { keepTruncated: true },
  };
  return writeTestConfig(dir, config, `${run}.yaml`);
}

async function runCli(cfg: string): Promise<void> {
  const run = spawnCli(['run', '-c', cfg]);
  expect(await run.exited, run.output().slice(-4_000)).toBe(0);
}

/**
 * Each conversation's records are turns 1..m in order (no gap, none twice), and each turn k ≥ 2's
 * prompt is the rendering of the history of the turns on disk before it (spliced: it starts with
 * the previous turn's prompt_ids + output_ids). Returns the records by conversation.
 */
async function expectChains(records: Rec[], file: string): Promise<Map<string, Rec[]>> {
  expect(duplicates(records.map((r) => r.id)), 'no turn written twice').toEqual([]);
  const tok = await loadTokenizer(bundledTokenizerPath());
  const convs = byConversation(records) as Map<string, Rec[]>;
  expectTurnChains(tok, readConversationFile(file), convs);
  return convs;
}

/** A conversation of `turns` user turns of about `words` tokens each. */
function longConversation(id: string, turns: number, words: number): object {
  const messages: object[] = [];
  for (let k = 1; k <= turns; k += 1) {
    messages.push({ role: 'user', content: `Question ${k}: ${Array.from({ length: words }, () => 'word').join(' ')}` });
    messages.push({ role: 'assistant', content: `source answer ${k}` });
  }
  return { id, messages };
}

describe('turns: all, budget and ends', () => {
  it('the budget counts every turn and stops new turns; cut-short conversations keep their turns, are not finished, and resume on the same history once it is raised', async () => {
    const sim = await startSim({
      timeScale: 200,
      maxRunningRequests: 16,
      seed: 41,
      contextLength: 8192,
      outputLength: { distribution: 'uniform', mean: 30, min: 20, max: 40 },
    });
    const dir = path.join(tmp.dir, 'budget');
    mkdirSync(dir, { recursive: true });
    const file = writeConversations(dir, 'b', 10, 4);
    const keys = new RunKeys(redis.prefix, 'mtb');
    const conn = redis.connection('client');
    const runDir = path.join(dir, 'out', 'mtb');
    // About 40 turns of 20–40 tokens: this budget stops the run about a third of the way.
    const budget = 400;
    await runCli(configFor(dir, 'mtb', sim, 'b.jsonl', { tokenBudget: budget, contextLength: 8192, maxNewTokens: 64 }));

    const first = readGenerations(runDir, 'c') as unknown as Rec[];
    const stats = await conn.hgetall(keys.stats('c'));
    const tokens = Number(stats.outputTokens);
    // Every turn's tokens count (a turn left out of the counter would make the files exceed it).
    expect(first.reduce((a, r) => a + r.completion_tokens, 0)).toBe(tokens);
    expect(Number(stats.records)).toBe(first.length);
    expect(tokens).toBeGreaterThanOrEqual(budget);
    // The overshoot is at most what was in flight when the budget was met: 4 slots of ≤ 40 tokens.
    expect(tokens).toBeLessThan(budget + 4 * 40);
    expect(first.length).toBeLessThan(40);
    // No turn started once the budget was met (a request admitted just before may arrive a few ms after).
    const budgetMetMs = Number(stats.budgetMetMs);
    expect(budgetMetMs).toBeGreaterThan(0);
    const sentFirst = sim.stats().requests.filter((r) => r.rid.startsWith('c/'));
    expect(sentFirst.filter((r) => r.receivedAtMs > budgetMetMs + 100).map((r) => r.rid)).toEqual([]);
    expect(sentFirst.length).toBe(first.length);

    const convs = await expectChains(first, file);
    const ends = await conn.hgetall(keys.conversations('c'));
    const cut = [...convs.entries()].filter(([, turns]) => turns.length < 4);
    expect(cut.length, 'conversations cut short by the budget').toBeGreaterThan(0);
    for (const [id, turns] of cut) {
      // Not finished: in neither the conversations hash nor the counters; its history is exactly its turns on disk.
      expect(ends[id], id).toBeUndefined();
      const hist = await conn.hgetall(keys.conversationHistory('c', id));
      expect(Object.keys(hist).map(Number).sort(), id).toEqual(turns.map((t) => t.turn));
      for (const t of turns) expect(JSON.parse(hist[String(t.turn)] ?? 'null'), t.id).toEqual(t.output_ids);
    }
    for (const [id, turns] of convs)
      if (turns.length === 4) expect(JSON.parse(ends[id] ?? '{}')).toMatchObject({ kind: 'complete' });
    expect(Number(stats.conversationsComplete ?? 0)).toBe(Object.keys(ends).length);
    expect(stats.conversationsEnded ?? '0').toBe('0');

    // Raised: the cut conversations resume at their next turn, on the turns already on disk, and complete.
    await runCli(
      configFor(dir, 'mtb', sim, 'b.jsonl', { tokenBudget: 1_000_000, contextLength: 8192, maxNewTokens: 64 }),
    );
    const all = readGenerations(runDir, 'c') as unknown as Rec[];
    // The first run's lines are kept as they were; the second only adds.
    expect(all.slice(0, first.length)).toEqual(first);
    const done = await expectChains(all, file);
    expect([...done.keys()].sort()).toEqual(Array.from({ length: 10 }, (_, i) => `b-${i}`).sort());
    for (const [id, turns] of done) expect(turns.length, id).toBe(4);
    // No turn committed in the first run was sent again.
    const sent = new Map<string, number>();
    for (const r of sim.stats().requests.filter((x) => x.rid.startsWith('c/'))) {
      const id = sampleIdOfRid(r.rid);
      sent.set(id, (sent.get(id) ?? 0) + 1);
    }
    for (const r of all) expect(sent.get(r.id), r.id).toBe(1);
    const after = await conn.hgetall(keys.stats('c'));
    expect(Number(after.records)).toBe(all.length);
    expect(Number(after.outputTokens)).toBe(all.reduce((a, r) => a + r.completion_tokens, 0));
    expect(after.conversationsComplete).toBe('10');
    expect(after.conversationsStarted).toBe('10');
    const endsAfter = await conn.hgetall(keys.conversations('c'));
    expect(Object.keys(endsAfter).sort()).toEqual([...done.keys()].sort());
    for (const v of Object.values(endsAfter)) expect(JSON.parse(v)).toMatchObject({ kind: 'complete', turnsDone: 4 });
    expect(await conn.keys(`${keys.done('c')}:conv:*`)).toEqual([]);
  }, 180_000);

  it('budget: strict stops a turn mid-answer: the cut answer is neither a record nor history; raised, the turn is generated again, whole', async () => {
    // Every answer runs 1,500 tokens (about 2 s here): the strict stop lands mid-answer.
    const sim = await startSim({
      timeScale: 10,
      maxRunningRequests: 16,
      seed: 43,
      outputLength: { distribution: 'fixed', mean: 1_500 },
    });
    const dir = path.join(tmp.dir, 'strict');
    mkdirSync(dir, { recursive: true });
    const file = writeConversations(dir, 's', 2, 3);
    const keys = new RunKeys(redis.prefix, 'mts');
    const conn = redis.connection('client');
    const runDir = path.join(dir, 'out', 'mts');
    // Both turn-1 answers (3,000 tokens) fit; the budget is met 500 tokens into a turn 2.
    await runCli(
      configFor(dir, 'mts', sim, 's.jsonl', {
        tokenBudget: 3_500,
        contextLength: 32_768,
        maxNewTokens: 2_048,
        strict: true,
      }),
    );
    const first = readGenerations(runDir, 'c') as unknown as (Rec & { finish_reason: { type: string } })[];
    const stats = await conn.hgetall(keys.stats('c'));
    // Before: the cut turn was committed as an `abort` record and became the history of the next turn.
    expect(first.filter((r) => r.finish_reason.type === 'abort').map((r) => r.id)).toEqual([]);
    expect(first.map((r) => r.id).sort()).toEqual(['s-0#t1', 's-1#t1']);
    expect(Number(stats.abortedTurns)).toBeGreaterThanOrEqual(1);
    // Its tokens were generated: they count against the budget (which the stop met).
    expect(Number(stats.outputTokens)).toBe(3_000 + Number(stats.abortedTokens));
    expect(Number(stats.outputTokens)).toBeGreaterThanOrEqual(3_500);
    const aborted = sim
      .stats()
      .requests.filter((r) => r.rid.startsWith('c/') && sampleIdOfRid(r.rid).endsWith('#t2'))
      .map((r) => sampleIdOfRid(r.rid));
    expect(aborted.length).toBeGreaterThanOrEqual(1);
    for (const conv of ['s-0', 's-1']) {
      // Not finished; its history holds turn 1 only.
      expect(await conn.hget(keys.conversations('c'), conv)).toBeNull();
      expect(Object.keys(await conn.hgetall(keys.conversationHistory('c', conv)))).toEqual(['1']);
    }

    // Raised: the cut turn is generated again from the same history, whole, and the rest follows.
    await runCli(
      configFor(dir, 'mts', sim, 's.jsonl', { tokenBudget: 1_000_000, contextLength: 32_768, maxNewTokens: 2_048 }),
    );
    const all = readGenerations(runDir, 'c') as unknown as (Rec & { finish_reason: { type: string } })[];
    const done = await expectChains(all, file);
    for (const [id, turns] of done) expect(turns.length, id).toBe(3);
    expect(all.filter((r) => r.finish_reason.type === 'abort')).toEqual([]);
    for (const r of all) expect(r.output_ids.length, r.id).toBe(1_500);
    const sent = new Map<string, number>();
    for (const r of sim.stats().requests.filter((x) => x.rid.startsWith('c/'))) {
      const id = sampleIdOfRid(r.rid);
      sent.set(id, (sent.get(id) ?? 0) + 1);
    }
    for (const id of aborted) expect(sent.get(id), `${id}: aborted once, then generated whole`).toBe(2);
    expect((await conn.hgetall(keys.stats('c'))).conversationsComplete).toBe('2');
  }, 120_000);

  it('a conversation whose prompt outgrows the context ends `context: …` keeping its earlier turns; the others complete', async () => {
    const ctxLen = 1000;
    const sim = await startSim({
      timeScale: 200,
      maxRunningRequests: 16,
      seed: 43,
      contextLength: ctxLen,
      outputLength: { distribution: 'uniform', mean: 30, min: 20, max: 40 },
    });
    const dir = path.join(tmp.dir, 'context');
    mkdirSync(dir, { recursive: true });
    // Turns of ~400 tokens: turn 2's prompt (~860 with turn 1's answer) fits, turn 3's (~1300) does not.
    const file = writeConversations(dir, 'x', 4, 3, [longConversation('long', 4, 400)]);
    await runCli(
      configFor(dir, 'mtc', sim, 'x.jsonl', { tokenBudget: 1_000_000, contextLength: ctxLen, maxNewTokens: 64 }),
    );
    const keys = new RunKeys(redis.prefix, 'mtc');
    const conn = redis.connection('client');
    const records = readGenerations(path.join(dir, 'out', 'mtc'), 'c') as unknown as Rec[];
    const convs = await expectChains(records, file);
    expect(convs.get('long')?.map((t) => t.turn)).toEqual([1, 2]);
    // Turn 3 never reached the server: the worker saw it would not fit.
    expect(sim.stats().requests.filter((r) => sampleIdOfRid(r.rid) === 'long#t3')).toEqual([]);
    const ends = await conn.hgetall(keys.conversations('c'));
    const end = JSON.parse(ends.long ?? '{}') as Record<string, unknown>;
    expect(end).toMatchObject({ kind: 'ended', turnsDone: 2, turn: 3, turns: 4 });
    expect(end.reason).toMatch(
      new RegExp(`^context: turn 3's prompt has \\d+ tokens; the context length is ${ctxLen}$`),
    );
    for (let i = 0; i < 4; i += 1) {
      expect(convs.get(`x-${i}`)?.length).toBe(3);
      expect(JSON.parse(ends[`x-${i}`] ?? '{}')).toMatchObject({ kind: 'complete' });
    }
    const stats = await conn.hgetall(keys.stats('c'));
    expect(stats.conversationsComplete).toBe('4');
    expect(stats.conversationsEnded).toBe('1');
    expect(Number(stats.records)).toBe(records.length);
    expect(await conn.keys(`${keys.done('c')}:conv:*`)).toEqual([]);
  }, 120_000);

  it('a turn the server answers 400 ends its conversation `failed: turn k (HTTP 400) …` keeping its earlier turns; the others complete', async () => {
    // The server's context is smaller than the config says: the worker sends turn 2 of `long`
    // (~1250 tokens) and the server refuses it with a 400, as SGLang does.
    const sim = await startSim({
      timeScale: 200,
      maxRunningRequests: 16,
      seed: 47,
      contextLength: 1000,
      outputLength: { distribution: 'uniform', mean: 30, min: 20, max: 40 },
    });
    const dir = path.join(tmp.dir, 'refused');
    mkdirSync(dir, { recursive: true });
    const file = writeConversations(dir, 'y', 4, 3, [longConversation('long', 3, 600)]);
    await runCli(
      configFor(dir, 'mtf', sim, 'y.jsonl', { tokenBudget: 1_000_000, contextLength: 8192, maxNewTokens: 64 }),
    );
    const keys = new RunKeys(redis.prefix, 'mtf');
    const conn = redis.connection('client');
    const records = readGenerations(path.join(dir, 'out', 'mtf'), 'c') as unknown as Rec[];
    const convs = await expectChains(records, file);
    expect(convs.get('long')?.map((t) => t.turn)).toEqual([1]);
    // Turn 2 was sent once and refused, not retried (a 400 is the prompt's fault): the server
    // answered exactly one request with an error and served no turn of `long` after turn 1.
    const longServed = sim.stats().requests.filter((r) => sampleIdOfRid(r.rid).startsWith('long#'));
    expect(longServed.map((r) => sampleIdOfRid(r.rid))).toEqual(['long#t1']);
    expect(sim.stats().failed).toBe(1);
    const ends = await conn.hgetall(keys.conversations('c'));
    const end = JSON.parse(ends.long ?? '{}') as Record<string, unknown>;
    expect(end).toMatchObject({ kind: 'ended', turnsDone: 1, turn: 2, turns: 3 });
    expect(end.reason).toMatch(/^failed: turn 2 \(HTTP 400\): .*context length/);
    for (let i = 0; i < 4; i += 1) {
      expect(convs.get(`y-${i}`)?.length).toBe(3);
      expect(JSON.parse(ends[`y-${i}`] ?? '{}')).toMatchObject({ kind: 'complete' });
    }
    // The turn's failure is folded into the conversation's end: nothing left to retry on its own.
    expect(await conn.hgetall(keys.failed('c'))).toEqual({});
    const stats = await conn.hgetall(keys.stats('c'));
    expect(stats.status).toBe('completed');
    expect(stats.conversationsComplete).toBe('4');
    expect(stats.conversationsEnded).toBe('1');
    expect(Number(stats.records)).toBe(records.length);
    expect(await conn.keys(`${keys.done('c')}:conv:*`)).toEqual([]);
  }, 120_000);
});
