// Benchmark: the users' own workload, simulated. Eight datasets, each with a budget of 10M
// output tokens, on one SGLang server (a large model tensor-parallel over 8 GPUs: ~1,000 output
// tokens/s in all with 150 requests running), then on eight such servers. How many simulated
// hours does each client need, and how many tokens past the budgets does it generate?
//   tokenmill       the generation stage (producer, worker, sink), all datasets at once
//   ideal           computed: every slot busy until the budgets are met, then the unavoidable drain
//   batch-and-wait  150 requests per server, wait for all, the next 150; one dataset after another
//   semaphore       150 requests per server in flight; one dataset after another, as the users' script
import { mkdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { batchThroughput, startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import { bundledTokenizerPath, loadTokenizer, readPromptFile, type SglangSamplingParams } from '../src/shared/index.js';
import { runBatchAndWait, type TokenizedPrompt } from './clients/batch-and-wait.js';
import { runSemaphoreLoop } from './clients/semaphore-loop.js';
import { sampleOutputLength } from '../src/sim/output-model.js';
import { mulberry32 } from '../src/sim/random.js';
import {
  benchConfig,
  busyMeter,
  fmtInt,
  isMain,
  openBenchEnv,
  round,
  runAsScript,
  startTokenmill,
  writePrompts,
  type BenchEnv,
  type BenchResult,
} from './lib.js';

/** One simulated server: its slots and its decode curve T(B) (see src/sim/load-model.ts). */
export interface ServerModel {
  slots: number;
  singleRequestTokensPerSec: number;
  peakTokensPerSec: number;
}

/** The server whose curve gives `tokensPerSecAtSlots` with `slots` running and `singleRequestTokensPerSec` alone. */
export function serverModel(o: {
  slots: number;
  tokensPerSecAtSlots: number;
  singleRequestTokensPerSec: number;
}): ServerModel {
  // T(B) = peak * B / (B + peak / single - 1), solved for peak at T(slots) = tokensPerSecAtSlots.
  const peak =
    (o.tokensPerSecAtSlots * (o.slots - 1)) / (o.slots - o.tokensPerSecAtSlots / o.singleRequestTokensPerSec);
  if (!(peak > 0))
    throw new RangeError(
      `no decode curve gives ${o.tokensPerSecAtSlots} tok/s at ${o.slots} running with ${o.singleRequestTokensPerSec} tok/s alone`,
    );
  return { slots: o.slots, singleRequestTokensPerSec: o.singleRequestTokensPerSec, peakTokensPerSec: peak };
}

/** The best schedule without aborting requests, computed. */
export interface IdealSchedule {
  hours: number;
  /** Every slot of every server busy: the total minus what the drain decodes, at T(slots). */
  fullSlotsHours: number;
  /** Mean time for the requests in flight at the end to finish (the slowest server's), seconds. */
  drainS: number;
  /** Mean tokens those requests decode. */
  drainTokens: number;
  /** The total at T(slots) with no drain at all: a floor no client reaches. */
  floorHours: number;
}

/**
 * Every slot busy until the requests in flight exactly complete the total (an oracle that knows
 * each completion's length), then those requests drain. The requests in flight at a random
 * moment of continuous batching are length-biased draws of the completion length, each at a
 * uniform point of its decode; the drain runs at T(B)/B tokens/s per request as B falls.
 */
export function idealSchedule(o: {
  totalTokens: number;
  servers: number;
  server: ServerModel;
  length: { mean: number; sigma: number; max: number };
  trials?: number;
}): IdealSchedule {
  const rng = mulberry32(7);
  const spec = { distribution: 'lognormal' as const, mean: o.length.mean, sigma: o.length.sigma, max: o.length.max };
  const pool = Array.from({ length: 50_000 }, () => sampleOutputLength(spec, rng));
  const cumulative: number[] = [];
  let sum = 0;
  for (const l of pool) cumulative.push((sum += l));
  const lengthBiased = (): number => {
    const x = rng() * sum;
    let lo = 0;
    let hi = cumulative.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((cumulative[mid] ?? 0) < x) lo = mid + 1;
      else hi = mid;
    }
    return pool[lo] ?? o.length.mean;
  };
  const trials = o.trials ?? 200;
  let drainS = 0;
  let drainTokens = 0;
  for (let t = 0; t < trials; t += 1) {
    let slowest = 0;
    for (let s = 0; s < o.servers; s += 1) {
      const left = Array.from({ length: o.server.slots }, () => rng() * lengthBiased()).sort((a, b) => a - b);
      let time = 0;
      let done = 0;
      for (const [i, r] of left.entries()) {
        const b = left.length - i;
        time += (r - done) / (batchThroughput(b, o.server) / b);
        done = r;
        drainTokens += r;
      }
      slowest = Math.max(slowest, time);
    }
    drainS += slowest;
  }
  drainS /= trials;
  drainTokens /= trials;
  const perSecond = o.servers * batchThroughput(o.server.slots, o.server);
  const fullSlotsHours = Math.max(0, o.totalTokens - drainTokens) / perSecond / 3600;
  return {
    hours: fullSlotsHours + drainS / 3600,
    fullSlotsHours,
    drainS,
    drainTokens,
    floorHours: o.totalTokens / perSecond / 3600,
  };
}

export type WorkloadClient = 'tokenmill' | 'batch-and-wait' | 'semaphore';

export interface SeedsWorkloadOptions {
  datasets: number;
  budgetPerDataset: number;
  /** Server counts, one case each. */
  servers: number[];
  server: ServerModel;
  meanOutputTokens: number;
  sigma: number;
  maxNewTokens: number;
  clients: WorkloadClient[];
  /**
   * Each client's timeScale on one server; on n servers it is divided by n, so that requests
   * arrive at the same wall rate. Chosen so that this process keeps up (see the time-scale check):
   * tokenmill does more per request (Redis scripts, the results stream, the sink's fsync) than the
   * hand-written clients.
   */
  timeScale: Record<WorkloadClient, number>;
  /** The time-scale check: a smaller budget on one server, each client at its timeScale times each factor. */
  scaleCheck: { budgetPerDataset: number; clients: WorkloadClient[]; timeScaleFactors: number[] } | undefined;
}

export const DEFAULT_SEEDS_WORKLOAD: SeedsWorkloadOptions = {
  datasets: 8,
  budgetPerDataset: 2_500_000,
  servers: [1, 8],
  // The simulator's default curve (80 tok/s alone, 2,500 at most) scaled down to 1,000 tok/s at 150 running.
  server: serverModel({ slots: 150, tokensPerSecAtSlots: 1000, singleRequestTokensPerSec: 40 }),
  meanOutputTokens: 2700,
  sigma: 0.8,
  maxNewTokens: 10_240,
  clients: ['tokenmill', 'batch-and-wait', 'semaphore'],
  timeScale: { tokenmill: 150, 'batch-and-wait': 600, semaphore: 600 },
  scaleCheck: { budgetPerDataset: 500_000, clients: ['tokenmill'], timeScaleFactors: [1, 0.5] },
};

/**
 * BENCH_SEEDS_BUDGET: tokens per dataset (default 2.5M, a quarter of the users' 10M, so that the
 * run fits in ~12 minutes; 10000000 is their workload, ~45 minutes). BENCH_SEEDS_SERVERS (e.g.
 * `1`, or `none` for the time-scale check alone), BENCH_SEEDS_CLIENTS (e.g. `tokenmill,semaphore`), BENCH_SEEDS_TIME_SCALE_FACTOR (times
 * every timeScale) and BENCH_SEEDS_SCALE_CHECK=0 select parts.
 */
export function seedsWorkloadOptionsFromEnv(env: NodeJS.ProcessEnv = process.env): SeedsWorkloadOptions {
  const o = { ...DEFAULT_SEEDS_WORKLOAD };
  const budget = Number(env['BENCH_SEEDS_BUDGET'] ?? NaN);
  if (Number.isFinite(budget) && budget > 0) o.budgetPerDataset = budget;
  if (env['BENCH_SEEDS_SCALE_CHECK'] === '0') o.scaleCheck = undefined;
  const servers = env['BENCH_SEEDS_SERVERS'];
  if (servers !== undefined && servers !== '') o.servers = servers === 'none' ? [] : servers.split(',').map(Number);
  const clients = env['BENCH_SEEDS_CLIENTS'];
  if (clients !== undefined && clients !== '') o.clients = clients.split(',') as WorkloadClient[];
  const f = Number(env['BENCH_SEEDS_TIME_SCALE_FACTOR'] ?? NaN);
  if (Number.isFinite(f) && f > 0)
    o.timeScale = {
      tokenmill: o.timeScale.tokenmill * f,
      'batch-and-wait': o.timeScale['batch-and-wait'] * f,
      semaphore: o.timeScale.semaphore * f,
    };
  return o;
}

const SAMPLING = { temperature: 0.6, top_p: 0.95 };

/** What one client did on one set of servers. */
export interface WorkloadRun {
  client: WorkloadClient;
  servers: number;
  timeScale: number;
  /** From the first request received to the last one finished, in simulated hours. */
  simHours: number;
  wallS: number;
  /** Tokens generated by the servers. */
  generatedTokens: number;
  /** Tokens recorded per dataset, and the sum of each one's tokens past its budget. */
  perDatasetTokens: number[];
  overshootTokens: number;
  /** Time-weighted mean running requests per server over the busy span. */
  meanRunningPerServer: number;
  requests: number;
  loadAverage1m: number;
}

interface Workload {
  env: BenchEnv;
  names: string[];
  prompts: TokenizedPrompt[][];
  budget: number;
}

async function startServers(o: SeedsWorkloadOptions, n: number, timeScale: number): Promise<SimulatorHandle[]> {
  const sims: SimulatorHandle[] = [];
  try {
    for (let i = 0; i < n; i += 1) {
      sims.push(
        await startSimulator({
          timeScale,
          seed: 100 + i,
          maxRunningRequests: o.server.slots,
          singleRequestTokensPerSec: o.server.singleRequestTokensPerSec,
          peakTokensPerSec: o.server.peakTokensPerSec,
          outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma: o.sigma },
        }),
      );
    }
  } catch (e: unknown) {
    await Promise.all(sims.map((s) => s.stop()));
    throw e;
  }
  return sims;
}

