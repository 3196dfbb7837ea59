// Runs the benchmarks one after the other and writes bench/results/latest.json.
//   npm run bench                       every benchmark
//   npm run bench -- budget-overshoot   only the ones named
//   BENCH_RESULTS_FILE=merge-scaling.json npm run bench -- merge-scaling   into another file of bench/results
// Exit status: 0 when every target was met, 1 when one was missed, 2 when a benchmark failed.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { agenticThroughput } from './agentic-throughput.js';
import { budgetOvershoot } from './budget-overshoot.js';
import { concurrencyAuto } from './concurrency-auto.js';
import { demoBudgets } from './demo-budgets.js';
import { gpuSaturation } from './gpu-saturation.js';
import { longCompletions } from './long-completions.js';
import { installBenchLogger, printResult, type BenchResult } from './lib.js';
import { mergeScaling } from './merge-scaling.js';
import { multiTurnCache } from './multi-turn-cache.js';
import { prepareMemory } from './prepare-memory.js';
import { producerMemory } from './producer-memory.js';
import { producerMemoryConversations } from './producer-memory-conversations.js';
import { redisMemory } from './redis-memory.js';
import { requestOverhead } from './request-overhead.js';
import { seedsWorkload } from './seeds-workload.js';
import { simSpeculative } from './sim-speculative.js';
import { throughputCeiling } from './throughput-ceiling.js';
import { tokenizeThroughput } from './tokenize-throughput.js';

const BENCHMARKS: Record<string, () => Promise<BenchResult>> = {
  'gpu-saturation': () => gpuSaturation(),
  'budget-overshoot': () => budgetOvershoot(),
  'demo-budgets': () => demoBudgets(),
  'redis-memory': () => redisMemory(),
  'throughput-ceiling': () => throughputCeiling(),
  'producer-memory': () => producerMemory(),
  'producer-memory-conversations': () => producerMemoryConversations(),
  'prepare-memory': () => prepareMemory(),
  'tokenize-throughput': () => tokenizeThroughput(),
  'merge-scaling': () => mergeScaling(),
  'request-overhead': () => requestOverhead(),
  'concurrency-auto': () => concurrencyAuto(),
  'seeds-workload': () => seedsWorkload(),
  'long-completions': () => longCompletions(),
  'multi-turn-cache': () => multiTurnCache(),
  'sim-speculative': () => simSpeculative(),
  'agentic-throughput': () => agenticThroughput(),
};

/** The commit the benchmarks ran on, and whether src/ had uncommitted changes. */
function gitState(): { commit: string; srcDirty: boolean } {
  try {
    const commit = execFileSync('git', ['rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'src'], { encoding: 'utf8' }).trim() !== '';
    return { commit, srcDirty: dirty };
  } catch {
    return { commit: 'unknown', srcDirty: false };
  }
}

function redisVersion(): string {
  try {
    return /v=(\S+)/.exec(execFileSync('redis-server', ['--version'], { encoding: 'utf8' }))?.[1] ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

async function main(): Promise<number> {
  installBenchLogger();
  const names = process.argv.slice(2);
  const unknown = names.filter((n) => !(n in BENCHMARKS));
  if (unknown.length > 0) {
    process.stderr.write(`unknown benchmark(s): ${unknown.join(', ')}; known: ${Object.keys(BENCHMARKS).join(', ')}\n`);
    return 2;
  }
  const selected = names.length > 0 ? names : Object.keys(BENCHMARKS);
  const fileName = process.env['BENCH_RESULTS_FILE'] ?? 'latest.json';
  if (!/^[\w.-]+\.json$/.test(fileName)) {
    process.stderr.write(`BENCH_RESULTS_FILE must be a file name ending in .json, got ${JSON.stringify(fileName)}\n`);
    return 2;
  }
  const file = path.join(path.dirname(fileURLToPath(import.meta.url)), 'results', fileName);
  const startedAt = new Date();
  const git = gitState();
  // Other work on the machine competes for its cores: the load average says how much there was.
  const loadBefore = os.loadavg().map((x) => Math.round(x * 100) / 100);
  const results: (BenchResult & { loadAverage1m: { before: number; after: number } })[] = [];
  let failed = false;
  // Written after each benchmark, so that a long run cut short keeps what it measured.
  const writeReport = (): string => {
    const cpus = os.cpus();
    const report = {
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      git,
      command: `npm run bench${names.length > 0 ? ` -- ${names.join(' ')}` : ''}`,
      machine: {
        cpus: cpus.length,
        cpuModel: cpus[0]?.model ?? 'unknown',
        memoryGiB: Math.round(os.totalmem() / 2 ** 30),
        platform: `${os.type()} ${os.release()} ${os.arch()}`,
        node: process.version,
        redis: redisVersion(),
        loadAverageBefore: loadBefore,
        loadAverageAfter: os.loadavg().map((x) => Math.round(x * 100) / 100),
      },
      results,
    };
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`);
    return file;
  };
  for (const name of selected) {
    const bench = BENCHMARKS[name];
    if (bench === undefined) continue;
    process.stdout.write(`-- running ${name}\n`);
    const before = os.loadavg()[0] ?? NaN;
    try {
      const r = await bench();
      printResult(r);
      results.push({
        ...r,
        loadAverage1m: {
          before: Math.round(before * 100) / 100,
          after: Math.round((os.loadavg()[0] ?? NaN) * 100) / 100,
        },
      });
      writeReport();
    } catch (e: unknown) {
      failed = true;
      process.stderr.write(`benchmark ${name} failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    }
  }
  writeReport();
  const missed = results.flatMap((r) =>
    r.targets.filter((t) => !t.met).map((t) => `${r.name}: ${t.what} (required ${t.required}, measured ${t.measured})`),
  );
  process.stdout.write(`results written to ${path.relative(process.cwd(), file)}\n`);
  if (missed.length > 0) process.stdout.write(`targets missed:\n${missed.map((m) => `  - ${m}`).join('\n')}\n`);
  if (failed) return 2;
  return missed.length > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(2);
  },
);
