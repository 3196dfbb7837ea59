// Benchmark: the simulator's speculative decoding (EAGLE3) against the same simulator without
// it. A client keeps a fixed number of /generate requests in flight (input_ids, lognormal
// completions, the same rids on every server, so the same completions), and the output tokens
// the server decoded in a window of steady state (`sglang:generation_tokens_total` after a
// warm-up, while requests keep coming: no drain tail) give tok/s for a good drafter, a weak one
// and no drafter. Speculation should scale tok/s by accept length / (1 + draftOverhead); the
// prediction is computed from the answers' own `spec_verify_ct` and `completion_tokens`.
import { startSimulator, type SimulatorHandle, type SimulatorOptions } from '../src/sim/index.js';
import { promSum } from '../src/workers/inference/concurrency-probe.js';
import { delay, fmtInt, installBenchLogger, isMain, round, runAsScript, type BenchResult } from './lib.js';

export interface SimSpeculativeOptions {
  /** Requests in flight, always (below the server's slots: nothing queues). */
  concurrency: number;
  maxRunningRequests: number;
  timeScale: number;
  meanOutputTokens: number;
  sigma: number;
  maxNewTokens: number;
  /** Simulated seconds from the first request to the window's start, and of the window. */
  warmupSimS: number;
  windowSimS: number;
  draftOverhead: number;
  numSteps: number;
  /** Mean accept lengths (tokens per verify step) of the two drafters. */
  goodAcceptLength: number;
  weakAcceptLength: number;
  /** Largest allowed |measured / predicted − 1| of the tok/s ratio. */
  tolerance: number;
}

export const DEFAULT_SIM_SPECULATIVE: SimSpeculativeOptions = {
  concurrency: 32,
  maxRunningRequests: 64,
  timeScale: 20,
  // Long completions: few answers a wall second, so the client's gap between two requests barely counts.
  meanOutputTokens: 2000,
  sigma: 0.8,
  maxNewTokens: 8192,
  warmupSimS: 100,
  windowSimS: 400,
  draftOverhead: 0.25,
  numSteps: 3,
  goodAcceptLength: 3.0,
  weakAcceptLength: 1.15,
  tolerance: 0.05,
};

interface Run {
  label: string;
  /** Output tokens decoded per simulated second over the window. */
  tokensPerSimS: number;
  windowTokens: number;
  /** Time-weighted mean of requests running over the window (the client's gaps between requests lower it). */
  meanRunning: number;
  /** Answers received from the warm-up's end to the window's end. */
  answers: number;
  /** Σ completion_tokens / Σ spec_verify_ct over the answers (what SGLang's spec_accept_length averages). */
  acceptLength: number | null;
  /** Σ completion_tokens / Σ (1 + spec_verify_ct × (1 + overhead)): tokens per plain decode step of work. */
  tokensPerStep: number | null;
}

async function generationTokens(sim: SimulatorHandle): Promise<number> {
  const res = await fetch(`${sim.url}/metrics`);
  return promSum(await res.text(), 'sglang:generation_tokens_total') ?? 0;
}

