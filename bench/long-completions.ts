// Benchmark: output tokens/s with long-tailed completions (lognormal, sigma 1.0, up to 10,240
// tokens), 64 requests in flight, tokenmill against the hand-written semaphore loop on the same
// prompts and the same simulator settings. Both are measured over the same window: from a
// warm-up's end to a fixed simulated time later, while every prompt has not yet been sent (no
// drain tail), counting the tokens the server decoded in it (completed requests plus the
// progress of those running at each end), so that a long completion straddling an edge counts
// only its part inside.
import path from 'node:path';
import { request } from 'undici';
import { startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import { bundledTokenizerPath, loadTokenizer, readPromptFile } from '../src/shared/index.js';
import type { TokenizedPrompt } from './clients/batch-and-wait.js';
import { runSemaphoreLoop } from './clients/semaphore-loop.js';
import {
  benchConfig,
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

export interface LongCompletionsOptions {
  slots: number;
  meanOutputTokens: number;
  sigma: number;
  maxNewTokens: number;
  timeScale: number;
  /** Simulated seconds from the first request to the window's start. */
  warmupSimS: number;
  /** Simulated seconds of the window. */
  windowSimS: number;
  prompts: number;
  /** Pairs of runs (tokenmill, then the loop; the next pair in the other order). */
  pairs: number;
  /** Required tokenmill / loop ratio of output tokens/s. */
  targetRatio: number;
}

export const DEFAULT_LONG_COMPLETIONS: LongCompletionsOptions = {
  slots: 64,
  meanOutputTokens: 2700,
  sigma: 1.0,
  maxNewTokens: 10_240,
  timeScale: 100,
  warmupSimS: 1_000,
  windowSimS: 3_000,
  // T(64) is ~1,700 tok/s: ~2,500 prompts cover warm-up and window; the rest keeps the slots full past it.
  prompts: 3_600,
  pairs: 1,
  targetRatio: 0.97,
};

/** BENCH_LONG_TIME_SCALE and BENCH_LONG_PAIRS override the defaults. */
export function longCompletionsOptionsFromEnv(env: NodeJS.ProcessEnv = process.env): LongCompletionsOptions {
  const o = { ...DEFAULT_LONG_COMPLETIONS };
  const ts = Number(env['BENCH_LONG_TIME_SCALE'] ?? NaN);
  if (Number.isFinite(ts) && ts > 0) o.timeScale = ts;
  const pairs = Number(env['BENCH_LONG_PAIRS'] ?? NaN);
  if (Number.isInteger(pairs) && pairs > 0) o.pairs = pairs;
  return o;
}

const SAMPLING = { temperature: 0.6, top_p: 0.95 };

type Client = 'tokenmill' | 'semaphore';

interface WindowRun {
  client: Client;
  /** Decoded tokens per simulated second over the window. */
  tokensPerSimS: number;
  windowTokens: number;
  /** Time-weighted mean running requests over the window. */
  meanRunning: number;
  requestsAtWindowEnd: number;
}

/**
 * Tokens the server has decoded so far: completed requests' tokens plus the progress of those
 * running (`/get_load` num_tokens, less their prompt tokens). Read again when a request
 * completed between the two reads.
 */
async function decodedTokens(sim: SimulatorHandle, promptTokensMean: number): Promise<number> {
  for (;;) {
    const before = sim.stats().outputTokensTotal;
    const res = await request(`${sim.url}/get_load`);
    const [load] = (await res.body.json()) as { num_reqs: number; num_waiting_reqs: number; num_tokens: number }[];
    const after = sim.stats();
    if (after.outputTokensTotal === before && load !== undefined) {
      const running = load.num_reqs - load.num_waiting_reqs;
      return after.outputTokensTotal + load.num_tokens - running * promptTokensMean;
    }
  }
}

async function measureWindow(
  o: LongCompletionsOptions,
  sim: SimulatorHandle,
  client: Client,
  promptTokensMean: number,
): Promise<WindowRun> {
  await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 2);
  await delay((o.warmupSimS * 1000) / o.timeScale);
  const sentInWarmup = sim.stats().requestsReceived;
  sim.resetStats();
  const t0 = performance.now();
  const d0 = await decodedTokens(sim, promptTokensMean);
  await delay((o.windowSimS * 1000) / o.timeScale);
  const d1 = await decodedTokens(sim, promptTokensMean);
  const t1 = performance.now();
  const st = sim.stats();
  const requests = sentInWarmup + st.requestsReceived;
  const simS = ((t1 - t0) / 1000) * o.timeScale;
  return {
    client,
    tokensPerSimS: round((d1 - d0) / simS, 1),
    windowTokens: Math.round(d1 - d0),
    meanRunning: round(st.occupancy.meanRunning, 2),
    requestsAtWindowEnd: requests,
  };
}

function startSim(o: LongCompletionsOptions): Promise<SimulatorHandle> {
  return startSimulator({
    timeScale: o.timeScale,
    maxRunningRequests: o.slots,
    seed: 3,
    outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma: o.sigma },
  });
}

