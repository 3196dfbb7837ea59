// Benchmark 4: the orchestration's own ceiling. The simulator answers almost at once (very high
// timeScale, short outputs), so what limits requests/s is tokenmill itself: producer
// (tokenizing prompts, feeding the queue window), dispatch (acquire script, HTTP), commit
// script, results stream and the sink writing JSONL with fsync, all in one process.
import { startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import {
  benchConfig,
  cpuMeter,
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
  type BenchResult,
} from './lib.js';

export interface CeilingCase {
  /** Names the case: short outputs find the requests/s ceiling, long ones the tokens/s ceiling. */
  label: string;
  prompts: number;
  outputTokens: number;
  concurrency: number;
  timeScale: number;
  warmupMs: number;
  windowMs: number;
}

export interface ThroughputCeilingOptions {
  cases: CeilingCase[];
}

export const DEFAULT_THROUGHPUT_CEILING: ThroughputCeilingOptions = {
  cases: [
    {
      label: 'short outputs',
      prompts: 80_000,
      outputTokens: 64,
      concurrency: 64,
      timeScale: 2_000,
      warmupMs: 4_000,
      windowMs: 15_000,
    },
    {
      label: 'long outputs',
      prompts: 20_000,
      outputTokens: 2_048,
      concurrency: 64,
      timeScale: 2_000,
      warmupMs: 4_000,
      windowMs: 15_000,
    },
  ],
};

interface CeilingRun {
  metrics: Record<string, unknown>;
  summary: string[];
  target: BenchResult['targets'][number];
}

interface Sample {
  atMs: number;
  records: number;
  tokens: number;
  backlog: number;
}

export async function throughputCeiling(
  o: ThroughputCeilingOptions = DEFAULT_THROUGHPUT_CEILING,
): Promise<BenchResult> {
  const started = performance.now();
  const runs: CeilingRun[] = [];
  for (const c of o.cases) runs.push(await runCase(c));
  return {
    name: 'throughput-ceiling',
    ok: runs.every((r) => r.target.met),
    targets: runs.map((r) => r.target),
    metrics: { cases: runs.map((r) => r.metrics) },
    summary: runs.flatMap((r) => r.summary),
    wallS: (performance.now() - started) / 1000,
  };
}

async function runCase(o: CeilingCase): Promise<CeilingRun> {
  const env = await openBenchEnv('ceiling');
  let sim: SimulatorHandle | undefined;
  try {
    sim = await startSimulator({
      timeScale: o.timeScale,
      maxRunningRequests: o.concurrency,
      seed: 4,
      outputLength: { distribution: 'fixed', mean: o.outputTokens },
    });
    const { bytes } = writePrompts(env.dir, 'fast', o.prompts);
    const config = benchConfig(env, {
      run: 'ceiling',
      endpoint: sim.url,
      concurrency: o.concurrency,
      datasets: [{ name: 'fast', prompts: 'fast.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 4096 }],
    });
    const gen = await startTokenmill(config);
    const { ctx } = gen;
    const statsKey = ctx.keys.stats('fast');
    const resultsKey = ctx.keys.results('fast');
    const sample = async (): Promise<Sample> => {
      const [[, s], [, backlog]] = (await ctx.redis
        .multi()
        .hmget(statsKey, 'records', 'outputTokens')
        .xlen(resultsKey)
        .exec()) as [[unknown, (string | null)[]], [unknown, number]];
      return { atMs: performance.now(), records: Number(s[0] ?? 0), tokens: Number(s[1] ?? 0), backlog };
    };
    try {
      await waitUntil(async () => (await sample()).records > 0, 'the first commit', 60_000);
      await delay(o.warmupMs);
      const loop = eventLoopMeter();
      const cpu = cpuMeter(env.redis.server.pid);
      const a = await sample();
      let maxBacklog = a.backlog;
      const until = a.atMs + o.windowMs;
      let b = a;
      while (performance.now() < until) {
        await delay(250);
        b = await sample();
        maxBacklog = Math.max(maxBacklog, b.backlog);
      }
      const lag = loop.stop();
      const cores = cpu.stop();
      const exhausted = b.records >= o.prompts;
      const windowS = (b.atMs - a.atMs) / 1000;
      const requestsPerSec = (b.records - a.records) / windowS;
      const tokensPerSec = (b.tokens - a.tokens) / windowS;
      // Records the sink wrote to disk in the window: committed minus what waits in the stream.
      const sinkRecordsPerSec = (b.records - b.backlog - (a.records - a.backlog)) / windowS;
      // The simulator's own latency per request at this timeScale (prefill + decode, wall ms).
      const simStats = sim.stats();
      const metrics = {
        label: o.label,
        config: { ...o, promptFileBytes: bytes, maxRunningRequests: o.concurrency },
        windowS: round(windowS, 2),
        requestsPerSec: round(requestsPerSec, 1),
        outputTokensPerSec: round(tokensPerSec, 0),
        sinkRecordsPerSec: round(sinkRecordsPerSec, 1),
        resultsBacklogMax: maxBacklog,
        resultsBacklogEnd: b.backlog,
        meanRunningInSimulator: round(simStats.occupancy.meanRunning, 2),
        eventLoopDelayMs: lag,
        cpuCores: cores,
        datasetExhaustedInWindow: exhausted,
      };
      const summary = [
        `${o.label}: one process (producer + inference worker + sink) with the simulator in the same process, concurrency ${o.concurrency}, ${o.outputTokens}-token outputs, timeScale ${o.timeScale}`,
        `${o.label}: committed ${fmtInt(requestsPerSec)} requests/s, ${fmtInt(tokensPerSec)} output tokens/s over ${windowS.toFixed(1)} s (after ${o.warmupMs / 1000} s warm-up)`,
        `${o.label}: sink ${fmtInt(sinkRecordsPerSec)} records/s written to disk; results stream backlog max ${maxBacklog}, at end ${b.backlog}`,
        `${o.label}: CPU node ${cores.nodeCores} cores, redis-server ${cores.redisCores ?? '?'} cores; event-loop delay mean ${lag.meanMs} ms, p99 ${lag.p99Ms} ms`,
        `${o.label}: the simulator had ${round(simStats.occupancy.meanRunning, 1)} of its ${o.concurrency} slots busy on average (it is not the limit; this process is, at ~1 core)`,
      ];
      return {
        metrics,
        summary,
        target: {
          what: `${o.label}: dataset not exhausted during the window (the rate is a steady-state rate)`,
          required: `< ${o.prompts} records`,
          measured: `${b.records}`,
          met: !exhausted,
        },
      };
    } finally {
      await gen.stop();
    }
  } finally {
    await sim?.stop();
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => throughputCeiling());
