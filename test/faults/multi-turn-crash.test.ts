// `turns: all` at the worst moments, with real processes: a worker SIGKILLed while conversations
// wait between two turns, another SIGKILLed while a later turn (≥ 2) is at the server, the
// producer SIGKILLed once; and two worker processes racing on the same conversations (every batch
// delivered twice at once). Whatever happens, each conversation ends complete, each turn is written
// once, and each turn's prompt is built on the turns committed before it, never on a losing
// duplicate's answer or a lost one.
import path from 'node:path';

import { Queue } from 'bullmq';
import { describe, expect, it } from 'vitest';

import {
  RunKeys,
  bundledTokenizerPath,
  generateQueueName,
  loadTokenizer,
  pauseDataset,
  resumeDataset,
} from '../../src/shared/index.js';
import {
  byConversation,
  expectTurnChains,
  readConversationFile,
  writeConversations,
  type TurnRecord,
} from '../helpers/conversations.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, sampleIdOfRid, spawnCli, waitFor, type CliProcess } from '../helpers/pipeline.js';

const TURNS = 4;

const { redis, sim, tmp } = useHarness({
  redis: true,
  // Slow requests (about a second each: 30–90 tokens at 80 tokens/s), so that a kill lands while a
  // turn is at the server, and few slots (sglang.concurrency below) for many conversations, so
  // that conversations wait between two turns for a slot.
  sim: {
    timeScale: 1,
    maxRunningRequests: 32,
    seed: 37,
    outputLength: { distribution: 'uniform', mean: 60, min: 30, max: 90 },
  },
  tmp: true,
  cli: true,
});

interface Setup {
  configPath: string;
  runDir: string;
  keys: RunKeys;
  file: string;
  convs: string[];
}

function setup(run: string, n: number, concurrency: number): Setup {
  const file = writeConversations(tmp.dir, run, n, TURNS);
  return {
    configPath: writeTestConfig(tmp.dir, {
      run,
      redis,
      sim,
      sglang: { concurrency, contextLength: 32_768 },
      dataset: { prompts: path.basename(file), turns: 'all', maxNewTokens: 256, batchSize: 4 },
      workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000, leaseTtlMs: 2_000, shutdownGraceMs: 1_000 },
    }),
    runDir: path.join(tmp.dir, 'out', run),
    keys: new RunKeys(redis.prefix, run),
    file,
    convs: Array.from({ length: n }, (_, i) => `${run}-${i}`),
  };
}

const turnOf = (sampleId: string): number => Number(/#t(\d+)$/.exec(sampleId)?.[1] ?? '0');

/** Requests the simulator received, per turn id. */
function sends(prefix: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const r of sim.stats().requests.filter((x) => x.rid.startsWith(`ds/${prefix}-`))) {
    const id = sampleIdOfRid(r.rid);
    out.set(id, (out.get(id) ?? 0) + 1);
  }
  return out;
}

/**
 * Conversations waiting between two turns right now: turns 1..m committed (in the history),
 * m < TURNS, and turn m + 1 not in flight.
 */
async function betweenTurns(s: Setup): Promise<{ conv: string; committed: number }[]> {
  const conn = redis.connection('client');
  const inflight = new Set((await conn.zrange(s.keys.inflight('ds'), 0, -1)).map(sampleIdOfRid));
  const out: { conv: string; committed: number }[] = [];
  for (const conv of s.convs) {
    const m = await conn.hlen(s.keys.conversationHistory('ds', conv));
    if (m >= 1 && m < TURNS && !inflight.has(`${conv}#t${m + 1}`)) out.push({ conv, committed: m });
  }
  return out;
}

/**
 * The end state every scenario must reach: each conversation complete once, each of its turns
 * written once, in order, each turn's prompt the rendering of the committed turns before it
 * (spliced: prompt_ids starts with the previous turn's prompt_ids + output_ids), the counters
 * equal to the files, and no history left.
 */
