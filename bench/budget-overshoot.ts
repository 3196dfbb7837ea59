// Benchmark 2: budget overshoot. For token budgets small and large relative to concurrency x
// mean completion length, one or eight endpoints, two spreads of completion lengths and both
// budget modes (reserve, strict), how far past the budget does the final count land, and is any
// request sent after the budget was met (docs/design.md, invariant 3)?
import type { Redis } from 'ioredis';
import { startSimulator, type SimRequestRecord, type SimulatorHandle } from '../src/sim/index.js';
import { startGeneration } from '../src/cli/pipeline.js';
import { openRunContextFor } from '../src/cli/run-context.js';
import { RunKeys, inferenceOptions, loadConfig } from '../src/shared/index.js';
import { InferenceWorker } from '../src/workers/inference/worker.js';
import { readGenerations, sampleIdOfRid } from '../test/helpers/pipeline.js';
import {
  fmtInt,
  isMain,
  openBenchEnv,
  round,
  runAsScript,
  waitUntil,
  writePrompts,
  type BenchEnv,
  type BenchResult,
} from './lib.js';

/** One setting, run `repeats` times (a fresh run each time: the overshoot is a random variable). */
export interface BudgetSetting {
  label: string;
  budget: number;
  /** Requests in flight per endpoint (the simulator's running slots too). */
  concurrency: number;
  endpoints: number;
  sigma: number;
  mode: 'reserve' | 'strict';
  repeats: number;
  /** The simulators run this many times faster than real time. */
  timeScale: number;
  /**
   * Target for the median overshoot ratio, when the setting has one. In strict mode it applies
   * at real speed: the overshoot is what the requests produce during the stop's round trip
   * (report interval, stream tick, abort), wall time, so the simulator's tokens are divided by
   * its timeScale.
   */
  maxMedianOvershoot?: number;
}

export interface BudgetOvershootOptions {
  settings: BudgetSetting[];
  meanOutputTokens: number;
  maxNewTokens: number;
  prompts: number;
}

export const DEFAULT_BUDGET_OVERSHOOT: BudgetOvershootOptions = {
  settings: [
    {
      label: '500k, 64 in flight, sigma 0.8',
      budget: 500_000,
      concurrency: 64,
      endpoints: 1,
      sigma: 0.8,
      mode: 'reserve',
      repeats: 5,
      timeScale: 150,
      maxMedianOvershoot: 0.05,
    },
    {
      label: '10M, 150 in flight, sigma 0.8',
      budget: 10_000_000,
      concurrency: 150,
      endpoints: 1,
      sigma: 0.8,
      mode: 'reserve',
      repeats: 3,
      timeScale: 150,
      maxMedianOvershoot: 0.01,
    },
    {
      label: '10M, 150 in flight, sigma 1.0',
      budget: 10_000_000,
      concurrency: 150,
      endpoints: 1,
      sigma: 1.0,
      mode: 'reserve',
      repeats: 3,
      timeScale: 150,
      maxMedianOvershoot: 0.01,
    },
    {
      label: '10M, 8 x 150 in flight, sigma 0.8',
      budget: 10_000_000,
      concurrency: 150,
      endpoints: 8,
      sigma: 0.8,
      mode: 'reserve',
      repeats: 3,
      timeScale: 20,
      maxMedianOvershoot: 0.01,
    },
    {
      label: '10M, 8 x 150 in flight, sigma 1.0',
      budget: 10_000_000,
      concurrency: 150,
      endpoints: 8,
      sigma: 1.0,
      mode: 'reserve',
      repeats: 3,
      timeScale: 20,
      maxMedianOvershoot: 0.01,
    },
    {
      label: 'strict, 10M, 150 in flight, sigma 0.8',
      budget: 10_000_000,
      concurrency: 150,
      endpoints: 1,
      sigma: 0.8,
      mode: 'strict',
      repeats: 3,
      timeScale: 150,
      maxMedianOvershoot: 0.001,
    },
    {
      label: 'strict, 500k, 64 in flight, sigma 0.8',
      budget: 500_000,
      concurrency: 64,
      endpoints: 1,
      sigma: 0.8,
      mode: 'strict',
      repeats: 3,
      timeScale: 150,
      maxMedianOvershoot: 0.001,
    },
  ],
  meanOutputTokens: 2700,
  maxNewTokens: 10_240,
  prompts: 9_000,
};

