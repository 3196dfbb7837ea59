// tokenmill's generation stage against a real SGLang 0.5.23: `concurrency: auto` steered by the
// server's real /metrics, `budget: strict` (streamed requests, stopped with the real
// /abort_request at the budget), and `tokenmill pause` / `resume` of a dataset mid-run. Every
// run ends with each prompt once in the files and the counters equal to the files.
import { describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../../src/cli/run-context.js';
import {
  endpointConcurrencyKey,
  loadConfig,
  parseEndpointConcurrency,
  readRunStatus,
  type ConfigInput,
  type EndpointConcurrency,
} from '../../src/shared/index.js';
import { ServerLoadProbe } from '../../src/workers/inference/concurrency-probe.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { modelDir, realSglang, skipReason } from '../helpers/real-sglang.js';

const skip = skipReason();
// top_k sampling: top_p < 1 is ~10x slower on this CPU.
const SAMPLING = { temperature: 1, top_k: 20 };

describe.skipIf(skip !== '')(
  `generation against a real SGLang 0.5.23${skip === '' ? '' : ` (skipped: ${skip})`}`,
  () => {
    const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-sglang-', cli: true });

    function configInput(
      run: string,
      n: number,
      dataset: Record<string, unknown>,
      sglang: Record<string, unknown>,
    ): ConfigInput {
      writePrompts(tmp.dir, run, n);
      return {
        run,
        redis: { url: redis.url, prefix: redis.prefix },
        sglang: {
          endpoints: [realSglang().url],
          concurrency: 8,
          requestTimeoutMs: 120_000,
          healthCheckIntervalMs: 1_000,
          ...sglang,
        },
        tokenizer: { path: modelDir(realSglang().dir) },
        datasets: [
          {
            name: 'ds',
            prompts: `${run}.jsonl`,
            tokenBudget: 1_000_000_000,
            maxNewTokens: 16,
            batchSize: 8,
            sampling: SAMPLING,
            ...dataset,
          },
        ],
        output: { dir: `out-${run}` },
        workers: { shutdownGraceMs: 2_000 },
      } as ConfigInput;
    }

    /** Each prompt at most once in the files, the counters equal to the files; returns the records. */
    async function expectExactlyOnce(
      ctx: RunContext,
      prompts: number | undefined,
    ): Promise<ReturnType<typeof readGenerations>> {
      const records = readGenerations(ctx.runDir, 'ds');
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      if (prompts !== undefined) expect(records).toHaveLength(prompts);
      const stats = await ctx.redis.hgetall(ctx.keys.stats('ds'));
      expect(Number(stats['records'])).toBe(records.length);
      expect(Number(stats['outputTokens'])).toBe(records.reduce((a, r) => a + r.completion_tokens, 0));
      for (const r of records) {
        expect(r.output_ids).toHaveLength(r.completion_tokens);
        expect(r.output_ids.every((id) => id >= 0 && id < 151_669)).toBe(true);
      }
      const status = await readRunStatus(ctx.redis, ctx.keys, ctx.config);
      expect(status.datasets[0]?.failed).toBe(0);
      return records;
    }

    it('concurrency: auto reads the real /metrics and adjusts; every prompt once', async () => {
      const cfg = loadConfig({
        baseDir: tmp.dir,
        object: configInput(
          'auto',
          100,
          {},
          { concurrency: 'auto', autoConcurrency: { min: 2, max: 64, start: 4, intervalMs: 700, maxQueued: 4 } },
        ),
      });
      const ctx = await openRunContextFor(cfg);
      const key = endpointConcurrencyKey(ctx.keys, realSglang().url);
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
      try {
        await handle.finished;
      } finally {
        clearInterval(poll);
        await handle.stop();
      }
      try {
        await expectExactlyOnce(ctx, 100);
        // The controller measured the server: its decode rate from sglang:generation_tokens_total and
        // its running requests from sglang:num_running_reqs, and moved the cap on them.
        const measured = seen.filter((c) => c.tokensPerSec !== null && c.tokensPerSec > 0);
        expect(measured.length, JSON.stringify(seen)).toBeGreaterThan(0);
        expect(
          seen.some((c) => c.running > 0),
          JSON.stringify(seen),
        ).toBe(true);
        expect(seen.every((c) => c.controller !== null && /:\d+$/.test(c.controller))).toBe(true);
        expect(
          new Set(seen.map((c) => c.cap)).size,
          JSON.stringify(seen.map((c) => [c.cap, c.reason])),
        ).toBeGreaterThan(1);
        expect(seen.every((c) => c.cap >= 2 && c.cap <= 64)).toBe(true);
      } finally {
        await ctx.close();
      }
    });

    it('budget: strict: streamed requests stopped with the real /abort_request at the budget, partial outputs committed, the server left idle', async () => {
      // The model never emits EOS: every completion is 128 tokens. The first 4 requests are expected to
      // end at 512 tokens, below the budget; the 5th starts alone (one always starts while nothing is in
      // flight and the budget is not met), crosses the budget at its 16th token and must be aborted then,
      // with over 100 tokens still to go.
      const budget = 4 * 128 + 16;
      const concurrency = 4;
      const cfg = loadConfig({
        baseDir: tmp.dir,
        object: configInput(
          'strict',
          50,
          { tokenBudget: budget, budget: 'strict', budgetMarginSd: 0, maxNewTokens: 128 },
          { concurrency },
        ),
      });
      const ctx = await openRunContextFor(cfg);
      const handle = await startGeneration(ctx, { produce: true, infer: true });
      const started = Date.now();
      try {
        await handle.finished;
      } finally {
        await handle.stop();
      }
      try {
        const records = await expectExactlyOnce(ctx, undefined);
        const stats = await ctx.redis.hgetall(ctx.keys.stats('ds'));
        const total = Number(stats['outputTokens']);
        const stopTokens = Number(stats['budgetStopTokens']);
        expect(total).toBeGreaterThanOrEqual(budget);
        expect(stopTokens).toBeGreaterThanOrEqual(budget);
        expect(total).toBeGreaterThanOrEqual(stopTokens);
        // What strict promises: beyond the stop's count, only what the requests in flight decoded in the
        // stop's round trip (at most 4 requests × 150 tokens/s, above one request's speed on this CPU, × 2 s).
        expect(total - stopTokens).toBeLessThanOrEqual(concurrency * 150 * 2);
        // Each aborted record stopped short of its 128 tokens: the server cut it.
        expect(records.filter((r) => r.finish_reason.type === 'abort').every((r) => r.completion_tokens < 128)).toBe(
          true,
        );
        const aborted = records.filter((r) => r.finish_reason.type === 'abort');
        expect(
          aborted.length,
          JSON.stringify({
            total,
            stopTokens,
            records: records.length,
            reasons: records.map((r) => `${r.finish_reason.type}:${r.completion_tokens}`).slice(-12),
          }),
        ).toBeGreaterThan(0);
        for (const r of aborted) expect(r.completion_tokens).toBeGreaterThan(0);
        // Nothing of the run is still decoding on the server.
        const probe = new ServerLoadProbe(realSglang().url);
        await waitFor(
          async () => (await probe.read()).running === 0,
          'the server to have no request running',
          10_000,
          200,
        );
        expect(Date.now() - started).toBeLessThan(120_000);
        expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets[0]?.status).toBe('completed');
      } finally {
        await ctx.close();
      }
    });

    it('tokenmill pause stops the dataset mid-run (requests in flight finish, nothing new is sent); resume sends the rest once', async () => {
      // 120 prompts of 48 tokens each (the model never stops early): the run lasts several times the
      // seconds the `pause` command takes to start, so the pause lands mid-run on a loaded machine too.
      const input = configInput('pause', 120, { maxNewTokens: 48, batchSize: 4 }, { concurrency: 4 });
      const cfgPath = writeConfig(tmp.dir, input, 'pause.yaml');
      const cfg = loadConfig({ baseDir: tmp.dir, object: input });
      const ctx = await openRunContextFor(cfg);
      const handle = await startGeneration(ctx, { produce: true, infer: true });
      const records = async (): Promise<number> => Number((await ctx.redis.hget(ctx.keys.stats('ds'), 'records')) ?? 0);
      try {
        await waitFor(async () => (await records()) >= 4, 'the dataset generating', 120_000, 100);
        const pause = spawnCli(['pause', '-c', cfgPath, 'ds']);
        expect(await pause.exited, pause.output()).toBe(0);
        // In-flight requests finish (48 tokens each: well within 15 s here), then the count holds.
        await waitFor(
          async () => (await ctx.redis.zcount(ctx.keys.inflight('ds'), Date.now(), '+inf')) === 0,
          'requests in flight to finish',
          15_000,
          100,
        );
        const paused = await records();
        await new Promise((r) => setTimeout(r, 3_000));
        expect(await records(), 'records committed while paused').toBe(paused);
        expect(paused).toBeLessThan(120);
        expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets[0]?.status).toBe('paused');
        const resume = spawnCli(['resume', '-c', cfgPath, 'ds']);
        expect(await resume.exited, resume.output()).toBe(0);
        await handle.finished;
      } finally {
        await handle.stop();
      }
      try {
        await expectExactlyOnce(ctx, 120);
        expect((await readRunStatus(ctx.redis, ctx.keys, cfg)).datasets[0]?.status).toBe('completed');
      } finally {
        await ctx.close();
      }
    });
  },
);