async function expectCompleteChains(s: Setup): Promise<TurnRecord[]> {
  const conn = redis.connection('client');
  const records = readGenerations(s.runDir, 'ds') as unknown as TurnRecord[];
  const ids = records.map((r) => r.id);
  expect(duplicates(ids), 'no turn written twice').toEqual([]);
  expect([...ids].sort()).toEqual(
    s.convs.flatMap((c) => Array.from({ length: TURNS }, (_, k) => `${c}#t${k + 1}`)).sort(),
  );

  const tok = await loadTokenizer(bundledTokenizerPath());
  // Built on the committed answers (the ones on disk): a prompt built on a duplicate's lost
  // answer, or on an answer the resume did not read back, fails this.
  expectTurnChains(tok, readConversationFile(s.file), byConversation(records), { complete: true });

  const stats = await conn.hgetall(s.keys.stats('ds'));
  expect(stats.status).toBe('completed');
  expect(Number(stats.records)).toBe(records.length);
  expect(Number(stats.outputTokens)).toBe(records.reduce((a, r) => a + r.output_ids.length, 0));
  expect(Number(stats.conversationsComplete)).toBe(s.convs.length);
  expect(Number(stats.conversationsStarted)).toBe(s.convs.length);
  expect(stats.conversationsEnded ?? '0').toBe('0');
  const ends = await conn.hgetall(s.keys.conversations('ds'));
  expect(Object.keys(ends).sort()).toEqual([...s.convs].sort());
  for (const [id, v] of Object.entries(ends)) expect(JSON.parse(v), id).toMatchObject({ kind: 'complete' });
  expect(await conn.keys(`${s.keys.done('ds')}:conv:*`), 'no history left').toEqual([]);
  expect(await conn.hlen(s.keys.failed('ds'))).toBe(0);
  expect(await conn.xlen(s.keys.results('ds'))).toBe(0);
  return records;
}

async function stop(workers: CliProcess[]): Promise<void> {
  for (const w of workers) w.child.kill('SIGTERM');
  await Promise.all(workers.map((w) => w.exited));
}