interface BudgetCase {
  label: string;
  budget: number;
  /** Budget / (requests in flight x mean completion length). */
  budgetInBatches: number;
  finalTokens: number;
  overshootTokens: number;
  overshootRatio: number;
  records: number;
  /** Records committed with finish_reason abort (strict mode's partial outputs). */
  abortRecords: number;
  requestsSent: number;
  /** Requests the simulators received strictly after the commit that met the budget. */
  sentAfterBudgetMet: number;
  /** Requests received in the same millisecond as that commit. */
  sentInBudgetMetMs: number;
  /** Each request received after the budget was met: how late (ms), whether its result was committed, and whether Redis ran its acquire after the budget-meeting commit. */
  lateRequests: { rid: string; lateByMs: number; committed: boolean; acquiredAfterBudgetMet: boolean }[];
  /** Requests the simulators received whose acquire script ran, in Redis's order, after the commit that met the budget. */
  acquiredAfterBudgetMet: number;
  /** Strict mode: requests received after the stop flag was set (budgetStopMs). */
  sentAfterStop: number;
  /** Strict mode: final tokens minus the count (committed + produced in flight) at which the stop was decided. */
  pastStopTokens: number;
  /** Samples committed after the budget was met: the requests in flight at that moment. */
  committedAfterBudgetMet: number;
  skippedByBudget: number;
  /** Wall seconds from the budget met to the generation finished (in-flight tail + drain). */
  tailAfterBudgetMetS: number;
  wallS: number;
}

/**
 * Redis's own order of execution, from MONITOR: when each request was acquired (the acquire
 * script, keyed by rid) and which commit met the budget. It tells a request acquired after
 * the budget was met (a real violation) from one acquired before it but received by the
 * simulator a few ms later (the simulator's clock and this process's event loop sit in between).
 */
class RedisOrderLog {
  private seq = 0;
  private monitor: Redis | undefined;
  readonly acquiredAt = new Map<string, number>();
  readonly commits: { seq: number; id: string; tokens: number }[] = [];

  constructor(
    private readonly keys: RunKeys,
    private readonly dataset: string,
  ) {}

  async start(conn: Redis): Promise<void> {
    const statsKey = this.keys.stats(this.dataset);
    const inflightKey = this.keys.inflight(this.dataset);
    const doneKey = this.keys.done(this.dataset);
    this.monitor = await conn.monitor();
    this.monitor.on('monitor', (_time: string, args: string[]) => {
      this.seq += 1;
      const cmd = String(args[0]).toLowerCase();
      if (cmd !== 'evalsha' && cmd !== 'eval') return;
      const numKeys = Number(args[2]);
      const keys = args.slice(3, 3 + numKeys);
      const argv = args.slice(3 + numKeys);
      if (keys[0] === statsKey && keys[1] === inflightKey && argv[0] !== undefined) {
        // acquire-request.lua: a rid in ARGV[1], further requests from ARGV[12], five arguments each.
        this.acquiredAt.set(argv[0], this.seq);
        for (let i = 11; i < argv.length; i += 5) this.acquiredAt.set(argv[i] ?? '', this.seq);
      } else if (keys[0] === doneKey && keys[1] === statsKey && argv[0] !== undefined) {
        // commit-sample-9.lua: a sample in ARGV[1..4], further samples from ARGV[7], four arguments each, in order.
        this.commits.push({ seq: this.seq, id: argv[0], tokens: Number(argv[1]) });
        for (let i = 6; i < argv.length; i += 4)
          this.commits.push({ seq: this.seq, id: argv[i] ?? '', tokens: Number(argv[i + 1]) });
      }
    });
  }

  stop(): void {
    this.monitor?.disconnect();
  }

  /** Position of the first commit at which the dataset's tokens reached `budget`. */
  budgetMetSeq(budget: number): number {
    const seen = new Set<string>();
    let total = 0;
    for (const c of this.commits) {
      if (seen.has(c.id)) continue;
      seen.add(c.id);
      total += c.tokens;
      if (total >= budget) return c.seq;
    }
    return Infinity;
  }
}