async function tokenmillTokens(
  w: Workload,
  o: SeedsWorkloadOptions,
  sims: SimulatorHandle[],
  run: string,
): Promise<{ perDataset: number[] }> {
  const config = benchConfig(w.env, {
    run,
    endpoint: sims[0]?.url ?? '',
    endpoints: sims.map((s) => s.url),
    concurrency: o.server.slots,
    datasets: w.names.map((name) => ({
      name,
      prompts: `${name}.jsonl`,
      tokenBudget: w.budget,
      maxNewTokens: o.maxNewTokens,
      sampling: SAMPLING,
    })),
  });
  const gen = await startTokenmill(config);
  try {
    await gen.handle.finished;
  } finally {
    await gen.stop();
  }
  const redis = w.env.redis.connection('client');
  const perDataset: number[] = [];
  for (const name of w.names) {
    const stats = await redis.hgetall(gen.ctx.keys.stats(name));
    perDataset.push(Number(stats['outputTokens'] ?? 0));
  }
  rmSync(path.join(w.env.dir, 'out', run), { recursive: true, force: true });
  return { perDataset };
}

async function handWrittenTokens(
  w: Workload,
  o: SeedsWorkloadOptions,
  sims: SimulatorHandle[],
  client: WorkloadClient,
  run: string,
): Promise<{ perDataset: number[] }> {
  const dir = path.join(w.env.dir, run);
  mkdirSync(dir, { recursive: true });
  const urls = sims.map((s) => s.url);
  const slots = o.server.slots * sims.length;
  const samplingParams: SglangSamplingParams = { ...SAMPLING, max_new_tokens: o.maxNewTokens };
  const perDataset: number[] = [];
  try {
    for (const [i, name] of w.names.entries()) {
      const prompts = w.prompts[i] ?? [];
      const outFile = path.join(dir, `${name}.jsonl`);
      const r =
        client === 'batch-and-wait'
          ? await runBatchAndWait({
              urls,
              slots,
              prompts,
              samplingParams,
              outFile,
              budgetTokens: w.budget,
              ridPrefix: `${run}/${name}`,
            })
          : await runSemaphoreLoop({ urls, slots, prompts, samplingParams, outFile, budgetTokens: w.budget });
      // A client that sent every prompt stopped for want of prompts, not at its budget: its overshoot would read short.
      if (r.completed >= prompts.length)
        throw new Error(
          `${client}: dataset ${name} sent all its ${prompts.length} prompts (${r.outputTokens} tokens, budget ${w.budget}); give it more prompts`,
        );
      perDataset.push(r.outputTokens);
      rmSync(outFile, { force: true });
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return { perDataset };
}

async function runClient(
  w: Workload,
  o: SeedsWorkloadOptions,
  client: WorkloadClient,
  servers: number,
  timeScale: number,
): Promise<WorkloadRun> {
  const sims = await startServers(o, servers, timeScale);
  const run = `${client}-${servers}-${Math.round(timeScale)}-${w.budget}`;
  const load0 = os.loadavg()[0] ?? NaN;
  try {
    const meter = busyMeter(sims);
    const t0 = performance.now();
    const r =
      client === 'tokenmill'
        ? await tokenmillTokens(w, o, sims, run)
        : await handWrittenTokens(w, o, sims, client, run);
    const busy = meter.stop();
    return {
      client,
      servers,
      timeScale: round(timeScale, 2),
      simHours: round((busy.spanMs * timeScale) / 3_600_000, 3),
      wallS: round((performance.now() - t0) / 1000, 1),
      generatedTokens: busy.outputTokens,
      perDatasetTokens: r.perDataset,
      overshootTokens: r.perDataset.reduce((a, t) => a + Math.max(0, t - w.budget), 0),
      meanRunningPerServer: round(busy.meanRunning / servers, 1),
      requests: busy.requests,
      loadAverage1m: round(((os.loadavg()[0] ?? NaN) + load0) / 2, 2),
    };
  } finally {
    await Promise.all(sims.map((s) => s.stop()));
  }
}

async function tokenizePrompts(env: BenchEnv, names: string[], perDataset: number): Promise<TokenizedPrompt[][]> {
  const tokenizer = await loadTokenizer(bundledTokenizerPath());
  const all: TokenizedPrompt[][] = [];
  for (const name of names) {
    writePrompts(env.dir, name, perDataset);
    const list: TokenizedPrompt[] = [];
    for await (const line of readPromptFile(path.join(env.dir, `${name}.jsonl`))) {
      if (line.ok) list.push({ id: line.record.id, inputIds: tokenizer.encodePrompt(line.record.messages) });
    }
    all.push(list);
  }
  return all;
}

function fmtRun(r: WorkloadRun): string {
  return `${r.client} ${r.simHours.toFixed(2)} h (overshoot ${fmtInt(r.overshootTokens)} tokens, ${r.meanRunningPerServer} running/server, ${r.wallS} s wall at x${r.timeScale})`;
}

export async function seedsWorkload(o: SeedsWorkloadOptions = seedsWorkloadOptionsFromEnv()): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('seeds');
  try {
    const names = Array.from({ length: o.datasets }, (_, i) => `B${i + 1}`);
    // Enough prompts for the budget plus a whole round of the widest case past it.
    const maxServers = Math.max(...o.servers, 1);
    const perDataset = Math.ceil((o.budgetPerDataset / o.meanOutputTokens) * 1.25) + 2 * o.server.slots * maxServers;
    const prompts = await tokenizePrompts(env, names, perDataset);
    const w: Workload = { env, names, prompts, budget: o.budgetPerDataset };
    const length = { mean: o.meanOutputTokens, sigma: o.sigma, max: o.maxNewTokens };
    const cases: { servers: number; ideal: IdealSchedule; runs: WorkloadRun[] }[] = [];
    const summary: string[] = [
      `${o.datasets} datasets x ${fmtInt(o.budgetPerDataset)} tokens; per server ${o.server.slots} running at ${fmtInt(batchThroughput(o.server.slots, o.server))} tok/s (1 alone: ${o.server.singleRequestTokensPerSec} tok/s); lognormal completions mean ${o.meanOutputTokens}, sigma ${o.sigma}, max ${fmtInt(o.maxNewTokens)}`,
    ];
    for (const servers of o.servers) {
      const ideal = idealSchedule({ totalTokens: o.datasets * o.budgetPerDataset, servers, server: o.server, length });
      const runs: WorkloadRun[] = [];
      for (const client of o.clients) {
        const timeScale = o.timeScale[client] / servers;
        process.stdout.write(
          `   seeds-workload: ${client} on ${servers} server(s), timeScale ${timeScale.toFixed(0)}\n`,
        );
        runs.push(await runClient(w, o, client, servers, timeScale));
      }
      cases.push({ servers, ideal, runs });
      summary.push(
        `${o.datasets} x ${fmtInt(o.budgetPerDataset)} tokens on ${servers} server(s): ideal ${ideal.hours.toFixed(2)} h (${ideal.fullSlotsHours.toFixed(2)} h of full slots + ${(ideal.drainS / 60).toFixed(1)} min drain); ${runs.map(fmtRun).join('; ')}`,
      );
    }
    const scaleRuns: WorkloadRun[] = [];
    if (o.scaleCheck !== undefined) {
      const check = o.scaleCheck;
      const small: Workload = { ...w, budget: check.budgetPerDataset };
      for (const f of check.timeScaleFactors) {
        for (const client of check.clients) {
          const base = o.timeScale[client];
          process.stdout.write(`   seeds-workload: scale check, ${client}, timeScale ${(base * f).toFixed(0)}\n`);
          scaleRuns.push(await runClient(small, o, client, 1, base * f));
        }
      }
      const ideal = idealSchedule({
        totalTokens: o.datasets * check.budgetPerDataset,
        servers: 1,
        server: o.server,
        length,
      });
      summary.push(
        `time-scale check (${o.datasets} x ${fmtInt(check.budgetPerDataset)} tokens, 1 server, ideal ${ideal.hours.toFixed(3)} h): ${scaleRuns.map(fmtRun).join('; ')}`,
      );
    }
    const targets: BenchResult['targets'] = cases.flatMap((c) => {
      const tm = c.runs.find((r) => r.client === 'tokenmill');
      if (tm === undefined) return [];
      return [
        {
          what: `tokenmill simulated hours / ideal, ${c.servers} server(s)`,
          required: '<= 1.05',
          measured: (tm.simHours / c.ideal.hours).toFixed(3),
          met: tm.simHours / c.ideal.hours <= 1.05,
        },
      ];
    });
    return {
      name: 'seeds-workload',
      ok: targets.every((t) => t.met),
      targets,
      metrics: { config: o, cases, scaleCheck: scaleRuns },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => seedsWorkload());
