// The steady-state throughput window of the multi-turn benchmarks (multi-turn-cache.ts,
// agentic-throughput.ts): with tokenmill running against one simulator, wait for the first
// request, let a warm-up pass, then count the output tokens the simulator decodes
// (`sglang:generation_tokens_total`) over a window, while prompts are still waiting to be sent
// (no drain tail: the caller's check throws otherwise).
import type { SimRequestRecord, SimulatorHandle } from '../src/sim/index.js';
import { promSum } from '../src/workers/inference/concurrency-probe.js';
import { cpuMeter, delay, round, waitUntil } from './lib.js';

export interface WindowOptions {
  timeScale: number;
  /** Simulated seconds from the first request to the window's start, and of the window. */
  warmupSimS: number;
  windowSimS: number;
  /** The benchmark's redis-server, whose CPU is read over the window (optional). */
  redisPid?: number | undefined;
}

export interface WindowMeasure {
  /** Decoded tokens per simulated second over the window. */
  tokensPerSimS: number;
  windowTokens: number;
  /** Time-weighted mean of running requests over the window. */
  meanRunning: number;
  /** Mean prompt tokens of the requests received up to the window's end. */
  meanPromptTokens: number;
  /** Requests answered in the window and their mean end-to-end latency (wall s; × timeScale: simulated). */
  requestsFinished: number;
  meanLatencyWallS: number;
  /** CPU over the window, as cores busy on average: this process (tokenmill and the simulator) and redis-server. */
  cpu: { nodeCores: number; redisCores: number | undefined };
  /** Every request the simulator received up to the window's end. */
  received: SimRequestRecord[];
}

interface Reading {
  decoded: number;
  latencySum: number;
  latencyCount: number;
}

async function readMetrics(sim: SimulatorHandle): Promise<Reading> {
  const res = await fetch(`${sim.url}/metrics`);
  const text = await res.text();
  return {
    decoded: promSum(text, 'sglang:generation_tokens_total') ?? 0,
    latencySum: promSum(text, 'sglang:e2e_request_latency_seconds_sum') ?? 0,
    latencyCount: promSum(text, 'sglang:e2e_request_latency_seconds_count') ?? 0,
  };
}

/**
 * Measures the window (see the module comment). `stillWaiting(received)` says whether some
 * prompt (or conversation) was not yet sent at the window's end, given every request received
 * up to then; when it was, the window had a drain tail and this throws.
 */
export async function steadyWindow(
  sim: SimulatorHandle,
  o: WindowOptions,
  label: string,
  stillWaiting: (received: readonly SimRequestRecord[]) => boolean,
): Promise<WindowMeasure> {
  await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 2);
  await delay((o.warmupSimS * 1000) / o.timeScale);
  const received = sim.stats().requests.slice();
  sim.resetStats();
  const t0 = performance.now();
  const cpu = cpuMeter(o.redisPid);
  const r0 = await readMetrics(sim);
  await delay((o.windowSimS * 1000) / o.timeScale);
  const r1 = await readMetrics(sim);
  const t1 = performance.now();
  const cpuUsed = cpu.stop();
  const st = sim.stats();
  received.push(...st.requests);
  if (!stillWaiting(received))
    throw new Error(`${label}: every prompt was sent before the window ended; raise their number`);
  const simS = ((t1 - t0) / 1000) * o.timeScale;
  const finished = r1.latencyCount - r0.latencyCount;
  return {
    tokensPerSimS: round((r1.decoded - r0.decoded) / simS, 1),
    windowTokens: Math.round(r1.decoded - r0.decoded),
    meanRunning: round(st.occupancy.meanRunning, 2),
    meanPromptTokens: Math.round(received.reduce((a, r) => a + r.promptTokens, 0) / Math.max(1, received.length)),
    requestsFinished: finished,
    meanLatencyWallS: round((r1.latencySum - r0.latencySum) / Math.max(1, finished), 4),
    cpu: cpuUsed,
    received,
  };
}
