// Benchmark: the demo's table, as a new user first sees it. Runs `tokenmill demo --fresh --json`
// (the CLI as a child process, on its embedded defaults and its default speed) a few times and
// reads, for every dataset that ended by budget, its output tokens against its budget, and how
// many of its records are `abort` partial outputs (the demo's budget-bound datasets are strict).
// Goal: each within a few percent (<= 3 %) of its budget, in every run.
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { spawnCli } from '../test/helpers/pipeline.js';
import { isMain, round, runAsScript, type BenchResult } from './lib.js';

export interface DemoBudgetsOptions {
  runs: number;
  /** Required: every budget-bound dataset at most this far past its budget (ratio). */
  maxOver: number;
}

export const DEFAULT_DEMO_BUDGETS: DemoBudgetsOptions = { runs: 3, maxOver: 0.03 };

interface DatasetStatus {
  name: string;
  outputTokens: number;
  tokenBudget: number;
}

interface DatasetOutcome {
  name: string;
  percent: number;
  aborted: number;
  byBudget: boolean;
}

/** One `tokenmill demo --fresh --json` into `outDir`; its final status. */
async function runDemo(outDir: string): Promise<{ datasets: DatasetStatus[]; wallS: number }> {
  const t0 = performance.now();
  const demo = spawnCli(['demo', '--out', outDir, '--fresh', '--json']);
  const code = await demo.exited;
  if (code !== 0) throw new Error(`tokenmill demo exited with ${code}:\n${demo.output().slice(-3_000)}`);
  const status = JSON.parse(demo.stdout().trim().split('\n').at(-1) ?? '') as { datasets: DatasetStatus[] };
  return { datasets: status.datasets, wallS: (performance.now() - t0) / 1000 };
}

/** Records of `dataset` whose finish reason is `abort`. */
async function abortedRecords(outDir: string, dataset: string): Promise<number> {
  const dir = path.join(outDir, 'demo', dataset, 'generations');
  let n = 0;
  for (const f of await readdir(dir)) {
    if (!f.endsWith('.jsonl')) continue;
    for (const line of (await readFile(path.join(dir, f), 'utf8')).split('\n')) {
      if (line === '') continue;
      const r = JSON.parse(line) as { finish_reason?: { type?: string } };
      if (r.finish_reason?.type === 'abort') n += 1;
    }
  }
  return n;
}

export async function demoBudgets(o: DemoBudgetsOptions = DEFAULT_DEMO_BUDGETS): Promise<BenchResult> {
  const t0 = performance.now();
  // The demo starts its own redis-server and simulator: only a folder is needed here.
  const dir = await mkdtemp(path.join(os.tmpdir(), 'tm-bench-demo-budgets-'));
  try {
    const runs: { wallS: number; datasets: DatasetOutcome[] }[] = [];
    for (let i = 0; i < o.runs; i += 1) {
      const outDir = path.join(dir, `run-${i}`);
      process.stdout.write(`   demo-budgets: tokenmill demo, run ${i + 1} of ${o.runs}\n`);
      const r = await runDemo(outDir);
      const datasets: DatasetOutcome[] = [];
      for (const d of r.datasets) {
        datasets.push({
          name: d.name,
          percent: round((100 * d.outputTokens) / d.tokenBudget, 2),
          aborted: await abortedRecords(outDir, d.name),
          byBudget: d.outputTokens >= d.tokenBudget,
        });
      }
      runs.push({ wallS: round(r.wallS, 1), datasets });
    }
    const byBudget = runs.flatMap((r) => r.datasets.filter((d) => d.byBudget));
    const worst = Math.max(...byBudget.map((d) => d.percent));
    const best = Math.min(...byBudget.map((d) => d.percent));
    const aborted = byBudget.map((d) => d.aborted);
    const met = byBudget.length > 0 && worst <= 100 * (1 + o.maxOver);
    return {
      name: 'demo-budgets',
      ok: met,
      targets: [
        {
          what: `the demo's table: every dataset that ended by budget, in ${o.runs} runs`,
          required: `<= ${(100 * (1 + o.maxOver)).toFixed(0)} % of its budget`,
          measured: `${best.toFixed(2)}–${worst.toFixed(2)} %`,
          met,
        },
      ],
      metrics: { runs },
      summary: [
        `${o.runs} runs of tokenmill demo: ${byBudget.length} dataset-runs ended by budget, at ${best.toFixed(2)}–${worst.toFixed(2)} % of their budgets; abort records per dataset ${Math.min(...aborted)}–${Math.max(...aborted)}; wall ${runs.map((r) => `${r.wallS} s`).join(', ')}`,
        ...runs.map(
          (r, i) =>
            `run ${i + 1}: ${r.datasets.map((d) => `${d.name} ${d.percent.toFixed(2)} %${d.byBudget ? ` (${d.aborted} abort)` : ' (out of prompts)'}`).join(', ')}`,
        ),
      ],
      wallS: round((performance.now() - t0) / 1000, 1),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

if (isMain(import.meta.url)) runAsScript(() => demoBudgets());
