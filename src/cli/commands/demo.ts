import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { AppError, bundledTokenizerPath, loadConfig, type ConfigInput } from '../../shared/index.js';
import { startSimulator } from '../../sim/index.js';
import { DASHBOARD_USER, startDashboard, type Dashboard } from '../../dashboard/index.js';
import { onceSignalled, openRunContextFor, type RunContext } from '../run-context.js';
import { printRunSummary, runPipelineStages } from './generation.js';
import { throwIfFailed } from './postprocess.js';
import {
  cliCommand,
  DEMO_DRAFTERS,
  type DemoDrafter,
  demoTrainerPython,
  finishDemoTraining,
  freePort,
  withDemoEval,
  withDemoTraining,
} from './demo-train.js';
import { demoConfigPath, demoNextCommands, formatDemoNext, writeDemoConfig } from './demo-config.js';

/** The package root (where `data/demo` lives), from src/cli/commands or dist/cli/commands. */
const packageRoot = fileURLToPath(new URL('../../../', import.meta.url));

/**
 * The demo's datasets and budgets: a mix that ends by budget and by running out of prompts. The
 * budgets are only 20–47 requests long, so one long last request can be 5–16 % of one; the
 * datasets that end by budget are therefore `budget: strict`, and land on it.
 */
export const DEMO_DATASETS: readonly {
  name: string;
  tokenBudget: number;
  budget: 'reserve' | 'strict';
  /** Multi-turn datasets are regenerated turn by turn. */
  turns?: 'all';
}[] = [
  { name: 'B1_glaive', tokenBudget: 60_000, budget: 'strict' },
  { name: 'B2_magicoder', tokenBudget: 90_000, budget: 'strict' },
  { name: 'B3_ultrachat', tokenBudget: 80_000, budget: 'strict' },
  { name: 'B4_openmath', tokenBudget: 80_000, budget: 'strict' },
  // Enough budget past the first wave of turn 1s (about 16 answers of ~3k tokens) for later turns to run.
  { name: 'B5_sharegpt', tokenBudget: 120_000, budget: 'strict', turns: 'all' },
  { name: 'B6_writing', tokenBudget: 80_000, budget: 'strict' },
  { name: 'B7_reasoning', tokenBudget: 70_000, budget: 'strict' },
  // Agentic: SWE-agent trajectories with OpenAI `tools`, regenerated turn by turn, calls included.
  { name: 'B8_sweagent', tokenBudget: 1_000_000, budget: 'reserve', turns: 'all' },
];

/**
 * Demo datasets read from a source as downloaded (a ShareGPT parquet file, an Alpaca JSONL file):
 * `prepare` turns them into their prompt files in the run folder before generation.
 */
export const DEMO_SOURCES: Readonly<Record<string, { path: string; format: 'sharegpt' | 'alpaca' }>> = {
  B5_sharegpt: { path: 'data/demo/sources/B5_sharegpt.parquet', format: 'sharegpt' },
  B6_writing: { path: 'data/demo/sources/B6_writing.alpaca.jsonl', format: 'alpaca' },
};

interface DemoOptions {
  out: string;
  fresh?: boolean;
  timeScale: string;
  json?: boolean;
  dashboard?: boolean;
  dashboardPort: string;
  drafter: string;
  datasets?: string;
}

/** `--drafter`, checked. */
function demoDrafter(value: string): DemoDrafter {
  const d = DEMO_DRAFTERS.find((x) => x === value);
  if (d === undefined) throw new AppError(`--drafter: expected one of ${DEMO_DRAFTERS.join(', ')}, got "${value}"`);
  return d;
}

/** The demo config keeping only the datasets of `--datasets` (comma-separated names), in the demo's order. */
export function onlyDemoDatasets(config: ConfigInput, names: string | undefined): ConfigInput {
  if (names === undefined) return config;
  const wanted = names.split(',').map((n) => n.trim());
  const known = DEMO_DATASETS.map((d) => d.name);
  const unknown = wanted.filter((n) => !known.includes(n));
  if (unknown.length > 0 || wanted.length === 0)
    throw new AppError(`--datasets: expected names among ${known.join(', ')}, got "${names}"`);
  return { ...config, datasets: (config.datasets ?? []).filter((d) => wanted.includes(d.name)) };
}

/**
 * The demo config: embedded Redis, the simulator at `endpoint`, the bundled tokenizer, the sample
 * datasets of the package at `root`. Every path is absolute, so the config means the same from
 * any folder (the demo writes it into its run folder).
 */
