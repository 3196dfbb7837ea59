// Benchmark: `sglang.concurrency: auto` against a sweep of fixed values. For two server sizes
// (64 and 256 running requests, with different decode-throughput curves T(B)), and a server whose
// throughput falls beyond a batch size (so it never queues), tokenmill runs at
// each fixed concurrency and its steady-state output tokens/s is measured from the simulator's
// `sglang:generation_tokens_total`; then it runs with "auto" until the chosen value settles,
// and the same is measured. The target: auto reaches >= 0.98 of the best fixed value.
import { startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import { endpointConcurrencyKey, loadConfig, type Config } from '../src/shared/index.js';
import { promSum } from '../src/workers/inference/concurrency-probe.js';
import {
  delay,
  fmtInt,
  isMain,
  openBenchEnv,
  round,
  runAsScript,
  startTokenmill,
  waitUntil,
  writePrompts,
  type BenchEnv,
  type BenchResult,
} from './lib.js';

export interface ServerCase {
  name: string;
  maxRunningRequests: number;
  singleRequestTokensPerSec: number;
  peakTokensPerSec: number;
  /** Beyond this batch, throughput falls (simulator options of the same names); default never. */
  declineAboveBatch?: number;
  declinePerRequest?: number;
  /** Fixed concurrencies swept on this server instead of the options' `sweep`. */
  sweep?: number[];
}

export interface ConcurrencyAutoOptions {
  servers: ServerCase[];
  /** Fixed concurrencies swept on each server. */
  sweep: number[];
  timeScale: number;
  meanOutputTokens: number;
  maxNewTokens: number;
  /** Wall ms after the first request before a fixed run is measured, and how long it is measured. */
  warmupMs: number;
  measureMs: number;
  /** `sglang.autoConcurrency` of the auto runs. */
  auto: { min: number; max: number; start: number; intervalMs: number; maxQueued: number };
  /** Wall ms the auto run may take to settle (its value unchanged for `settledMs`) before it is measured anyway. */
  settleTimeoutMs: number;
  settledMs: number;
  prompts: number;
  /** Required ratio of auto's throughput to the best fixed value's. */
  targetRatio: number;
}

export const DEFAULT_CONCURRENCY_AUTO: ConcurrencyAutoOptions = {
  servers: [
    { name: 'small', maxRunningRequests: 64, singleRequestTokensPerSec: 60, peakTokensPerSec: 1_500 },
    { name: 'large', maxRunningRequests: 256, singleRequestTokensPerSec: 40, peakTokensPerSec: 5_000 },
    // Throughput peaks near 110 decoding and falls beyond it (short of KV cache): the server never queues, so only the token rate says where to stop.
    {
      name: 'declining',
      maxRunningRequests: 256,
      singleRequestTokensPerSec: 40,
      peakTokensPerSec: 5_000,
      declineAboveBatch: 96,
      declinePerRequest: 0.005,
      sweep: [64, 128, 256],
    },
  ],
  sweep: [16, 32, 64, 128, 256, 512],
  timeScale: 20,
  meanOutputTokens: 2_700,
  maxNewTokens: 10_240,
  warmupMs: 3_000,
  measureMs: 5_000,
  auto: { min: 8, max: 1024, start: 16, intervalMs: 1_000, maxQueued: 8 },
  settleTimeoutMs: 60_000,
  settledMs: 6_000,
  prompts: 6_000,
  targetRatio: 0.98,
};

/** Output tokens the simulator has decoded so far (its Prometheus counter, counted as tokens are decoded). */
async function decodedTokens(sim: SimulatorHandle): Promise<number> {
  const res = await fetch(`${sim.url}/metrics`);
  return promSum(await res.text(), 'sglang:generation_tokens_total') ?? 0;
}

/** Decoded output tokens per wall second over `ms`. */
async function measureRate(sim: SimulatorHandle, ms: number): Promise<number> {
  const t0 = performance.now();
  const a = await decodedTokens(sim);
  await delay(ms);
  const b = await decodedTokens(sim);
  return (b - a) / ((performance.now() - t0) / 1000);
}

function config(
  env: BenchEnv,
  o: ConcurrencyAutoOptions,
  run: string,
  endpoint: string,
  concurrency: number | 'auto',
  promptFile: string,
): Config {
  return loadConfig({
    baseDir: env.dir,
    object: {
      run,
      redis: { url: env.redis.url, prefix: env.redis.prefix },
      sglang: { endpoints: [endpoint], concurrency, autoConcurrency: o.auto, requestTimeoutMs: 600_000 },
      datasets: [
        { name: 'conc', prompts: promptFile, tokenBudget: 1_000_000_000, maxNewTokens: o.maxNewTokens, batchSize: 64 },
      ],
      output: { dir: `out-${run}` },
      workers: { shutdownGraceMs: 500 },
    },
  });
}

async function withServer<T>(
  o: ConcurrencyAutoOptions,
  s: ServerCase,
  fn: (sim: SimulatorHandle) => Promise<T>,
): Promise<T> {
  const sim = await startSimulator({
    timeScale: o.timeScale,
    maxRunningRequests: s.maxRunningRequests,
    singleRequestTokensPerSec: s.singleRequestTokensPerSec,
    peakTokensPerSec: s.peakTokensPerSec,
    ...(s.declineAboveBatch === undefined
      ? {}
      : { declineAboveBatch: s.declineAboveBatch, declinePerRequest: s.declinePerRequest ?? 0.01 }),
    seed: 7,
    outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma: 0.8 },
  });
  try {
    return await fn(sim);
  } finally {
    await sim.stop();
  }
}

