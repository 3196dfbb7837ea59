/**
 * Endpoint affinity of `turns: all` (real CLI, real Redis, two simulators over real HTTP): a
 * conversation's next turn goes to the endpoint that served its previous turn while that
 * endpoint is healthy and has a free slot (its prefix is in that server's radix cache), also
 * with more conversations than slots (the slot a turn frees is held for its next turn), and to
 * another one when it is down, where the conversation then stays.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import type { SimulatorHandle } from '../../src/sim/index.js';
import { RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { byConversation, writeConversations, type TurnRecord } from '../helpers/conversations.js';
import { readGenerations, spawnCli } from '../helpers/pipeline.js';

type AffinityRecord = TurnRecord & { endpoint: string };

const h = useHarness({
  redis: true,
  scripts: true,
  simDefaults: {
    maxRunningRequests: 16,
    contextLength: 8192,
    outputLength: { distribution: 'uniform', mean: 30, min: 20, max: 40 },
  },
  tmp: 'tm-multi-turn-affinity-',
  cli: true,
});

function config(dir: string, run: string, file: string, endpoints: string[], concurrency = 8): string {
  return writeTestConfig(dir, {
    run,
    redis: { url: h.redis.url, prefix: h.redis.prefix },
    // 8 slots per endpoint, more than the conversations: the preferred endpoint always has room.
    sglang: { endpoints, concurrency, contextLength: 8192 },
    datasets: [
      { name: 'c', prompts: path.basename(file), turns: 'all', tokenBudget: 1_000_000, maxNewTokens: 40, batchSize: 2 },
    ],
    postprocess: { keepTruncated: true },
  });
}

/** Each conversation's turns, every turn present once and in order. */
function turnsOf(runDir: string, conversations: number, turns: number): Map<string, AffinityRecord[]> {
  const records = readGenerations(runDir, 'c') as unknown as AffinityRecord[];
  expect(new Set(records.map((r) => r.id)).size, 'no turn written twice').toBe(records.length);
  const convs = byConversation(records) as Map<string, AffinityRecord[]>;
  expect(convs.size).toBe(conversations);
  for (const [id, list] of convs)
    expect(
      list.map((t) => t.turn),
      id,
    ).toEqual(Array.from({ length: turns }, (_, k) => k + 1));
  return convs;
}

describe('turns: all, endpoint affinity', () => {
  it('sends each turn to the endpoint of its previous turn while it has room', async () => {
    const sims: SimulatorHandle[] = [
      await h.startSim({ seed: 5, timeScale: 100 }),
      await h.startSim({ seed: 6, timeScale: 100 }),
    ];
    const dir = path.join(h.tmp.dir, 'room');
    mkdirSync(dir, { recursive: true });
    const conversations = 6;
    const turns = 6;
    const file = writeConversations(dir, 'c', conversations, turns);
    const cfg = config(
      dir,
      'aff',
      file,
      sims.map((s) => s.url),
    );
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);

    const convs = turnsOf(path.join(dir, 'out', 'aff'), conversations, turns);
    let follow = 0;
    let later = 0;
    const used = new Set<string>();
    for (const list of convs.values()) {
      for (const t of list) used.add(t.endpoint);
      for (let k = 1; k < list.length; k += 1) {
        later += 1;
        if ((list[k] as AffinityRecord).endpoint === (list[k - 1] as AffinityRecord).endpoint) follow += 1;
      }
    }
    // Both endpoints served conversations (turn 1 goes to the least loaded), so following is a choice.
    expect(used).toEqual(new Set(sims.map((s) => s.url)));
    // Without the affinity, the least loaded endpoint takes each turn: 23 of 30 followed in a run.
    expect(follow / later, `${follow} of ${later} turns >= 2 on their previous turn's endpoint`).toBeGreaterThanOrEqual(
      0.95,
    );
  }, 180_000);

  it('with more conversations than slots, a finished turn keeps its slot for its conversation', async () => {
    const sims = [await h.startSim({ seed: 9, timeScale: 50 }), await h.startSim({ seed: 10, timeScale: 50 })];
    const dir = path.join(h.tmp.dir, 'busy');
    mkdirSync(dir, { recursive: true });
    const conversations = 16;
    const turns = 5;
    const file = writeConversations(dir, 'c', conversations, turns);
    // 2 slots per endpoint for 16 conversations: a sample waits in line whenever a turn ends.
    const cfg = config(
      dir,
      'busy',
      file,
      sims.map((s) => s.url),
      2,
    );
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const convs = turnsOf(path.join(dir, 'out', 'busy'), conversations, turns);
    let follow = 0;
    let later = 0;
    for (const list of convs.values())
      for (let k = 1; k < list.length; k += 1) {
        later += 1;
        if ((list[k] as AffinityRecord).endpoint === (list[k - 1] as AffinityRecord).endpoint) follow += 1;
      }
    // Without the hold (the slot a turn frees goes to the sample ahead in line, the next turn
    // finds its endpoint full and moves), 56 of 64 followed in a run; with it, 64 of 64.
    expect(follow / later, `${follow} of ${later} turns >= 2 on their previous turn's endpoint`).toBeGreaterThanOrEqual(
      0.97,
    );
  }, 180_000);

  it('sends the next turns elsewhere when the preferred endpoint is down, and they complete there', async () => {
    const [a, b] = [await h.startSim({ seed: 7, timeScale: 5 }), await h.startSim({ seed: 8, timeScale: 5 })];
    const dir = path.join(h.tmp.dir, 'down');
    mkdirSync(dir, { recursive: true });
    const conversations = 6;
    const turns = 10;
    const file = writeConversations(dir, 'c', conversations, turns);
    const cfg = config(dir, 'down', file, [a.url, b.url]);
    const keys = new RunKeys(h.redis.prefix, 'down');
    const run = spawnCli(['run', '-c', cfg]);
    // Once a few turns of every conversation are committed, b goes down for the rest of the run.
    const deadline = Date.now() + 60_000;
    for (;;) {
      const records = Number((await h.scripts.hget(keys.stats('c'), 'records')) ?? 0);
      if (records >= 2 * conversations) break;
      if (Date.now() > deadline) throw new Error(`no progress: ${records} turns committed\n${run.output()}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    await b.outage(600_000);
    expect(await run.exited, run.output()).toBe(0);

    const convs = turnsOf(path.join(dir, 'out', 'down'), conversations, turns);
    let moved = 0;
    for (const [id, list] of convs) {
      const endpoints = list.map((t) => t.endpoint);
      // Every conversation ends on a (b is down), and moves at most once: b's until the outage, then a's.
      expect(endpoints.at(-1), id).toBe(a.url);
      const switches = endpoints.filter((e, k) => k > 0 && e !== endpoints[k - 1]).length;
      expect(switches, `${id}: ${endpoints.join(' ')}`).toBeLessThanOrEqual(1);
      if (endpoints[0] === b.url) moved += 1;
    }
    // Some conversations were on b when it went down (without a fallback they would never complete).
    expect(moved).toBeGreaterThan(0);
    const ends = await h.scripts.hgetall(keys.conversations('c'));
    for (const v of Object.values(ends)) expect(JSON.parse(String(v))).toMatchObject({ kind: 'complete' });
    expect(Object.keys(ends)).toHaveLength(conversations);
  }, 180_000);
});
