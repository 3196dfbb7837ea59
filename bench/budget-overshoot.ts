// Benchmark 2: budget overshoot. For token budgets small, medium and large relative to
// concurrency x mean completion length, how far past the budget does the final count land, and
// is any request sent after the budget was met (DESIGN invariant 3)?
import type { Redis } from 'ioredis';
import { startSimulator, type SimRequestRecord } from '../src/sim/index.js';
import { RunKeys } from '../src/shared/index.js';
import { readGenerations, sampleIdOfRid } from '../test/helpers/pipeline.js';
import {
  benchConfig,
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

export interface BudgetOvershootOptions {
  /** Each budget is run `repeats` times (a fresh run each time): the overshoot is a random variable. */
  budgets: { budget: number; repeats: number }[];
  concurrency: number;
  meanOutputTokens: number;
  sigma: number;
  maxNewTokens: number;
  timeScale: number;
  prompts: number;
}

export const DEFAULT_BUDGET_OVERSHOOT: BudgetOvershootOptions = {
  budgets: [
    { budget: 50_000, repeats: 8 },
    { budget: 500_000, repeats: 4 },
    { budget: 5_000_000, repeats: 1 },
  ],
  concurrency: 64,
  meanOutputTokens: 2700,
  sigma: 0.8,
  maxNewTokens: 10_240,
  timeScale: 150,
  prompts: 4_000,
};

interface BudgetCase {
  budget: number;
  /** Budget / (concurrency x mean completion length). */
  budgetInBatches: number;
  finalTokens: number;
  overshootTokens: number;
  overshootRatio: number;
  records: number;
  requestsSent: number;
  /** Requests the simulator received strictly after the commit that met the budget. */
  sentAfterBudgetMet: number;
  /** Requests received in the same millisecond as that commit. */
  sentInBudgetMetMs: number;
  /** Each request received after the budget was met: how late (ms), whether its result was committed, and whether Redis ran its acquire after the budget-meeting commit. */
  lateRequests: { rid: string; lateByMs: number; committed: boolean; acquiredAfterBudgetMet: boolean }[];
  /** Requests the simulator received whose acquire script ran, in Redis's order, after the commit that met the budget. */
  acquiredAfterBudgetMet: number;
  /** Samples committed after the budget was met: the requests in flight at that moment. */
  committedAfterBudgetMet: number;
  skippedByBudget: number;
  /** Prompts the producer put in the queue (its cursor): sent + skipped by budget. */
  promptsEnqueued: number;
  /** Mean running requests from the first request to the end, tail included (the reservation's cost). */
  meanRunningWholeRun: number;
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

  constructor(private readonly keys: RunKeys, private readonly dataset: string) {}

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
      if (keys[0] === statsKey && keys[1] === inflightKey && argv[0] !== undefined) this.acquiredAt.set(argv[0], this.seq);
      else if (keys[0] === doneKey && keys[1] === statsKey && argv[0] !== undefined) this.commits.push({ seq: this.seq, id: argv[0], tokens: Number(argv[1]) });
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
  budget: number;
  budgetInBatches: number;
  runs: number;
  overshootRatioMedian: number;
  overshootRatioMax: number;
  overshootTokensMedian: number;
  overshootTokensMax: number;
  finalTokensMin: number;
  inFlightWhenMet: number[];
  /** Median over the runs. */
  skippedByBudgetMedian: number;
  /** Summed over the runs. */
  sentAfterBudgetMet: number;
  /** Summed over the runs. */
  acquiredAfterBudgetMet: number;
  /** How late (ms after budgetMetMs) each request received after the budget was met arrived. */
  lateByMs: number[];
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] ?? NaN) : ((s[m - 1] ?? NaN) + (s[m] ?? NaN)) / 2;
}

