// Benchmark 1: GPU saturation. The simulator holds at most 64 requests (a GPU's batch) and
// draws long-tailed completion lengths; the question is how many of its 64 slots the client
// keeps busy. tokenmill (continuous dispatch, concurrency 64) is compared with a batch-and-wait
// client (send 64, wait for all 64, send the next 64) on the same prompts, the same simulator
// settings and the same number of completed tokens.
import { startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import { bundledTokenizerPath, loadTokenizer, readPromptFile } from '../src/shared/index.js';
import { runBatchAndWait, type TokenizedPrompt } from './clients/batch-and-wait.js';
import {
  benchConfig,
  delay,
  eventLoopMeter,
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

export interface GpuSaturationOptions {
  /** Lognormal sigmas of the completion lengths, one case each. */
  sigmas: number[];
  meanOutputTokens: number;
  maxNewTokens: number;
  /** The simulator's batch cap and tokenmill's sglang.concurrency. */
  slots: number;
  /** Prompts per batch job (tokenmill's `batchSize`, default 64). */
  batchSize: number;
  timeScale: number;
  /** Warm-up before the occupancy window, in simulated seconds. */
  warmupSimS: number;
  /** Completed tokens both clients must reach; the wall times to reach it are compared. */
  targetTokens: number;
  prompts: number;
  /** Occupancy target (mean running / slots) for tokenmill. */
  targetOccupancy: number;
}

export const DEFAULT_GPU_SATURATION: GpuSaturationOptions = {
  sigmas: [0.8, 1.0],
  meanOutputTokens: 2700,
  maxNewTokens: 10_240,
  slots: 64,
  batchSize: 64,
  timeScale: 100,
  warmupSimS: 200,
  targetTokens: 2_000_000,
  prompts: 3_000,
  targetOccupancy: 0.95,
};

const SAMPLING = { temperature: 0.6, top_p: 0.95 };

/** What one client achieved against one simulator. */
interface ClientRun {
  /** Wall ms from the first request received to `targetTokens` completed tokens. */
  timeToTargetMs: number;
  /** Time-weighted mean running requests over the occupancy window. */
  meanRunning: number;
  occupancyWindowMs: number;
  requestsSent: number;
  eventLoopDelayMs: { meanMs: number; p99Ms: number; maxMs: number };
  /** Running requests sampled every 50 ms (wall) over the window: lowest, and share of samples below 60. */
  runningSampled?: { min: number; below60: number };
}

/**
 * Completed tokens seen by the simulator, across `resetStats()` calls: stats() and resetStats()
 * run back to back in one synchronous step, so no completion falls between them.
 */
class TokenCounter {
  private offset = 0;
  private sent = 0;
  constructor(private readonly sim: SimulatorHandle) {}
  tokens(): number {
    return this.offset + this.sim.stats().outputTokensTotal;
  }
  requests(): number {
    return this.sent + this.sim.stats().requestsReceived;
  }
  reset(): void {
    const s = this.sim.stats();
    this.offset += s.outputTokensTotal;
    this.sent += s.requestsReceived;
    this.sim.resetStats();
  }
}

/** Resolves with the wall time (ms, performance.now) at which `counter` reaches `target` tokens. */
function timeOfTokens(
  counter: TokenCounter,
  target: number,
  timeoutMs: number,
): { at: Promise<number>; cancel(): void } {
  let timer: NodeJS.Timeout | undefined;
  let cancel = (): void => undefined;
  const at = new Promise<number>((resolve, reject) => {
    const deadline = performance.now() + timeoutMs;
    timer = setInterval(() => {
      if (counter.tokens() >= target) {
        clearInterval(timer);
        resolve(performance.now());
      } else if (performance.now() > deadline) {
        clearInterval(timer);
        reject(new Error(`timed out waiting for ${target} completed tokens`));
      }
    }, 10);
    cancel = () => clearInterval(timer);
  });
  return { at, cancel };
}

function simOptions(o: GpuSaturationOptions, sigma: number, seed: number): Parameters<typeof startSimulator>[0] {
  return {
    timeScale: o.timeScale,
    maxRunningRequests: o.slots,
    seed,
    outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma },
  };
}

async function runTokenmill(
  env: BenchEnv,
  o: GpuSaturationOptions,
  sigma: number,
  promptFile: string,
): Promise<ClientRun> {
  const sim = await startSimulator(simOptions(o, sigma, 11));
  try {
    const run = `sat-${String(sigma).replace('.', '_')}`;
    const config = benchConfig(env, {
      run,
      endpoint: sim.url,
      concurrency: o.slots,
      datasets: [
        {
          name: 'sat',
          prompts: promptFile,
          tokenBudget: 1_000_000_000,
          maxNewTokens: o.maxNewTokens,
          sampling: SAMPLING,
          batchSize: o.batchSize,
        },
      ],
    });
    const counter = new TokenCounter(sim);
    const gen = await startTokenmill(config);
    try {
      await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 5);
      const t0 = performance.now();
      const done = timeOfTokens(counter, o.targetTokens, 300_000);
      try {
        await delay((o.warmupSimS * 1000) / o.timeScale);
        counter.reset();
        const loop = eventLoopMeter();
        const samples: number[] = [];
        const sampler = setInterval(() => samples.push(sim.stats().running), 50);
        const tEnd = await done.at;
        clearInterval(sampler);
        // Read before the tail: the dataset still has prompts, so the batch is still full.
        const occ = sim.stats().occupancy;
        return {
          runningSampled: {
            min: Math.min(...samples),
            below60: round(samples.filter((x) => x < 60).length / Math.max(1, samples.length), 3),
          },
          timeToTargetMs: tEnd - t0,
          meanRunning: occ.meanRunning,
          occupancyWindowMs: occ.windowMs,
          requestsSent: counter.requests(),
          eventLoopDelayMs: loop.stop(),
        };
      } finally {
        done.cancel();
      }
    } finally {
      await gen.stop();
    }
  } finally {
    await sim.stop();
  }
}