interface BudgetSummary {
  setting: BudgetSetting;
  budgetInBatches: number;
  runs: number;
  overshootRatioMedian: number;
  overshootRatioMax: number;
  overshootTokensMedian: number;
  overshootTokensMax: number;
  finalTokensMin: number;
  inFlightWhenMet: number[];
  abortRecords: number[];
  /** Median over the runs. */
  skippedByBudgetMedian: number;
  /** Summed over the runs. */
  sentAfterBudgetMet: number;
  /** Summed over the runs. */
  acquiredAfterBudgetMet: number;
  /** Summed over the runs (strict mode). */
  sentAfterStop: number;
  pastStopTokensMedian: number;
  /** How late (ms after budgetMetMs) each request received after the budget was met arrived. */
  lateByMs: number[];
  wallSMedian: number;
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] ?? NaN) : ((s[m - 1] ?? NaN) + (s[m] ?? NaN)) / 2;
}

function summarize(setting: BudgetSetting, runs: readonly BudgetCase[]): BudgetSummary {
  return {
    setting,
    budgetInBatches: runs[0]?.budgetInBatches ?? NaN,
    runs: runs.length,
    overshootRatioMedian: round(median(runs.map((r) => r.overshootRatio)), 5),
    overshootRatioMax: Math.max(...runs.map((r) => r.overshootRatio)),
    overshootTokensMedian: median(runs.map((r) => r.overshootTokens)),
    overshootTokensMax: Math.max(...runs.map((r) => r.overshootTokens)),
    finalTokensMin: Math.min(...runs.map((r) => r.finalTokens)),
    inFlightWhenMet: runs.map((r) => r.committedAfterBudgetMet),
    abortRecords: runs.map((r) => r.abortRecords),
    skippedByBudgetMedian: median(runs.map((r) => r.skippedByBudget)),
    // A negative count means budgetMetMs was missing: count it as a miss.
    sentAfterBudgetMet: runs.reduce((a, r) => a + (r.sentAfterBudgetMet < 0 ? 1 : r.sentAfterBudgetMet), 0),
    acquiredAfterBudgetMet: runs.reduce((a, r) => a + r.acquiredAfterBudgetMet, 0),
    sentAfterStop: runs.reduce((a, r) => a + r.sentAfterStop, 0),
    pastStopTokensMedian: median(runs.map((r) => r.pastStopTokens)),
    lateByMs: runs.flatMap((r) => r.lateRequests.map((l) => l.lateByMs)),
    wallSMedian: round(median(runs.map((r) => r.wallS)), 1),
  };
}

