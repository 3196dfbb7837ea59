// The process groups a dead worker left (its training command, its eval servers) are killed by
// the next worker only when the pid read back from Redis is still that process: real process
// groups, a real train worker and a real eval worker. A group whose pid is recorded with another
// start time — as after a restart, when the pid belongs to an unrelated process — is left alone;
// a genuine leftover is killed.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EVAL_QUEUE, EvalKeys, TrainKeys } from '../../src/shared/index.js';
import { EvalWorker, writeEvalStatus } from '../../src/workers/index.js';
import { writeStatus } from '../../src/workers/train/train-jobs.js';
import { waitFor } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';
import { alive, fakeTrainer, startTrainHarness, type TrainHarness } from '../helpers/train.js';

/** A `sleep` as the leader of its own process group, with a second member. */
function spawnGroup(): number {
  const child = spawn('sh', ['-c', 'sleep 600 & exec sleep 600'], { detached: true, stdio: 'ignore' });
  child.unref();
  const pid = child.pid ?? 0;
  groups.push(pid);
  return pid;
}
const groups: number[] = [];

/** The record a worker writes with a pid (left-groups.ts): start time (field 22), boot id, host. */
function identityOf(pid: number, startOffset = 0): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const start = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
  const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  return `pid ${pid} start ${start + startOffset} boot ${boot} host ${hostname()}`;
}

/** Whether any process of the group is alive (zombies do not count). */
function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
  } catch {
    return false;
  }
  return alive(pgid);
}

describe.runIf(process.platform === 'linux')('process groups left by a dead worker', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    h = await startTrainHarness();
  });
  afterAll(async () => {
    for (const pid of groups) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone already
      }
    }
    await h?.close();
  });

  it('train: the recorded group is killed when its leader is that process, not when the pid is another one', async () => {
    const config = h.config({ command: fakeTrainer('--steps', '2'), gpus: 0, mode: 'from-scratch', autoResume: false });
    const conn = h.redis.connection();
    const tk = new TrainKeys(h.keys);
    const runAsDead = async (pgid: number, identity: string): Promise<void> => {
      // No worker is up while the job is queued and its status written.
      const jobId = await h.queue(config);
      // As a worker that died while running it left the status: running, on this host, this group.
      await writeStatus(
        conn,
        h.keys,
        jobId,
        { state: 'running', worker: 'gone:1', host: hostname(), pid: pgid, pidIdentity: identity, attempt: '0001' },
        'in_progress',
        true,
      );
      expect(await conn.hget(tk.status(), 'jobId')).toBe(jobId);
      const worker = await h.worker();
      try {
        expect((await h.wait(jobId, 45_000)).status).toBe('failed');
      } finally {
        await worker.stop();
      }
    };
    // The pid now belongs to an unrelated process group: recorded with another start time.
    const unrelated = spawnGroup();
    await runAsDead(unrelated, identityOf(unrelated, -100));
    expect(groupAlive(unrelated)).toBe(true);
    // A genuine leftover: recorded as it is.
    const leftover = spawnGroup();
    await runAsDead(leftover, identityOf(leftover));
    await waitFor(() => !groupAlive(leftover), 'the leftover group to be killed', 10_000);
  }, 120_000);

  it('eval: of the servers recorded, only the one still the same process is killed', async () => {
    const config = h.config({ command: fakeTrainer('--steps', '2'), gpus: 0, mode: 'from-scratch' });
    const conn = h.redis.connection();
    const worker = new EvalWorker({
      redisUrl: h.redis.url,
      keys: h.keys,
      config,
      loadTokenizer: () => Promise.reject(new Error('not measured in this test')),
      lockDurationMs: 5_000,
      stalledIntervalMs: 5_000,
      logger: quietLogger(),
    });
    const queue = new Queue(EVAL_QUEUE, { connection: conn, prefix: h.keys.bullPrefix });
    try {
      const unrelated = spawnGroup();
      const leftover = spawnGroup();
      const jobId = 'r1-train-99-eval';
      await writeEvalStatus(
        conn,
        h.keys,
        jobId,
        {
          state: 'running',
          host: hostname(),
          servers: `drafter http://127.0.0.1:30000 pid ${leftover}\nbaseline http://127.0.0.1:30001 pid ${unrelated}`,
          serverGroups: `${identityOf(leftover)}\n${identityOf(unrelated, -100)}`,
        },
        'in_progress',
        true,
      );
      expect(await conn.hget(new EvalKeys(h.keys).status(), 'jobId')).toBe(jobId);
      // The job run again (its payload is not measured here: it fails after the leftovers are handled).
      await queue.add('eval', {}, { jobId, attempts: 1 });
      await worker.start();
      await waitFor(async () => (await queue.getJobState(jobId)) === 'failed', 'the eval job to end', 30_000);
      await waitFor(() => !groupAlive(leftover), 'the leftover server group to be killed', 10_000);
      expect(groupAlive(unrelated)).toBe(true);
    } finally {
      await worker.stop();
      await queue.close();
    }
  }, 60_000);
});