function summarize(budget: number, runs: readonly BudgetCase[]): BudgetSummary {
  return {
    budget,
    budgetInBatches: runs[0]?.budgetInBatches ?? NaN,
    runs: runs.length,
    overshootRatioMedian: round(median(runs.map((r) => r.overshootRatio)), 4),
    overshootRatioMax: Math.max(...runs.map((r) => r.overshootRatio)),
    overshootTokensMedian: median(runs.map((r) => r.overshootTokens)),
    overshootTokensMax: Math.max(...runs.map((r) => r.overshootTokens)),
    finalTokensMin: Math.min(...runs.map((r) => r.finalTokens)),
    inFlightWhenMet: runs.map((r) => r.committedAfterBudgetMet),
    skippedByBudgetMedian: median(runs.map((r) => r.skippedByBudget)),
    // A negative count means budgetMetMs was missing: count it as a miss.
    sentAfterBudgetMet: runs.reduce((a, r) => a + (r.sentAfterBudgetMet < 0 ? 1 : r.sentAfterBudgetMet), 0),
    acquiredAfterBudgetMet: runs.reduce((a, r) => a + r.acquiredAfterBudgetMet, 0),
    lateByMs: runs.flatMap((r) => r.lateRequests.map((l) => l.lateByMs)),
  };
}

async function runBudget(env: BenchEnv, o: BudgetOvershootOptions, budget: number, repeat: number, promptFile: string): Promise<BudgetCase> {
  const t0 = performance.now();
  const sim = await startSimulator({
    timeScale: o.timeScale,
    maxRunningRequests: o.concurrency,
    seed: 5,
    outputLength: { distribution: 'lognormal', mean: o.meanOutputTokens, sigma: o.sigma },
  });
  try {
    const config = benchConfig(env, {
      run: `budget-${budget}-${repeat}`,
      endpoint: sim.url,
      concurrency: o.concurrency,
      datasets: [{ name: 'ds', prompts: promptFile, tokenBudget: budget, maxNewTokens: o.maxNewTokens, sampling: { temperature: 0.6, top_p: 0.95 } }],
    });
    const order = new RedisOrderLog(new RunKeys(config.redis.prefix, config.run), 'ds');
    await order.start(env.redis.connection('client'));
    const gen = await startTokenmill(config);
    let finishedAtMs: number;
    let meanRunning: number;
    // The occupancy window starts at the first request (not at the simulator's start); the
    // requests logged before that reset are kept.
    const early: SimRequestRecord[] = [];
    try {
      await waitUntil(() => sim.stats().requestsReceived > 0, 'the first request', 60_000, 2);
      early.push(...sim.stats().requests);
      sim.resetStats();
      await gen.handle.finished;
      finishedAtMs = Date.now();
      meanRunning = sim.stats().occupancy.meanRunning;
    } finally {
      await gen.stop();
      order.stop();
    }
    // Read what the run left: the stats hash (via a fresh connection: the context is closed),
    // the simulator's request log and the JSONL files written by the sink.
    const redis = env.redis.connection('client');
    const keys = gen.ctx.keys;
    const stats = await redis.hgetall(keys.stats('ds'));
    const skipped = await redis.scard(keys.skipped('ds'));
    const enqueued = Number((await redis.hget(keys.producer('ds'), 'line')) ?? 0);
    const finalTokens = Number(stats['outputTokens'] ?? 0);
    const budgetMetMs = Number(stats['budgetMetMs'] ?? NaN);
    const sent = [...early, ...sim.stats().requests].filter((r) => r.rid.startsWith('ds/'));
    const records = readGenerations(gen.ctx.runDir, 'ds');
    const recorded = new Set(records.map((r) => r.id));
    const metSeq = order.budgetMetSeq(budget);
    if (!Number.isFinite(metSeq)) throw new Error(`MONITOR saw ${order.commits.length} commits and none met the budget`);
    const unseen = sent.filter((r) => !order.acquiredAt.has(r.rid)).length;
    if (unseen > 0) throw new Error(`MONITOR saw no acquire for ${unseen} of the ${sent.length} requests sent`);
    const acquiredLate = (rid: string): boolean => (order.acquiredAt.get(rid) ?? Infinity) > metSeq;
    const fileTokens = records.reduce((a, r) => a + r.completion_tokens, 0);
    if (fileTokens !== finalTokens) throw new Error(`records on disk hold ${fileTokens} tokens, the counter ${finalTokens}`);
    return {
      budget,
      budgetInBatches: round(budget / (o.concurrency * o.meanOutputTokens), 2),
      finalTokens,
      overshootTokens: finalTokens - budget,
      overshootRatio: round((finalTokens - budget) / budget, 4),
      records: records.length,
      requestsSent: sent.length,
      sentAfterBudgetMet: Number.isFinite(budgetMetMs) ? sent.filter((r) => r.receivedAtMs > budgetMetMs).length : -1,
      sentInBudgetMetMs: Number.isFinite(budgetMetMs) ? sent.filter((r) => r.receivedAtMs === budgetMetMs).length : -1,
      lateRequests: sent
        .filter((r) => r.receivedAtMs > budgetMetMs)
        .map((r) => ({ rid: r.rid, lateByMs: r.receivedAtMs - budgetMetMs, committed: recorded.has(sampleIdOfRid(r.rid)), acquiredAfterBudgetMet: acquiredLate(r.rid) })),
      acquiredAfterBudgetMet: sent.filter((r) => acquiredLate(r.rid)).length,
      committedAfterBudgetMet: records.filter((r) => Date.parse(r.ts) > budgetMetMs).length,
      skippedByBudget: skipped,
      promptsEnqueued: enqueued,
      meanRunningWholeRun: round(meanRunning, 2),
      tailAfterBudgetMetS: round((finishedAtMs - budgetMetMs) / 1000, 2),
      wallS: round((performance.now() - t0) / 1000, 1),
    };
  } finally {
    await sim.stop();
  }
}

