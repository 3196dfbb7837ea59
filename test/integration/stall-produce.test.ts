// The stall watchdog runs in the producer's process (`produce`, `run`): with batches queued, an
// endpoint reported healthy and no inference worker taking them, `produce` logs an error naming
// the dataset and the counts after `workers.stallAfterMs`, `status` shows it, and SIGTERM
// withdraws the record.
import { describe, expect, it } from 'vitest';
import { RunKeys, writeEndpointHealth, type RunStatus } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const EP = 'http://127.0.0.1:39998';

const { redis, tmp } = useHarness({ redis: true, tmp: true, cli: true });

async function cliOk(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  if (code !== 0) throw new Error(`tokenmill ${args.join(' ')} exited ${code}:\n${p.output()}`);
  return p.output();
}

describe('stall watchdog in `produce`', () => {
  it('reports a dataset whose batches nobody takes while an endpoint is healthy', async () => {
    writePrompts(tmp.dir, 'alpha', 20);
    const configPath = writeTestConfig(tmp.dir, {
      run: 'stallcli',
      redis,
      sim: EP,
      sglang: { concurrency: 4, contextLength: 4096 },
      workers: { stallAfterMs: 1_000, windowBatches: 3 },
      datasets: [{ name: 'alpha', prompts: 'alpha.jsonl', tokenBudget: 10_000, maxNewTokens: 32, batchSize: 8 }],
    });
    const keys = new RunKeys(redis.prefix, 'stallcli');
    const conn = redis.connection('client');
    // An inference worker reports the endpoint healthy, but takes no batch (the bug case).
    const now = Date.now();
    await writeEndpointHealth(conn, keys, [
      {
        url: EP,
        up: true,
        reason: null,
        sinceMs: now,
        worker: 'silent:1',
        updatedMs: now,
        expiresMs: now + 10 * 60_000,
      },
    ]);

    const produce = spawnCli(['produce', '-c', configPath]);
    try {
      await waitFor(
        () =>
          /"msg":"dataset alpha stalled for \d+s: 3 batch job\(s\) pending \(3 waiting, 0 active\), 0 requests in flight, 1\/1 endpoints healthy"/.test(
            produce.output(),
          ),
        'the stall error from produce',
        30_000,
      );
      const line =
        produce
          .output()
          .split('\n')
          .find((l) => l.includes('dataset alpha stalled')) ?? '';
      expect(JSON.parse(line)).toMatchObject({
        level: 50,
        dataset: 'alpha',
        waiting: 3,
        active: 0,
        inFlight: 0,
        healthyEndpoints: 1,
        totalEndpoints: 1,
      });

      const [json, table] = await Promise.all([
        cliOk(['status', '-c', configPath, '--json']),
        cliOk(['status', '-c', configPath]),
      ]);
      const status = JSON.parse(json.trim().split('\n').at(-1) ?? '{}') as RunStatus;
      expect(status.datasets[0]?.status).toMatch(/^(pending|in_progress)$/);
      expect(status.datasets[0]?.stalled?.reason).toBe(
        '3 batch job(s) pending (3 waiting, 0 active), 0 requests in flight, 1/1 endpoints healthy',
      );
      expect(table).toMatch(/\n! alpha stalled for \d+s: 3 batch job\(s\) pending/);
    } finally {
      produce.child.kill('SIGTERM');
    }
    await produce.exited;
    expect(await conn.hexists(keys.stalls(), 'alpha')).toBe(0);
  });
});