export function demoConfig(endpoint: string, outDir: string, root: string = packageRoot): ConfigInput {
  return {
    run: 'demo',
    sglang: { endpoints: [endpoint], concurrency: 64, requestTimeoutMs: 120_000 },
    tokenizer: { path: bundledTokenizerPath() },
    datasets: DEMO_DATASETS.map((d) => {
      const source = DEMO_SOURCES[d.name];
      return {
        name: d.name,
        ...(source === undefined
          ? { prompts: resolve(root, 'data', 'demo', `${d.name}.jsonl`) }
          : { source: { ...source, path: resolve(root, source.path) } }),
        tokenBudget: d.tokenBudget,
        budget: d.budget,
        ...(d.turns === undefined ? {} : { turns: d.turns }),
        maxNewTokens: 8192,
        batchSize: 16,
      };
    }),
    output: { dir: resolve(outDir) },
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
    .option(
      '--dashboard',
      'serve the dashboard (pipeline page, Bull Board, metrics) on 127.0.0.1 during the demo and keep it open at the end until Ctrl-C',
    )
    .option('--dashboard-port <port>', 'port of --dashboard (0: any free port)', '3000')
    .option(
      '--drafter <kind>',
      `the drafter the demo trains and evaluates (${DEMO_DRAFTERS.join(', ')}): eagle3 a next-token drafter on an EAGLE3 server, dflash a block drafter on a DFLASH server`,
      'eagle3',
    )
    .option('--datasets <names>', 'only these demo datasets, comma-separated (a smaller, quicker demo)')
    .action(async (opts: DemoOptions) => {
      const outDir = resolve(opts.out);
      const drafter = demoDrafter(opts.drafter);
      const json = opts.json === true;
      const sim = await startSimulator({
        port: 0,
        timeScale: Number(opts.timeScale),
        maxRunningRequests: 64,
        seed: 7,
        // Canonical ids, as a real model writes: the exported text routes reproduce the rows.
        output: 'text',
      });
      try {
        // With the trainer environment (`npm run setup:trainer`), the demo ends with a short CPU
        // training and its eval on two simulators that the eval step starts on free ports.
        const trainPython = demoTrainerPython(packageRoot);
        const ports: [number, number] = [await freePort(), await freePort()];
        while (ports[1] === ports[0]) ports[1] = await freePort();
        const base = onlyDemoDatasets(demoConfig(sim.url, outDir), opts.datasets);
        const input = withDemoEval(withDemoTraining(base, trainPython, packageRoot, drafter), {
          timeScale: Number(opts.timeScale),
          ports,
          cli: cliCommand(),
          drafter,
        });
        const dir = join(outDir, 'demo');
        if (opts.fresh === true) await rm(dir, { recursive: true, force: true });
        // The config file first, so that it is there even when the demo is stopped; the demo runs
        // with what that file says, so every later `-c` command sees the same run.
        const file = demoConfigPath(dir);
        await writeDemoConfig(file, input, dir);
        const config = loadConfig({ path: file });
        process.stderr.write(`tokenmill demo: simulator at ${sim.url}, output in ${dir}, config ${file}\n`);
        const ctx = await openRunContextFor(config);
        let dashboard: Dashboard | undefined;
        try {
          if (opts.dashboard === true) dashboard = await demoDashboard(ctx, opts.dashboardPort);
          // Generate, then tokenize and merge.
          const { generation, postprocess } = await runPipelineStages(ctx, { progressMs: 3_000 });
          const finished = generation === 'finished' && postprocess !== 'signalled';
          const failed = postprocess !== undefined && postprocess !== 'signalled' && postprocess.status === 'failed';
          // The status table and the validation report now; as JSON, one object after the train stage.
          if (!json) await printRunSummary(ctx, postprocess === undefined ? {} : { postprocess });
          // Stopped before the end (exit code 130 / 143 already set), or a failed round: no training.
          const trained = finished && !failed ? await finishDemoTraining(ctx, trainPython, { json }) : true;
          if (!trained) process.exitCode = 1;
          const next = demoNextCommands(file, dir, {
            trains: trainPython !== null,
            ...(json ? {} : { cwd: process.cwd() }),
          });
          if (json)
            await printRunSummary(ctx, {
              json,
              ...(postprocess === undefined ? {} : { postprocess }),
              extra: { config: file, next },
            });
          else process.stdout.write(`\n${formatDemoNext(file, next)}\n`);
          if (postprocess !== undefined) throwIfFailed(postprocess);
          if (!finished) return;
          if (dashboard !== undefined) {
            process.stderr.write(
              `tokenmill demo: finished; the dashboard stays open at ${dashboard.url} (user "${DASHBOARD_USER}", password ${dashboard.token}); Ctrl-C to stop\n`,
            );
            await onceSignalled();
          }
        } finally {
          // The dashboard (HTTP server, its queues), then Redis.
          await dashboard?.stop();
          await ctx.close();
        }
      } finally {
        await sim.stop();
      }
    });
}

/**
 * The demo's dashboard on 127.0.0.1 with a token made up now (the demo has no config to hold
 * one); on a busy port, any free one. Prints the URL and the token.
 */
async function demoDashboard(ctx: RunContext, portText: string): Promise<Dashboard> {
  const port = Number(portText);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new AppError(`--dashboard-port: expected a TCP port (0-65535), got "${portText}"`);
  const options = { redis: ctx.redis, keys: ctx.keys, config: ctx.config, host: '127.0.0.1' };
  let dashboard: Dashboard;
  try {
    dashboard = await startDashboard({ ...options, port });
  } catch (e: unknown) {
    if ((e as { code?: unknown }).code !== 'EADDRINUSE') throw e;
    dashboard = await startDashboard({ ...options, port: 0 });
  }
  process.stderr.write(
    `tokenmill demo: dashboard at ${dashboard.url} (user "${DASHBOARD_USER}", password ${dashboard.token})\n`,
  );
  return dashboard;
}
