// Agentic conversations with a tool executor (`datasets[].toolExecutor`) at the worst moments, with
// real processes: a worker SIGKILLed while the executor is still answering a turn's calls, and
// another SIGKILLed after a turn's results were recorded but before the next turn started. Each
// call is run once (the request sent again carries the same Idempotency-Key), a result recorded
// before a kill is used as it is, never asked for again, every conversation ends complete, each
// turn is written once, and each turn's history holds exactly the executor's results for the calls
// of the turn before it.
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { RunKeys, bundledTokenizerPath, loadTokenizer, pauseDataset, resumeDataset } from '../../src/shared/index.js';
import {
  agenticRecords,
  expectAgenticChains,
  writeAgentic,
  type AgenticRecord,
  type AgenticTurnRecord,
} from '../helpers/agentic.js';
import { byConversation } from '../helpers/conversations.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, type CliProcess } from '../helpers/pipeline.js';
import { startReferenceExecutor } from '../helpers/tool-executor.js';

const PARALLEL = 0.3;

const { redis, sim, tmp, defer } = useHarness({
  redis: true,
  sim: {
    timeScale: 20,
    maxRunningRequests: 32,
    seed: 41,
    outputLength: { distribution: 'uniform', mean: 30, min: 20, max: 40 },
    // Every turn makes the source's calls: every conversation ends complete.
    toolCalls: { probability: 1, parallel: PARALLEL, divergent: 0, malformed: 0 },
  },
  tmp: true,
  cli: true,
});

describe('agentic conversations with a tool executor survive kills', () => {
  it('a worker SIGKILLed while the executor answers, another between a recorded result and the next turn: each call run once, nothing lost or repeated', async () => {
    const executor = await startReferenceExecutor();
    defer(() => executor.close());
    const run = 'axc';
    const records: AgenticRecord[] = agenticRecords(run, 12, PARALLEL);
    const file = writeAgentic(tmp.dir, run, records);
    const configPath = writeTestConfig(tmp.dir, {
      run,
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 32_768 },
      dataset: {
        prompts: path.basename(file),
        turns: 'all',
        maxNewTokens: 256,
        batchSize: 3,
        toolExecutor: { url: executor.url, timeoutMs: 10_000, attempts: 3 },
      },
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000, leaseTtlMs: 2_000, shutdownGraceMs: 1_000 },
    });
    const keys = new RunKeys(redis.prefix, run);
    const conn = redis.connection('client');
    const convs = records.map((r) => r.id);
    const producer = spawnCli(['produce', '-c', configPath]);
    const workers: CliProcess[] = [];
    try {
      // 1. Killed while the executor holds a turn's request: it has run the calls, the worker
      // never got the answer, nothing is recorded.
      executor.setDelay(3_000);
      const w1 = spawnCli(['worker', '-c', configPath]);
      await waitFor(async () => executor.requests.length >= 1, 'a request at the executor', 60_000, 10);
      const held = new Set(executor.requests.map((r) => r.key));
      w1.child.kill('SIGKILL');
      expect(await w1.exited).toBe('SIGKILL');
      executor.setDelay(0);

      // 2. Killed between a recorded result and the next turn: the dataset is paused as soon as a
      // result is recorded (no next turn can start), what is in flight finishes, then the kill.
      const w2 = spawnCli(['worker', '-c', configPath]);
      const recordedNow = async (): Promise<string[]> => {
        const out: string[] = [];
        for (const conv of convs) {
          const fields = await conn.hkeys(keys.conversationHistory('ds', conv));
          for (const f of fields) {
            const k = /^r(\d+)$/.exec(f)?.[1];
            if (k !== undefined && !fields.includes(String(Number(k) + 1))) out.push(`ds/${conv}/${k}`);
          }
        }
        return out;
      };
      await waitFor(async () => (await recordedNow()).length >= 1, 'a result recorded', 60_000, 5);
      await pauseDataset(conn, keys, 'ds');
      await waitFor(async () => (await conn.zcard(keys.inflight('ds'))) === 0, 'the turns in flight done', 60_000);
      const between = await recordedNow();
      expect(between.length, 'conversations between a recorded result and their next turn').toBeGreaterThan(0);
      const askedBefore = new Map<string, number>();
      for (const r of executor.requests) askedBefore.set(r.key, (askedBefore.get(r.key) ?? 0) + 1);
      w2.child.kill('SIGKILL');
      expect(await w2.exited).toBe('SIGKILL');
      await resumeDataset(conn, keys, 'ds');

      // 3. A fresh worker finishes the run.
      workers.push(spawnCli(['worker', '-c', configPath]));
      const code = await Promise.race([producer.exited, new Promise((r) => setTimeout(() => r('timeout'), 150_000))]);
      expect(code, `${producer.output().slice(-3_000)}\n${workers[0]?.output().slice(-2_000) ?? ''}`).toBe(0);

      // Every conversation complete, each turn once, each history the executor's results.
      const turnRecords = readGenerations(path.join(tmp.dir, 'out', run), 'ds') as unknown as AgenticTurnRecord[];
      expect(duplicates(turnRecords.map((t) => t.id)), 'no turn written twice').toEqual([]);
      const ends = await conn.hgetall(keys.conversations('ds'));
      expect(Object.keys(ends).sort()).toEqual([...convs].sort());
      for (const [id, v] of Object.entries(ends)) expect(JSON.parse(v), id).toMatchObject({ kind: 'complete' });
      const tok = await loadTokenizer(bundledTokenizerPath());
      const placed = expectAgenticChains(
        tok,
        'hermes',
        new Map(records.map((r) => [r.id, r])),
        byConversation(turnRecords),
      );
      expect(placed.source).toBe(0);
      for (const t of turnRecords) {
        if (t.tool_results === undefined) continue;
        const key = `ds/${t.conversation_id}/${t.turn - 1}`;
        expect(
          t.tool_results.messages.map((m) => m.content),
          key,
        ).toEqual((executor.answers.get(key) ?? []).map((a) => a.content));
      }

      // Each call run once, whatever was asked twice.
      expect([...executor.executions].filter(([, n]) => n !== 1)).toEqual([]);
      const asked = new Map<string, number>();
      for (const r of executor.requests) asked.set(r.key, (asked.get(r.key) ?? 0) + 1);
      // The request the first kill cut short was sent again, with the same key, and ran nothing again.
      for (const key of held) {
        if (ends[key.split('/')[1] as string] === undefined) continue;
        expect(asked.get(key) ?? 0, key).toBeGreaterThanOrEqual(2);
        expect(executor.executions.get(key), key).toBe(1);
      }
      // A result recorded before the second kill was used as recorded: never asked for again.
      for (const key of between) expect(asked.get(key), key).toBe(askedBefore.get(key));
      expect(await conn.keys(`${keys.done('ds')}:conv:*`), 'no history left').toEqual([]);
    } finally {
      producer.child.kill('SIGKILL');
      for (const w of workers) w.child.kill('SIGTERM');
      await Promise.all(workers.map((w) => w.exited));
    }
  }, 300_000);
});