/** The batch-and-wait client of the old scripts: 64 requests, wait for all, the next 64. */
async function runBatchAndWaitCase(o: GpuSaturationOptions, sigma: number, promptFile: string): Promise<ClientRun> {
  const tokenizer = await loadTokenizer(bundledTokenizerPath());
  const sim = await startSimulator(simOptions(o, sigma, 11));
  try {
    const counter = new TokenCounter(sim);
    // Every prompt is tokenized before the first round, so that the rounds time only the
    // send-and-wait pattern (tokenmill's producer tokenizes ahead of dispatch too).
    const prompts: TokenizedPrompt[] = [];
    for await (const line of readPromptFile(promptFile)) {
      if (line.ok) prompts.push({ id: line.record.id, inputIds: tokenizer.encodePrompt(line.record.messages) });
    }
    let t0: number | undefined;
    let done: ReturnType<typeof timeOfTokens> | undefined;
    let loop: ReturnType<typeof eventLoopMeter> | undefined;
    try {
      const totals = await runBatchAndWait({
        urls: [sim.url],
        slots: o.slots,
        prompts,
        samplingParams: { ...SAMPLING, max_new_tokens: o.maxNewTokens },
        ridPrefix: 'base',
        onRoundSent: async () => {
          if (t0 !== undefined) return;
          await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 1);
          t0 = performance.now();
          done = timeOfTokens(counter, o.targetTokens, 600_000);
        },
        continueAfterRound: (rounds) => {
          if (counter.tokens() >= o.targetTokens && rounds >= 2) return false;
          if (rounds === 1) {
            // The first round is the warm-up; the occupancy window is made of whole rounds after it.
            counter.reset();
            loop = eventLoopMeter();
          }
          return true;
        },
      });
      if (totals.unsent === 0 && counter.tokens() < o.targetTokens)
        throw new Error('baseline ran out of prompts before the target tokens');
      const tEnd = await (done as ReturnType<typeof timeOfTokens>).at;
      const occ = sim.stats().occupancy;
      return {
        timeToTargetMs: tEnd - (t0 as number),
        meanRunning: occ.meanRunning,
        occupancyWindowMs: occ.windowMs,
        requestsSent: counter.requests(),
        eventLoopDelayMs: loop?.stop() ?? { meanMs: 0, p99Ms: 0, maxMs: 0 },
      };
    } finally {
      done?.cancel();
    }
  } finally {
    await sim.stop();
  }
}

export async function gpuSaturation(o: GpuSaturationOptions = DEFAULT_GPU_SATURATION): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('saturation');
  try {
    const { file } = writePrompts(env.dir, 'sat', o.prompts);
    const cases: Record<string, unknown>[] = [];
    const summary: string[] = [
      `simulator: ${o.slots} slots, lognormal completions (mean ${o.meanOutputTokens}, max_new_tokens ${o.maxNewTokens}), timeScale ${o.timeScale}; both clients run until ${fmtInt(o.targetTokens)} completed tokens`,
    ];
    const targets: BenchResult['targets'] = [];
    for (const sigma of o.sigmas) {
      const tm = await runTokenmill(env, o, sigma, 'sat.jsonl');
      const base = await runBatchAndWaitCase(o, sigma, file);
      const tmOcc = tm.meanRunning / o.slots;
      const baseOcc = base.meanRunning / o.slots;
      const c = {
        sigma,
        tokenmill: {
          ...tm,
          occupancy: round(tmOcc, 4),
          meanRunning: round(tm.meanRunning, 2),
          timeToTargetS: round(tm.timeToTargetMs / 1000, 2),
        },
        batchAndWait: {
          ...base,
          occupancy: round(baseOcc, 4),
          meanRunning: round(base.meanRunning, 2),
          timeToTargetS: round(base.timeToTargetMs / 1000, 2),
        },
        occupancyRatio: round(tmOcc / baseOcc, 3),
        wallTimeRatio: round(tm.timeToTargetMs / base.timeToTargetMs, 3),
      };
      cases.push(c);
      summary.push(
        `sigma ${sigma}: tokenmill keeps ${tm.meanRunning.toFixed(1)}/${o.slots} running (occupancy ${tmOcc.toFixed(3)}), batch-and-wait ${base.meanRunning.toFixed(1)}/${o.slots} (${baseOcc.toFixed(3)}); occupancy ratio ${c.occupancyRatio}`,
        `sigma ${sigma}: time to ${fmtInt(o.targetTokens)} tokens: tokenmill ${(tm.timeToTargetMs / 1000).toFixed(1)} s, batch-and-wait ${(base.timeToTargetMs / 1000).toFixed(1)} s wall (x${o.timeScale} simulated); wall-time ratio ${c.wallTimeRatio}`,
      );
      targets.push({
        what: `tokenmill occupancy, sigma ${sigma}`,
        required: `>= ${o.targetOccupancy}`,
        measured: tmOcc.toFixed(3),
        met: tmOcc >= o.targetOccupancy,
      });
    }
    return {
      name: 'gpu-saturation',
      ok: targets.every((t) => t.met),
      targets,
      metrics: { config: o, cases },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => gpuSaturation());
