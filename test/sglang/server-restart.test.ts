// A real SGLang server kill -9'd (its whole process group) mid-run and started again on the same
// port: the run waits out the outage and completes with 0 failed prompts, each prompt once in the
// files and the counters equal to the files; `concurrency: auto` measures the new server's
// /metrics again (it answers without the gauges for a moment after start).
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import {
  endpointConcurrencyKey,
  parseEndpointConcurrency,
  readRunStatus,
  type EndpointConcurrency,
} from '../../src/shared/index.js';
import { loadTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, waitFor, writePrompts } from '../helpers/pipeline.js';
import { killServerOnPort, modelDir, realSglang, skipReason, startRealSglang } from '../helpers/real-sglang.js';

const skip = skipReason();
const PROMPTS = 60;

describe.skipIf(skip !== '')(
  `a real SGLang 0.5.23 killed and restarted mid-run${skip === '' ? '' : ` (skipped: ${skip})`}`,
  () => {
    const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-sglang-restart-', cli: true });

    it('kill -9 of the server group mid-run, restart on the same port: 0 failed, each prompt once, counters equal to the files, auto measures again', async () => {
      const { url, port, dir } = realSglang();
      writePrompts(tmp.dir, 'restart', PROMPTS);
      const cfg = loadTestConfig(tmp.dir, {
        run: 'restart',
        redis,
        sim: url,
        sglang: {
          concurrency: 'auto',
          autoConcurrency: { min: 2, max: 32, start: 4, intervalMs: 700, maxQueued: 4 },
          requestTimeoutMs: 120_000,
          healthCheckIntervalMs: 1_000,
        },
        tokenizer: { path: modelDir(dir) },
        datasets: [
          {
            name: 'ds',
            prompts: 'restart.jsonl',
            tokenBudget: 1_000_000_000,
            maxNewTokens: 16,
            batchSize: 4,
            sampling: { temperature: 1, top_k: 20 },
          },
        ],
        workers: { shutdownGraceMs: 2_000 },
      });
      const ctx = await openRunContextFor(cfg);
      const key = endpointConcurrencyKey(ctx.keys, url);
      const seen: EndpointConcurrency[] = [];
      const poll = setInterval(() => {
        void ctx.redis
          .hgetall(key)
          .then((h) => {
            const c = parseEndpointConcurrency(h);
            const last = seen[seen.length - 1];
            if (c !== undefined && (last === undefined || last.updatedMs !== c.updatedMs)) seen.push(c);
          })
          .catch(() => undefined);
      }, 100);
      const handle = await startGeneration(ctx, { produce: true, infer: true });
      const records = async (): Promise<number> => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0);
      let restartedAtMs = 0;
      let killedAt = 0;
      try {
        await waitFor(async () => (await records()) >= 8, 'the first records', 120_000, 100);
        await killServerOnPort(port, dir);
        killedAt = await records();
        // Out for a few seconds (and the start of the new one, ~30-60 s, on top).
        await new Promise((r) => setTimeout(r, 3_000));
        const again = await startRealSglang({ dir, port });
        restartedAtMs = Date.now();
        expect(again.url).toBe(url);
        await handle.finished;
      } finally {
        clearInterval(poll);
        await handle.stop();
      }
      try {
        expect(killedAt).toBeLessThan(PROMPTS);
        const files = readGenerations(ctx.runDir, 'ds');
        expect(files).toHaveLength(PROMPTS);
        expect(duplicates(files.map((r) => r.id))).toEqual([]);
        const stats = await ctx.redis.hgetall(ctx.keys.stats('ds'));
        expect(Number(stats['records'])).toBe(PROMPTS);
        expect(Number(stats['outputTokens'])).toBe(files.reduce((a, r) => a + r.completion_tokens, 0));
        const status = await readRunStatus(ctx.redis, ctx.keys, cfg);
        expect(status.datasets[0]?.failed).toBe(0);
        expect(status.datasets[0]?.status).toBe('completed');
        // The controller kept steering after the restart: a measurement of the new server's decode rate.
        const after = seen.filter((c) => c.updatedMs > restartedAtMs && c.tokensPerSec !== null && c.tokensPerSec > 0);
        expect(
          after.length,
          JSON.stringify(seen.map((c) => [c.updatedMs - restartedAtMs, c.cap, c.tokensPerSec, c.reason])),
        ).toBeGreaterThan(0);
      } finally {
        await ctx.close();
      }
    }, 400_000);
  },
);