async function fixedRun(
  env: BenchEnv,
  o: ConcurrencyAutoOptions,
  s: ServerCase,
  concurrency: number,
  promptFile: string,
): Promise<number> {
  return withServer(o, s, async (sim) => {
    const gen = await startTokenmill(
      config(env, o, `${s.name}-fixed-${concurrency}`, sim.url, concurrency, promptFile),
    );
    try {
      await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 5);
      await delay(o.warmupMs);
      return await measureRate(sim, o.measureMs);
    } finally {
      await gen.stop();
    }
  });
}

interface AutoRun {
  tokensPerSec: number;
  cap: number;
  settleS: number;
  settled: boolean;
  /** The chosen value as it moved: [seconds since the first request, value]. */
  trajectory: [number, number][];
  reason: string;
  queuedAtEnd: number;
}

async function autoRun(env: BenchEnv, o: ConcurrencyAutoOptions, s: ServerCase, promptFile: string): Promise<AutoRun> {
  return withServer(o, s, async (sim) => {
    const run = `${s.name}-auto`;
    const gen = await startTokenmill(config(env, o, run, sim.url, 'auto', promptFile));
    const key = endpointConcurrencyKey(gen.ctx.keys, sim.url);
    try {
      await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 5);
      const t0 = performance.now();
      const trajectory: [number, number][] = [];
      let lastChangeMs = t0;
      let settled = false;
      while (performance.now() - t0 < o.settleTimeoutMs) {
        const cap = Number(await gen.ctx.redis.hget(key, 'cap'));
        const now = performance.now();
        if (trajectory.length === 0 || trajectory[trajectory.length - 1]?.[1] !== cap) {
          trajectory.push([round((now - t0) / 1000, 1), cap]);
          lastChangeMs = now;
        }
        if (now - lastChangeMs >= o.settledMs) {
          settled = true;
          break;
        }
        await delay(200);
      }
      const settleS = (lastChangeMs - t0) / 1000;
      const tokensPerSec = await measureRate(sim, o.measureMs);
      const h = await gen.ctx.redis.hgetall(key);
      return {
        tokensPerSec,
        cap: Number(h.cap),
        settleS: round(settleS, 1),
        settled,
        trajectory,
        reason: h.reason ?? '',
        queuedAtEnd: sim.stats().queued,
      };
    } finally {
      await gen.stop();
    }
  });
}

export async function concurrencyAuto(o: ConcurrencyAutoOptions = DEFAULT_CONCURRENCY_AUTO): Promise<BenchResult> {
  const t0 = performance.now();
  const env = await openBenchEnv('concurrency-auto');
  try {
    const { file } = writePrompts(env.dir, 'conc', o.prompts);
    const perServer: Record<string, unknown> = {};
    const targets: BenchResult['targets'] = [];
    const summary: string[] = [];
    for (const s of o.servers) {
      const sweep: { concurrency: number; tokensPerSec: number }[] = [];
      for (const c of s.sweep ?? o.sweep)
        sweep.push({ concurrency: c, tokensPerSec: round(await fixedRun(env, o, s, c, file), 0) });
      const best = sweep.reduce((a, b) => (b.tokensPerSec > a.tokensPerSec ? b : a));
      const auto = await autoRun(env, o, s, file);
      const ratio = round(auto.tokensPerSec / best.tokensPerSec, 3);
      perServer[s.name] = {
        server: s,
        sweep,
        best,
        auto: { ...auto, tokensPerSec: round(auto.tokensPerSec, 0) },
        ratio,
      };
      targets.push({
        what: `${s.name} server (${s.maxRunningRequests} running): auto / best fixed throughput`,
        required: `>= ${o.targetRatio}`,
        measured: ratio.toFixed(3),
        met: ratio >= o.targetRatio,
      });
      summary.push(
        `${s.name} (max_running_requests ${s.maxRunningRequests}, T(1) ${s.singleRequestTokensPerSec}, peak ${s.peakTokensPerSec} tok/s simulated${s.declineAboveBatch === undefined ? '' : `, falling ${(s.declinePerRequest ?? 0.01) * 100}% a request beyond ${s.declineAboveBatch}`}, x${o.timeScale}):`,
        `  fixed: ${sweep.map((x) => `${x.concurrency} → ${fmtInt(x.tokensPerSec)}`).join(', ')} tok/s (best ${best.concurrency})`,
        `  auto: chose ${auto.cap} ${auto.settled ? `(settled after ${auto.settleS} s)` : '(still moving at the timeout)'}, ${fmtInt(auto.tokensPerSec)} tok/s = ${ratio.toFixed(3)} of the best; server queue at the end ${auto.queuedAtEnd}`,
        `  path: ${auto.trajectory.map(([t, c]) => `${t}s:${c}`).join(' ')}`,
      );
    }
    return {
      name: 'concurrency-auto',
      ok: targets.every((t) => t.met),
      targets,
      metrics: { ...perServer, timeScale: o.timeScale, auto: o.auto },
      summary,
      wallS: round((performance.now() - t0) / 1000, 1),
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => concurrencyAuto());