async function runTokenmill(
  env: BenchEnv,
  o: LongCompletionsOptions,
  run: string,
  promptTokensMean: number,
): Promise<WindowRun> {
  const sim = await startSim(o);
  try {
    const config = benchConfig(env, {
      run,
      endpoint: sim.url,
      concurrency: o.slots,
      datasets: [
        {
          name: 'long',
          prompts: 'long.jsonl',
          tokenBudget: 1_000_000_000,
          maxNewTokens: o.maxNewTokens,
          sampling: SAMPLING,
        },
      ],
    });
    const gen = await startTokenmill(config);
    try {
      return await measureWindow(o, sim, 'tokenmill', promptTokensMean);
    } finally {
      await gen.stop();
    }
  } finally {
    await sim.stop();
  }
}

async function runLoop(
  env: BenchEnv,
  o: LongCompletionsOptions,
  run: string,
  prompts: TokenizedPrompt[],
  promptTokensMean: number,
): Promise<WindowRun> {
  const sim = await startSim(o);
  try {
    // Ids of their own per run: the simulator draws each completion's length from its rid.
    const own = prompts.map((p) => ({ id: `${run}/${p.id}`, inputIds: p.inputIds }));
    const loop = runSemaphoreLoop({
      urls: [sim.url],
      slots: o.slots,
      prompts: own,
      samplingParams: { ...SAMPLING, max_new_tokens: o.maxNewTokens },
      outFile: path.join(env.dir, `${run}.jsonl`),
    });
    // On a failed measurement the simulator stops under the loop, which then rejects.
    loop.catch(() => undefined);
    const result = await measureWindow(o, sim, 'semaphore', promptTokensMean);
    await loop;
    return result;
  } finally {
    await sim.stop();
  }
}

export async function longCompletions(
  o: LongCompletionsOptions = longCompletionsOptionsFromEnv(),
): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('long');
  try {
    const { file } = writePrompts(env.dir, 'long', o.prompts);
    const tokenizer = await loadTokenizer(bundledTokenizerPath());
    const prompts: TokenizedPrompt[] = [];
    for await (const line of readPromptFile(file)) {
      if (line.ok) prompts.push({ id: line.record.id, inputIds: tokenizer.encodePrompt(line.record.messages) });
    }
    const promptTokensMean = prompts.reduce((a, p) => a + p.inputIds.length, 0) / Math.max(1, prompts.length);
    const runs: WindowRun[] = [];
    for (let pair = 0; pair < o.pairs; pair += 1) {
      const order: Client[] = pair % 2 === 0 ? ['tokenmill', 'semaphore'] : ['semaphore', 'tokenmill'];
      for (const client of order) {
        const run = `${client}-${pair}`;
        const r =
          client === 'tokenmill'
            ? await runTokenmill(env, o, run, promptTokensMean)
            : await runLoop(env, o, run, prompts, promptTokensMean);
        if (r.requestsAtWindowEnd >= o.prompts)
          throw new Error(`${client}: every prompt was sent before the window ended; raise prompts above ${o.prompts}`);
        runs.push(r);
      }
    }
    const mean = (c: Client): number => {
      const xs = runs.filter((r) => r.client === c).map((r) => r.tokensPerSimS);
      return xs.reduce((a, x) => a + x, 0) / Math.max(1, xs.length);
    };
    const tm = mean('tokenmill');
    const loop = mean('semaphore');
    const ratio = tm / loop;
    const summary = [
      `${o.slots} in flight, lognormal completions (mean ${o.meanOutputTokens}, sigma ${o.sigma}, max ${fmtInt(o.maxNewTokens)}), timeScale ${o.timeScale}; window ${o.windowSimS} simulated s after a ${o.warmupSimS} s warm-up, tokens decoded in it`,
      ...runs.map(
        (r) =>
          `${r.client}: ${fmtInt(r.tokensPerSimS)} output tok/s (simulated), ${fmtInt(r.windowTokens)} tokens in the window, ${r.meanRunning}/${o.slots} running`,
      ),
      `tokenmill / semaphore loop: ${ratio.toFixed(3)}`,
    ];
    return {
      name: 'long-completions',
      ok: ratio >= o.targetRatio,
      targets: [
        {
          what: 'tokenmill output tokens/s / semaphore loop',
          required: `>= ${o.targetRatio}`,
          measured: ratio.toFixed(3),
          met: ratio >= o.targetRatio,
        },
      ],
      metrics: {
        config: o,
        runs,
        tokenmillTokensPerSimS: round(tm, 1),
        loopTokensPerSimS: round(loop, 1),
        ratio: round(ratio, 4),
      },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => longCompletions());