async function runBudget(
  env: BenchEnv,
  o: BudgetOvershootOptions,
  st: BudgetSetting,
  repeat: number,
  promptFile: string,
): Promise<BudgetCase> {
  const t0 = performance.now();
  const sims: SimulatorHandle[] = [];
  try {
    for (let e = 0; e < st.endpoints; e += 1) {
      sims.push(
        await startSimulator({
          timeScale: st.timeScale,
          maxRunningRequests: st.concurrency,
          seed: 5 + 97 * repeat + e,
          outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma: st.sigma },
        }),
      );
    }
    const run = `budget-${st.label.replace(/[^a-z0-9]+/gi, '-')}-${repeat}`;
    const config = loadConfig({
      baseDir: env.dir,
      object: {
        run,
        redis: { url: env.redis.url, prefix: env.redis.prefix },
        sglang: { endpoints: sims.map((x) => x.url), concurrency: st.concurrency, requestTimeoutMs: 600_000 },
        datasets: [
          {
            name: 'ds',
            prompts: promptFile,
            tokenBudget: st.budget,
            budget: st.mode,
            maxNewTokens: o.maxNewTokens,
            sampling: { temperature: 0.6, top_p: 0.95 },
          },
        ],
        output: { dir: 'out' },
        workers: { shutdownGraceMs: 1_000 },
      },
    });
    const keys = new RunKeys(config.redis.prefix, config.run);
    const order = new RedisOrderLog(keys, 'ds');
    await order.start(env.redis.connection('client'));
    // The producer and sinks of the pipeline, and one inference worker told the dataset's budget mode.
    const ctx = await openRunContextFor(config);
    const handle = await startGeneration(ctx, { produce: true, infer: false });
    handle.finished.catch(() => undefined);
    const worker = new InferenceWorker({ ...inferenceOptions(config), redisUrl: ctx.redisUrl, keys });
    await worker.start();
    let finishedAtMs: number;
    const sent = (): SimRequestRecord[] => sims.flatMap((x) => x.stats().requests);
    try {
      await waitUntil(() => sims.some((x) => x.stats().requestsReceived > 0), 'the first request', 60_000, 2);
      await handle.finished;
      finishedAtMs = Date.now();
    } finally {
      await worker.stop(1_000);
      await handle.stop();
      await ctx.close();
      order.stop();
    }
    const redis = env.redis.connection('client');
    const stats = await redis.hgetall(keys.stats('ds'));
    const skipped = await redis.scard(keys.skipped('ds'));
    const finalTokens = Number(stats['outputTokens'] ?? 0);
    const budgetMetMs = Number(stats['budgetMetMs'] ?? NaN);
    const budgetStopMs = Number(stats['budgetStopMs'] ?? NaN);
    const requests = sent().filter((r) => r.rid.startsWith('ds/'));
    const records = readGenerations(ctx.runDir, 'ds');
    const recorded = new Set(records.map((r) => r.id));
    const metSeq = order.budgetMetSeq(st.budget);
    if (!Number.isFinite(metSeq))
      throw new Error(`MONITOR saw ${order.commits.length} commits and none met the budget`);
    const unseen = requests.filter((r) => !order.acquiredAt.has(r.rid)).length;
    if (unseen > 0) throw new Error(`MONITOR saw no acquire for ${unseen} of the ${requests.length} requests sent`);
    const acquiredLate = (rid: string): boolean => (order.acquiredAt.get(rid) ?? Infinity) > metSeq;
    const fileTokens = records.reduce((a, r) => a + r.completion_tokens, 0);
    if (fileTokens !== finalTokens)
      throw new Error(`records on disk hold ${fileTokens} tokens, the counter ${finalTokens}`);
    return {
      label: st.label,
      budget: st.budget,
      budgetInBatches: round(st.budget / (st.concurrency * st.endpoints * o.meanOutputTokens), 2),
      finalTokens,
      overshootTokens: finalTokens - st.budget,
      overshootRatio: round((finalTokens - st.budget) / st.budget, 5),
      records: records.length,
      abortRecords: records.filter((r) => (r.finish_reason as { type?: string }).type === 'abort').length,
      requestsSent: requests.length,
      sentAfterBudgetMet: Number.isFinite(budgetMetMs)
        ? requests.filter((r) => r.receivedAtMs > budgetMetMs).length
        : -1,
      sentInBudgetMetMs: Number.isFinite(budgetMetMs)
        ? requests.filter((r) => r.receivedAtMs === budgetMetMs).length
        : -1,
      lateRequests: requests
        .filter((r) => r.receivedAtMs > budgetMetMs)
        .map((r) => ({
          rid: r.rid,
          lateByMs: r.receivedAtMs - budgetMetMs,
          committed: recorded.has(sampleIdOfRid(r.rid)),
          acquiredAfterBudgetMet: acquiredLate(r.rid),
        })),
      acquiredAfterBudgetMet: requests.filter((r) => acquiredLate(r.rid)).length,
      sentAfterStop: Number.isFinite(budgetStopMs) ? requests.filter((r) => r.receivedAtMs > budgetStopMs).length : 0,
      pastStopTokens: stats['budgetStopTokens'] === undefined ? 0 : finalTokens - Number(stats['budgetStopTokens']),
      committedAfterBudgetMet: records.filter((r) => Date.parse(r.ts) > budgetMetMs).length,
      skippedByBudget: skipped,
      tailAfterBudgetMetS: round((finishedAtMs - budgetMetMs) / 1000, 2),
      wallS: round((performance.now() - t0) / 1000, 1),
    };
  } finally {
    for (const x of sims) await x.stop();
  }
}

const pct = (x: number): string => `${(x * 100).toFixed(2)}%`;