export async function budgetOvershoot(o: BudgetOvershootOptions = DEFAULT_BUDGET_OVERSHOOT): Promise<BenchResult> {
  const started = performance.now();
  const env = await openBenchEnv('budget');
  try {
    writePrompts(env.dir, 'prompts', o.prompts);
    const summaries: BudgetSummary[] = [];
    const cases: BudgetCase[] = [];
    for (const { budget, repeats } of o.budgets) {
      const runs: BudgetCase[] = [];
      for (let i = 0; i < repeats; i += 1) runs.push(await runBudget(env, o, budget, i, 'prompts.jsonl'));
      cases.push(...runs);
      summaries.push(summarize(budget, runs));
    }
    const targets: BenchResult['targets'] = [];
    const summary = [
      `concurrency ${o.concurrency}, lognormal completions (mean ${o.meanOutputTokens}, sigma ${o.sigma}, max_new_tokens ${o.maxNewTokens}); one batch = ${fmtInt(o.concurrency * o.meanOutputTokens)} tokens`,
    ];
    for (const b of summaries) {
      summary.push(
        `budget ${fmtInt(b.budget)} (${b.budgetInBatches} batches), ${b.runs} run(s): overshoot median ${(b.overshootRatioMedian * 100).toFixed(2)}% (${fmtInt(b.overshootTokensMedian)} tokens), ` +
          `max ${(b.overshootRatioMax * 100).toFixed(2)}% (${fmtInt(b.overshootTokensMax)} tokens); in flight when met: ${b.inFlightWhenMet.join(', ')}; ` +
          `received after the budget was met: ${b.sentAfterBudgetMet}${b.lateByMs.length > 0 ? ` (by ${b.lateByMs.join(', ')} ms)` : ''}, acquired after it (Redis order): ${b.acquiredAfterBudgetMet}; prompts skipped by budget (median) ${b.skippedByBudgetMedian}`,
      );
      targets.push(
        {
          what: `budget ${fmtInt(b.budget)}: requests received by the simulator after budgetMetMs (all runs)`,
          required: '0',
          measured: String(b.sentAfterBudgetMet),
          met: b.sentAfterBudgetMet === 0,
        },
        {
          what: `budget ${fmtInt(b.budget)}: requests acquired after the budget-meeting commit, in Redis's order (all runs)`,
          required: '0',
          measured: String(b.acquiredAfterBudgetMet),
          met: b.acquiredAfterBudgetMet === 0,
        },
        { what: `budget ${fmtInt(b.budget)}: final tokens >= budget (all runs)`, required: `>= ${b.budget}`, measured: `min ${b.finalTokensMin}`, met: b.finalTokensMin >= b.budget },
      );
    }
    return {
      name: 'budget-overshoot',
      ok: targets.every((t) => t.met),
      targets,
      metrics: { config: o, budgets: summaries, runs: cases },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    await env.close();
  }
}

if (isMain(import.meta.url)) runAsScript(() => budgetOvershoot());