/** Keeps `concurrency` requests in flight until `stop`; sums the answers' counters. */
function client(sim: SimulatorHandle, o: SimSpeculativeOptions) {
  let stopped = false;
  let next = 0;
  const totals = { answers: 0, completion: 0, verifyCt: 0 };
  const controller = new AbortController();
  const one = async (): Promise<void> => {
    while (!stopped) {
      const i = next++;
      const res = await fetch(`${sim.url}/generate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          rid: `bench-${i}`,
          input_ids: Array.from({ length: 64 }, (_, k) => 1000 + ((i * 31 + k) % 5000)),
          sampling_params: { max_new_tokens: o.maxNewTokens, temperature: 0 },
        }),
        signal: controller.signal,
      });
      const body = (await res.json()) as { meta_info: { completion_tokens: number; spec_verify_ct?: number } };
      totals.answers++;
      totals.completion += body.meta_info.completion_tokens;
      totals.verifyCt += body.meta_info.spec_verify_ct ?? 0;
    }
  };
  const workers = Array.from({ length: o.concurrency }, () =>
    one().catch((e: unknown) => {
      if (!stopped) throw e;
    }),
  );
  return {
    totals,
    reset() {
      totals.answers = 0;
      totals.completion = 0;
      totals.verifyCt = 0;
    },
    async stop() {
      stopped = true;
      controller.abort();
      await Promise.all(workers);
    },
  };
}

async function measure(label: string, sim: SimulatorHandle, o: SimSpeculativeOptions): Promise<Run> {
  const c = client(sim, o);
  try {
    await delay((o.warmupSimS * 1000) / o.timeScale);
    c.reset();
    sim.resetStats();
    const t0 = performance.now();
    const d0 = await generationTokens(sim);
    await delay((o.windowSimS * 1000) / o.timeScale);
    const d1 = await generationTokens(sim);
    const simS = ((performance.now() - t0) / 1000) * o.timeScale;
    const meanRunning = round(sim.stats().occupancy.meanRunning, 2);
    const { answers, completion, verifyCt } = c.totals;
    const work = answers + verifyCt * (1 + o.draftOverhead);
    return {
      label,
      tokensPerSimS: round((d1 - d0) / simS, 1),
      windowTokens: Math.round(d1 - d0),
      meanRunning,
      answers,
      acceptLength: verifyCt > 0 ? round(completion / verifyCt, 4) : null,
      tokensPerStep: verifyCt > 0 ? round(completion / work, 4) : null,
    };
  } finally {
    await c.stop();
  }
}

export async function simSpeculative(o: SimSpeculativeOptions = DEFAULT_SIM_SPECULATIVE): Promise<BenchResult> {
  installBenchLogger();
  const started = performance.now();
  const common: SimulatorOptions = {
    timeScale: o.timeScale,
    maxRunningRequests: o.maxRunningRequests,
    seed: 5,
    modelPath: 'Qwen/Qwen3-8B',
    outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma: o.sigma },
  };
  const drafter = (meanAcceptLength: number): SimulatorOptions['speculative'] => ({
    algorithm: 'EAGLE3',
    draftModelPath: 'drafter',
    numSteps: o.numSteps,
    meanAcceptLength,
    draftOverhead: o.draftOverhead,
  });
  // The three side by side in this process, measured one after the other.
  const [base, good, weak] = await Promise.all([
    startSimulator(common),
    startSimulator({ ...common, speculative: drafter(o.goodAcceptLength) }),
    startSimulator({ ...common, speculative: drafter(o.weakAcceptLength) }),
  ]);
  try {
    const runs = {
      base: await measure('no drafter', base, o),
      good: await measure(`good drafter (${o.goodAcceptLength})`, good, o),
      weak: await measure(`weak drafter (${o.weakAcceptLength})`, weak, o),
    };
    const cases = (['good', 'weak'] as const).map((k) => {
      const r = runs[k];
      const ratio = r.tokensPerSimS / Math.max(1e-9, runs.base.tokensPerSimS);
      const predicted = r.tokensPerStep ?? NaN;
      return { k, r, ratio: round(ratio, 4), predicted, error: round(ratio / predicted - 1, 4) };
    });
    const targets = cases.flatMap(({ k, ratio, predicted, error }) => [
      {
        what: `${k} drafter: tok/s ratio to no drafter against accept length / (1 + overhead) of its answers`,
        required: `within ±${o.tolerance * 100} % of ${predicted.toFixed(3)}`,
        measured: `${ratio.toFixed(3)} (${(error * 100).toFixed(2)} %)`,
        met: Math.abs(error) <= o.tolerance,
      },
      {
        what: `${k} drafter ${k === 'good' ? 'faster' : 'slower'} than no drafter`,
        required: k === 'good' ? '> 1' : '< 1',
        measured: ratio.toFixed(3),
        met: k === 'good' ? ratio > 1 : ratio < 1,
      },
    ]);
    const summary = [
      `${o.concurrency} requests in flight, ${o.maxRunningRequests} slots, lognormal completions (mean ${o.meanOutputTokens}, sigma ${o.sigma}, max ${o.maxNewTokens}), timeScale ${o.timeScale}; window ${o.windowSimS} simulated s after ${o.warmupSimS} s`,
      `EAGLE3, ${o.numSteps} steps, topk 1, draft overhead ${o.draftOverhead} of a decode step`,
      ...Object.values(runs).map(
        (r) =>
          `${r.label}: ${fmtInt(r.tokensPerSimS)} output tok/s (simulated), ${r.meanRunning} running, ${r.answers} answers` +
          (r.acceptLength === null
            ? ''
            : `, accept length ${r.acceptLength}, tokens per decode step ${r.tokensPerStep}`),
      ),
      ...cases.map(
        (c) =>
          `${c.k} / none: ${c.ratio.toFixed(3)} (predicted ${c.predicted.toFixed(3)}, ${(c.error * 100).toFixed(2)} %)`,
      ),
    ];
    return {
      name: 'sim-speculative',
      ok: targets.every((t) => t.met),
      targets,
      metrics: {
        config: o,
        runs,
        ratios: Object.fromEntries(
          cases.map((c) => [c.k, { measured: c.ratio, predicted: c.predicted, error: c.error }]),
        ),
      },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await Promise.all([base.stop(), good.stop(), weak.stop()]);
  }
}

if (isMain(import.meta.url)) runAsScript(() => simSpeculative());
