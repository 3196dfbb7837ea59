// Benchmark 2: budget overshoot. For token budgets small, medium and large relative to
// concurrency x mean completion length, how far past the budget does the final count land, and
// is any request sent after the budget was met (DESIGN invariant 3)?
import { startSimulator } from '../src/sim/index.js';
import { readGenerations } from '../test/helpers/pipeline.js';
import {
  benchConfig,
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
    { budget: 50_000, repeats: 5 },
    { budget: 500_000, repeats: 3 },
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
  /** Requests received in the same millisecond as that commit (sent before it: see below). */
  sentInBudgetMetMs: number;
  /** Samples committed after the budget was met: the requests in flight at that moment. */
  committedAfterBudgetMet: number;
  skippedByBudget: number;
  /** Mean running requests over the whole run, tail included (the reservation's cost). */
  meanRunningWholeRun: number;
  /** Wall seconds from the budget met to the generation finished (in-flight tail + drain). */
  tailAfterBudgetMetS: number;
  wallS: number;
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
  /** Summed over the runs. */
  sentAfterBudgetMet: number;
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
    // A negative count means budgetMetMs was missing: count it as a miss.
    sentAfterBudgetMet: runs.reduce((a, r) => a + (r.sentAfterBudgetMet < 0 ? 1 : r.sentAfterBudgetMet), 0),
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
    const gen = await startTokenmill(config);
    let finishedAtMs: number;
    try {
      await gen.handle.finished;
      finishedAtMs = Date.now();
    } finally {
      await gen.stop();
    }
    // Read what the run left: the stats hash (via a fresh connection: the context is closed),
    // the simulator's request log and the JSONL files written by the sink.
    const redis = env.redis.connection('client');
    const keys = gen.ctx.keys;
    const stats = await redis.hgetall(keys.stats('ds'));
    const skipped = await redis.scard(keys.skipped('ds'));
    const finalTokens = Number(stats['outputTokens'] ?? 0);
    const budgetMetMs = Number(stats['budgetMetMs'] ?? NaN);
    const s = sim.stats();
    const sent = s.requests.filter((r) => r.rid.startsWith('ds/'));
    const records = readGenerations(gen.ctx.runDir, 'ds');
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
      committedAfterBudgetMet: records.filter((r) => Date.parse(r.ts) > budgetMetMs).length,
      skippedByBudget: skipped,
      meanRunningWholeRun: round(s.occupancy.meanRunning, 2),
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
          `max ${(b.overshootRatioMax * 100).toFixed(2)}% (${fmtInt(b.overshootTokensMax)} tokens); in flight when met: ${b.inFlightWhenMet.join(', ')}; sent after the budget was met: ${b.sentAfterBudgetMet}`,
      );
      targets.push(
        { what: `budget ${fmtInt(b.budget)}: requests sent after the budget was met (all runs)`, required: '0', measured: String(b.sentAfterBudgetMet), met: b.sentAfterBudgetMet === 0 },
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
