/**
 * A gateway that allows GET only: `/model_info` and the health checks answer 200, `POST
 * /generate` 403. The endpoint leaves the rotation once and stays out, tried again with a real
 * `POST /generate` after growing waits — not back on the next health check (it was 608 requests
 * in 10 s and 182 out-of-rotation / back cycles a minute, each an error line) — and is back
 * once the POST works.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, waitFor, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 21,
    contextLength: 2048,
    outputLength: { distribution: 'fixed', mean: 16 },
  },
  tmp: 'tm-backoff-',
  cli: true,
});

const count = (text: string, re: RegExp): number => text.split('\n').filter((l) => re.test(l)).length;

describe('an endpoint that refuses POST /generate (403) while GETs work', () => {
  it('leaves the rotation once, is tried with growing waits, one line per change; back when the POST works', async () => {
    const dir = path.join(tmp.dir, 'gateway');
    mkdirSync(dir, { recursive: true });
    writePrompts(dir, 'g', 12);
    const cfg = writeTestConfig(dir, {
      run: 'gateway',
      redis,
      sim,
      sglang: { concurrency: 8, contextLength: 2048, healthCheckIntervalMs: 200 },
      datasets: [{ name: 'g', prompts: 'g.jsonl', tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 4 }],
    });
    sim.resetStats();
    sim.setFaults({ statusPost: 403 });
    const run = spawnCli(['run', '-c', cfg]);
    try {
      await waitFor(() => sim.stats().requestsReceived > 0, 'a POST /generate refused', 30_000);
      const firstRefusedMs = Date.now();
      await waitFor(() => /endpoint out of rotation/.test(run.output()), 'the endpoint taken out of rotation', 15_000);
      // A window in which the refusals must stay few (the point): about 25 health checks' worth.
      await new Promise((r) => setTimeout(r, 5_000));
      const refused = sim.stats().requestsReceived;
      const out = run.output();
      const seconds = (Date.now() - firstRefusedMs) / 1000;
      // The first wave (up to the concurrency) plus probes at 1, 2, 4 s: far from dozens.
      expect(refused, `${refused} POSTs in ${seconds}s`).toBeLessThanOrEqual(8 + 6);
      expect(count(out, /endpoint out of rotation/)).toBe(1);
      expect(count(out, /back in rotation/)).toBe(0);
      expect(count(out, /"level":50.*answered 403 Forbidden to POST \/generate/), out).toBeLessThanOrEqual(2);
      const keys = new RunKeys(redis.prefix, 'gateway');
      expect(await redis.connection('client').hlen(keys.failed('g'))).toBe(0);

      // The gateway fixed: the next try (at most a minute away) brings it back and the run ends.
      sim.setFaults({ statusPost: null });
      await waitFor(() => /back in rotation/.test(run.output()), 'the endpoint back in rotation', 75_000, 200);
      expect(await run.exited, run.output()).toBe(0);
      expect(readGenerations(path.join(dir, 'out', 'gateway'), 'g')).toHaveLength(12);
      expect(count(run.output(), /back in rotation/)).toBe(1);
    } finally {
      sim.clearFaults();
      run.child.kill('SIGKILL');
    }
  }, 150_000);
});
