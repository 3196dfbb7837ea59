import { rm } from 'node:fs/promises';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { loadConfig, runDir, type ConfigInput } from '../../shared/index.js';
import { startSimulator } from '../../sim/index.js';
import { openRunContextFor } from '../run-context.js';
import { runPipeline } from './generation.js';

/** The package root (where `data/demo` lives), from src/cli/commands or dist/cli/commands. */
const packageRoot = fileURLToPath(new URL('../../../', import.meta.url));

/** The demo's datasets and budgets: a mix that ends by budget and by running out of prompts. */
export const DEMO_DATASETS: readonly { name: string; tokenBudget: number }[] = [
  { name: 'B1_glaive', tokenBudget: 60_000 },
  { name: 'B2_magicoder', tokenBudget: 120_000 },
  { name: 'B3_ultrachat', tokenBudget: 80_000 },
  { name: 'B4_openmath', tokenBudget: 100_000 },
  { name: 'B5_sharegpt', tokenBudget: 50_000 },
  { name: 'B6_writing', tokenBudget: 90_000 },
  { name: 'B7_reasoning', tokenBudget: 70_000 },
  { name: 'B8_sweagent', tokenBudget: 1_000_000 },
];

interface DemoOptions {
  out: string;
  fresh?: boolean;
  timeScale: string;
  json?: boolean;
}

/** The demo config: embedded Redis, the simulator at `endpoint`, the bundled tokenizer. */
export function demoConfig(endpoint: string, outDir: string): ConfigInput {
  return {
    run: 'demo',
    sglang: { endpoints: [endpoint], concurrency: 64, requestTimeoutMs: 120_000 },
    datasets: DEMO_DATASETS.map((d) => ({
      name: d.name,
      prompts: `data/demo/${d.name}.jsonl`,
      tokenBudget: d.tokenBudget,
      maxNewTokens: 8192,
      batchSize: 16,
    })),
    output: { dir: outDir },
    workers: { shutdownGraceMs: 5_000 },
  };
}

/** `tokenmill demo`: the whole pipeline on embedded defaults, no GPU, no setup. */
export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description(
      'run the whole pipeline (generate, tokenize, merge) on the bundled sample datasets, against the built-in SGLang simulator and a private Redis',
    )
    .option('--out <dir>', 'output folder', './out')
    .option('--fresh', 'delete the previous demo run first (otherwise the demo resumes it)')
    .option('--time-scale <n>', 'how much faster than real time the simulated GPU runs', '25')
    .option('--json', 'print the final status as JSON')
    .action(async (opts: DemoOptions) => {
      const outDir = resolve(opts.out);
      const sim = await startSimulator({ port: 0, timeScale: Number(opts.timeScale), maxRunningRequests: 64, seed: 7 });
      try {
        const config = loadConfig({ object: demoConfig(sim.url, outDir), baseDir: packageRoot });
        if (opts.fresh === true) await rm(runDir(config), { recursive: true, force: true });
        process.stderr.write(`tokenmill demo: simulator at ${sim.url}, output in ${runDir(config)}\n`);
        const ctx = await openRunContextFor(config);
        try {
          // Generate, then tokenize and merge; prints the status table and the validation report.
          await runPipeline(ctx, { progressMs: 3_000, ...(opts.json === undefined ? {} : { json: opts.json }) });
        } finally {
          await ctx.close();
        }
      } finally {
        await sim.stop();
      }
    });
}