describe('turns: all survives crashes and races', () => {
  it('a worker SIGKILLed between two turns, one while turn ≥ 2 is at the server, the producer once: every conversation complete, each turn once, each built on the committed ones', async () => {
    // 20 conversations, 3 slots: most conversations of a delivered batch wait between turns.
    const s = setup('crash', 20, 3);
    const conn = redis.connection('client');
    let producer = spawnCli(['produce', '-c', s.configPath]);
    const w1 = spawnCli(['worker', '-c', s.configPath]);
    const workers: CliProcess[] = [];
    try {
      // 1. Kill while conversations wait between turns (some turns committed, the next not
      // started). A worker runs a conversation's next turn as soon as the previous one commits
      // (its slot is held for it), so the moment is made: the dataset is paused once a few turns
      // are committed; what is in flight finishes, and the next turns wait for the resume.
      // Paused, at once (the same call as `tokenmill pause`, made here: a CLI process takes
      // seconds to start, in which the conversation could finish), while some conversation has a
      // turn or more committed and two or more to go: acquire-request.lua starts no request of a
      // paused dataset, so once its one turn in flight commits, it waits between two turns.
      await waitFor(
        async () => {
          for (const conv of s.convs) {
            const m = await conn.hlen(s.keys.conversationHistory('ds', conv));
            if (m >= 1 && m <= TURNS - 2) return true;
          }
          return false;
        },
        'a conversation with two turns or more to go',
        60_000,
        20,
      );
      await pauseDataset(conn, s.keys, 'ds');
      await waitFor(
        async () => (await conn.zcard(s.keys.inflight('ds'))) === 0 && (await betweenTurns(s)).length >= 1,
        'conversations between turns',
        90_000,
      ).catch((e: unknown) => {
        throw new Error(
          `${String(e)}\nproducer: ${producer.output().slice(-2_000)}\nworker: ${w1.output().slice(-2_000)}`,
        );
      });
      w1.child.kill('SIGKILL');
      expect(await w1.exited).toBe('SIGKILL');
      // The killed worker's state is frozen now (its leases lapse, nobody else runs): these
      // conversations were between two turns when it died.
      const paused = await betweenTurns(s);
      expect(paused.length).toBeGreaterThan(0);
      const killedLeases = new Set(await conn.zrange(s.keys.inflight('ds'), 0, -1));

      await resumeDataset(conn, s.keys, 'ds');

      // 2. The producer killed once, while a worker works; it starts again at once.
      const w2 = spawnCli(['worker', '-c', s.configPath]);
      const before = Number((await conn.hget(s.keys.stats('ds'), 'records')) ?? 0);
      await waitFor(
        async () => Number((await conn.hget(s.keys.stats('ds'), 'records')) ?? 0) >= before + 4,
        'commits after the first kill',
        60_000,
      );
      producer.child.kill('SIGKILL');
      expect(await producer.exited).toBe('SIGKILL');
      producer = spawnCli(['produce', '-c', s.configPath]);

      // 3. Kill while a turn ≥ 2 of this worker is at the server (received, not committed).
      await waitFor(
        async () => {
          const received = new Set(sim.stats().requests.map((r) => r.rid));
          const rids = await conn.zrange(s.keys.inflight('ds'), 0, -1);
          return rids.some((r) => !killedLeases.has(r) && received.has(r) && turnOf(sampleIdOfRid(r)) >= 2);
        },
        'a later turn at the server',
        60_000,
      );
      w2.child.kill('SIGKILL');
      expect(await w2.exited).toBe('SIGKILL');
      const received = new Set(sim.stats().requests.map((r) => r.rid));
      const cut: string[] = [];
      for (const rid of await conn.zrange(s.keys.inflight('ds'), 0, -1)) {
        const id = sampleIdOfRid(rid);
        if (killedLeases.has(rid) || !received.has(rid) || turnOf(id) < 2) continue;
        if ((await conn.sismember(s.keys.done('ds'), id)) === 0) cut.push(id);
      }
      expect(cut.length, 'a turn ≥ 2 was at the server when its worker died').toBeGreaterThan(0);

      // 4. A fresh worker finishes the run.
      workers.push(spawnCli(['worker', '-c', s.configPath]));
      const code = await Promise.race([producer.exited, new Promise((r) => setTimeout(() => r('timeout'), 150_000))]);
      expect(code, `${producer.output().slice(-3_000)}\n${workers[0]?.output().slice(-2_000) ?? ''}`).toBe(0);

      await expectCompleteChains(s);
      const sent = sends('crash');
      // The turn cut at the server was sent again (a new request) and written once.
      for (const id of cut) expect(sent.get(id) ?? 0, id).toBeGreaterThanOrEqual(2);
      // A conversation paused between turns m and m + 1 resumed at m + 1: its committed turns
      // were not sent again (each sent once unless it was itself cut at the server later).
      for (const p of paused) {
        for (let k = 1; k <= p.committed; k += 1) {
          const id = `${p.conv}#t${k}`;
          if (!cut.includes(id)) expect(sent.get(id), id).toBe(1);
        }
      }
    } finally {
      producer.child.kill('SIGKILL');
      await stop(workers);
    }
  }, 300_000);

  it('a batch whose lock is lost between two turns: its old holder starts no further turn; the next holder resumes, each turn sent once', async () => {
    const s = setup('lost', 2, 2);
    const conn = redis.connection('client');
    const queue = new Queue(generateQueueName('ds'), { connection: redis.connection(), prefix: s.keys.bullPrefix });
    const producer = spawnCli(['produce', '-c', s.configPath]);
    const worker = spawnCli(['worker', '-c', s.configPath]);
    try {
      // Both conversations are in the one batch; once a turn of one commits, the batch's lock is
      // taken away (as when another worker takes over a batch after this one stalled).
      await waitFor(
        async () => {
          for (const conv of s.convs) if ((await conn.hlen(s.keys.conversationHistory('ds', conv))) >= 1) return true;
          return false;
        },
        'a turn committed',
        60_000,
        10,
      );
      const [job] = await queue.getActive();
      expect(job?.id).toBeDefined();
      const lockKey = `${s.keys.bullPrefix}:${generateQueueName('ds')}:${String(job?.id)}:lock`;
      await conn.set(lockKey, 'another-worker', 'PX', 60_000);
      const takenMs = Date.now();
      // What the old holder had at the server finishes; after it, it starts nothing more.
      await waitFor(async () => (await conn.zcard(s.keys.inflight('ds'))) === 0, 'the turns in flight done', 30_000);
      const quietFrom = Date.now();
      // A window in which the old holder may start nothing (the point): its next turn would go out at once.
      await new Promise((r) => setTimeout(r, 1_500));
      const late = sim
        .stats()
        .requests.filter((r) => r.rid.startsWith('ds/lost-') && r.receivedAtMs > quietFrom)
        .map((r) => sampleIdOfRid(r.rid));
      expect(late, 'turns the old holder started after its lock was lost').toEqual([]);
      const sentWhileTaken = sim
        .stats()
        .requests.filter((r) => r.rid.startsWith('ds/lost-') && r.receivedAtMs > takenMs);
      expect(sentWhileTaken.length).toBeLessThanOrEqual(s.convs.length);

      // The other worker "goes away": the lock lapses, the batch is stalled back to the queue and
      // taken again; the conversations resume at their next turn.
      await conn.del(lockKey);
      const code = await Promise.race([producer.exited, new Promise((r) => setTimeout(() => r('timeout'), 90_000))]);
      expect(code, `${producer.output().slice(-3_000)}\n${worker.output().slice(-2_000)}`).toBe(0);
      await expectCompleteChains(s);
      // Before, the old holder drove the conversations on beside the new one: turns sent twice.
      for (const [id, n] of sends('lost')) expect(n, id).toBe(1);
    } finally {
      producer.child.kill('SIGKILL');
      await stop([worker]);
      await queue.close();
    }
  }, 300_000);

  it('two worker processes racing on the same conversations (every batch delivered twice at once): each turn written once, each chain built on the committed turns', async () => {
    const s = setup('race', 12, 8);
    const producer = spawnCli(['produce', '-c', s.configPath]);
    const workers = [spawnCli(['worker', '-c', s.configPath]), spawnCli(['worker', '-c', s.configPath])];
    // Every batch the producer adds is added again under a second job id as soon as it appears
    // (two deliveries of the same conversations, taken side by side: both send each turn), and a
    // third time a second and a half later (a delivery that picks the conversations up halfway,
    // while the first two still run them: it resumes from the history as turns commit under it).
    const queue = new Queue(generateQueueName('ds'), { connection: redis.connection(), prefix: s.keys.bullPrefix });
    const copied = new Set<string>();
    const late: Promise<unknown>[] = [];
    let copying = true;
    const copier = (async () => {
      while (copying) {
        for (const job of await queue.getJobs(['waiting', 'active', 'prioritized'])) {
          const id = job.id;
          if (id === undefined || /^(copy|late)-/.test(id) || copied.has(id)) continue;
          copied.add(id);
          await queue.add(job.name, job.data, { jobId: `copy-${id}` });
          late.push(
            new Promise((r) => setTimeout(r, 1_500)).then(() => queue.add(job.name, job.data, { jobId: `late-${id}` })),
          );
        }
        await new Promise((r) => setTimeout(r, 10));
      }
      await Promise.all(late);
    })();
    try {
      const code = await Promise.race([producer.exited, new Promise((r) => setTimeout(() => r('timeout'), 150_000))]);
      expect(code, producer.output().slice(-3_000)).toBe(0);
      copying = false;
      await copier;
      await waitFor(
        async () => {
          const c = await queue.getJobCounts('waiting', 'active', 'prioritized', 'delayed');
          return Object.values(c).every((n) => n === 0);
        },
        'the copies processed',
        60_000,
      );
    } finally {
      copying = false;
      await copier;
      await stop(workers);
      await queue.close();
    }
    expect(copied.size).toBeGreaterThan(0);
    await expectCompleteChains(s);
    // The race was real: some turns were sent by both deliveries (one of the two answers lost).
    const twice = [...sends('race').entries()].filter(([, n]) => n >= 2);
    expect(twice.length, 'turns sent by both deliveries').toBeGreaterThan(0);
  }, 300_000);
});