export async function budgetOvershoot(o: BudgetOvershootOptions = DEFAULT_BUDGET_OVERSHOOT): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('budget');
  const only = process.env['BENCH_BUDGET_ONLY'];
  const settings =
    only === undefined ? o.settings : o.settings.filter((st) => only.split(',').some((w) => st.label.includes(w)));
  try {
    writePrompts(env.dir, 'prompts', o.prompts);
    const summaries: BudgetSummary[] = [];
    const cases: BudgetCase[] = [];
    for (const st of settings) {
      const runs: BudgetCase[] = [];
      const repeats = Number(process.env['BENCH_BUDGET_REPEATS'] ?? st.repeats);
      for (let i = 0; i < repeats; i += 1) {
        const c = await runBudget(env, o, st, i, 'prompts.jsonl');
        if (process.env['BENCH_BUDGET_VERBOSE'] !== undefined)
          process.stderr.write(
            `${st.label} #${i}: overshoot ${pct(c.overshootRatio)} (${fmtInt(c.overshootTokens)} tokens), ${c.abortRecords} abort records, ${c.wallS} s\n`,
          );
        runs.push(c);
      }
      cases.push(...runs);
      summaries.push(summarize(st, runs));
    }
    const targets: BenchResult['targets'] = [];
    const summary = [
      `lognormal completions (mean ${o.meanOutputTokens}, max_new_tokens ${o.maxNewTokens}); one batch = requests in flight x mean`,
    ];
    for (const b of summaries) {
      const st = b.setting;
      summary.push(
        `${st.label} (${st.mode}, ${b.budgetInBatches} batches, timeScale ${st.timeScale}), ${b.runs} run(s), median ${b.wallSMedian} s: overshoot median ${pct(b.overshootRatioMedian)} (${fmtInt(b.overshootTokensMedian)} tokens), ` +
          `max ${pct(b.overshootRatioMax)} (${fmtInt(b.overshootTokensMax)} tokens); committed after the budget was met: ${b.inFlightWhenMet.join(', ')}; abort records: ${b.abortRecords.join(', ')}; ` +
          `received after the budget was met: ${b.sentAfterBudgetMet}${b.lateByMs.length > 0 ? ` (by ${b.lateByMs.join(', ')} ms)` : ''}, acquired after it (Redis order): ${b.acquiredAfterBudgetMet}` +
          `${st.mode === 'strict' ? `, received after the stop flag: ${b.sentAfterStop}; tokens past the stop's count (median) ${fmtInt(b.pastStopTokensMedian)}; at real speed (/ timeScale) overshoot ${pct(b.overshootRatioMedian / st.timeScale)}` : ''}; prompts skipped by budget (median) ${b.skippedByBudgetMedian}`,
      );
      if (st.maxMedianOvershoot !== undefined) {
        const measured = st.mode === 'strict' ? b.overshootRatioMedian / st.timeScale : b.overshootRatioMedian;
        targets.push({
          what: `${st.label}: median overshoot${st.mode === 'strict' ? ' at real speed (simulator tokens / timeScale)' : ''}`,
          required: `<= ${pct(st.maxMedianOvershoot)}`,
          measured: st.mode === 'strict' ? `${(measured * 100).toFixed(4)}%` : pct(measured),
          met: measured <= st.maxMedianOvershoot,
        });
      }
      targets.push(
        {
          what: `${st.label}: requests received after budgetMetMs (all runs)`,
          required: '0',
          measured: String(b.sentAfterBudgetMet),
          met: b.sentAfterBudgetMet === 0,
        },
        {
          what: `${st.label}: requests acquired after the budget-meeting commit, in Redis's order (all runs)`,
          required: '0',
          measured: String(b.acquiredAfterBudgetMet),
          met: b.acquiredAfterBudgetMet === 0,
        },
        {
          what: `${st.label}: final tokens >= budget (all runs)`,
          required: `>= ${st.budget}`,
          measured: `min ${b.finalTokensMin}`,
          met: b.finalTokensMin >= st.budget,
        },
      );
    }
    return {
      name: 'budget-overshoot',
      ok: targets.every((t) => t.met),
      targets,
      metrics: { config: { ...o, settings }, budgets: summaries, runs: cases },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => budgetOvershoot());
