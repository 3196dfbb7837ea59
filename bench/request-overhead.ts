// Per-request overhead: tokenmill's whole generation stage (producer, Redis, inference worker,
// results sink writing JSONL to disk) against a hand-written client (bench/clients/semaphore-loop.ts:
// a semaphore of N requests on undici, one JSONL line per result), side by side on the same
// fast server. The simulator runs in a child process with a huge timeScale and fixed short
// outputs, so it answers almost at once and neither client shares its event loop with it; what
// limits prompts/s is each client's own work per request.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { loadRunTokenizer } from '../src/cli/tokenizer-check.js';
import { runSemaphoreLoop, type LoopPrompt } from './clients/semaphore-loop.js';
import {
  benchConfig,
  cpuMeter,
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

export interface OverheadCase {
  /** Names the case in the summary. */
  label: string;
  prompts: number;
  concurrency: number;
  /** The simulator's completion lengths: `fixed` at `meanOutputTokens`, or a long-tailed lognormal. */
  output: { distribution: 'fixed' | 'lognormal'; mean: number; sigma?: number };
  maxNewTokens: number;
  timeScale: number;
  /** Targets of this case; a case without them only reports. */
  minPromptsPerSec?: number;
  minRatio?: number;
  /** Measure output tokens/s (long completions) instead of prompts/s for the ratio. */
  ratioOf: 'prompts' | 'tokens';
  /**
   * The loop the ratio is taken against: `floor` is given the prompts already tokenized (before
   * its clock starts); `tokenizing` starts where tokenmill starts, from the prompts file: it
   * loads the same tokenizer and renders and tokenizes each prompt just before sending it. The
   * other loop runs too when `bothLoops`, and its ratio is reported beside the goal.
   */
  ratioAgainst: 'floor' | 'tokenizing';
  bothLoops?: boolean;
}

export interface RequestOverheadOptions {
  cases: OverheadCase[];
  /** Rounds per case, alternating loop and tokenmill; the best round of each is compared. */
  rounds: number;
}

export const DEFAULT_REQUEST_OVERHEAD: RequestOverheadOptions = {
  cases: [
    {
      label: '16-token outputs',
      prompts: 4_000,
      concurrency: 64,
      output: { distribution: 'fixed', mean: 16 },
      maxNewTokens: 16,
      timeScale: 1_000_000,
      minPromptsPerSec: 2_000,
      minRatio: 0.6,
      ratioOf: 'prompts',
      ratioAgainst: 'tokenizing',
      bothLoops: true,
    },
    {
      label: 'long-tailed outputs',
      prompts: 1_500,
      concurrency: 64,
      output: { distribution: 'lognormal', mean: 1_000, sigma: 1.0 },
      maxNewTokens: 8_192,
      timeScale: 200,
      ratioOf: 'tokens',
      ratioAgainst: 'floor',
    },
  ],
  rounds: 2,
};

type Client = 'loop' | 'loop-tokenizing' | 'tokenmill';

interface RoundResult {
  client: Client;
  wallS: number;
  prompts: number;
  outputTokens: number;
  promptsPerSec: number;
  tokensPerSec: number;
  /** tokenmill: from the first commit to the last record on disk (start-up and finish detection left out). */
  steadyPromptsPerSec?: number;
  startupS?: number;
  /** tokenmill: from the start to the first commit, and from the last commit to the end (every record on disk, the run finished). */
  firstCommitS?: number;
  tailS?: number;
  /** Time-weighted mean of requests running in the simulator over the round (of `concurrency`). */
  simMeanRunning: number;
  cpu: { nodeCores: number; redisCores: number | undefined };
}

interface CaseRun {
  metrics: Record<string, unknown>;
  summary: string[];
  targets: BenchResult['targets'];
}

export async function requestOverhead(o: RequestOverheadOptions = DEFAULT_REQUEST_OVERHEAD): Promise<BenchResult> {
  const started = performance.now();
  const runs: CaseRun[] = [];
  for (const c of o.cases) runs.push(await runCase(c, o.rounds));
  const targets = runs.flatMap((r) => r.targets);
  return {
    name: 'request-overhead',
    ok: targets.every((t) => t.met),
    targets,
    metrics: { cases: runs.map((r) => r.metrics), loadAverage: os.loadavg().map((x) => round(x, 2)) },
    summary: runs.flatMap((r) => r.summary),
    wallS: (performance.now() - started) / 1000,
  };
}

/**
 * With `BENCH_CPU_PROFILE=<dir>`, a V8 CPU profile of each client's round is written there
 * (`<case>-<client>-<round>.cpuprofile`, open it in Chrome DevTools or speedscope).
 */
async function profiled<T>(name: string, body: () => Promise<T>): Promise<T> {
  const dir = process.env['BENCH_CPU_PROFILE'];
  if (dir === undefined || dir === '') return body();
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 200 });
  await session.post('Profiler.start');
  try {
    return await body();
  } finally {
    const { profile } = await session.post('Profiler.stop');
    session.disconnect();
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, `${name.replace(/[^\w.-]+/g, '-')}.cpuprofile`), JSON.stringify(profile));
  }
}

/** The simulator in a child process; resolves with its URL once it listens. */
async function startSimChild(c: OverheadCase): Promise<{ url: string; child: ChildProcess; stop(): Promise<void> }> {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const opts = JSON.stringify({
    port: 0,
    timeScale: c.timeScale,
    maxRunningRequests: c.concurrency,
    seed: 11,
    outputLength: c.output,
  });
  const code =
    `const { startSimulator } = await import(${JSON.stringify(pathToImport(path.join(root, 'src/sim/index.ts')))});` +
    `const { createRootLogger } = await import(${JSON.stringify(pathToImport(path.join(root, 'src/shared/index.ts')))});` +
    `createRootLogger({ level: 'error' });` +
    `const sim = await startSimulator(${opts});` +
    `process.stdout.write('SIM_URL ' + sim.url + '\\n');` +
    `process.on('SIGTERM', () => sim.stop().then(() => process.exit(0)));`;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    const timer = setTimeout(() => reject(new Error('the simulator child did not print its URL within 30 s')), 30_000);
    lines.on('line', (l) => {
      if (l.startsWith('SIM_URL ')) {
        clearTimeout(timer);
        resolve(l.slice('SIM_URL '.length).trim());
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the simulator child exited (code ${code}) before it listened`));
    });
  });
  return {
    url,
    child,
    async stop() {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

/** Resets the simulator's counters (a round starts), or reads its mean running requests since then. */
async function simOccupancy(url: string, reset: boolean): Promise<number> {
  const res = await fetch(`${url}/_sim/${reset ? 'reset' : 'stats'}`, { method: reset ? 'POST' : 'GET' });
  const body = (await res.json()) as { occupancy?: { meanRunning: number } };
  return body.occupancy?.meanRunning ?? NaN;
}

function pathToImport(p: string): string {
  return new URL(`file://${p}`).href;
}

/** Records and output tokens in JSONL files (a check that each client wrote every result). */
function countLines(files: string[]): { lines: number; tokens: number } {
  let lines = 0;
  let tokens = 0;
  for (const f of files) {
    for (const l of readFileSync(f, 'utf8').split('\n')) {
      if (l === '') continue;
      lines += 1;
      tokens += (JSON.parse(l) as { output_ids: number[] }).output_ids.length;
    }
  }
  return { lines, tokens };
}

async function runLoop(
  env: BenchEnv,
  url: string,
  c: OverheadCase,
  prompts: LoopPrompt[],
  round_: number,
): Promise<RoundResult> {
  const outFile = path.join(env.dir, `loop-${round_}.jsonl`);
  await simOccupancy(url, true);
  const cpu = cpuMeter(undefined);
  const r = await runSemaphoreLoop({
    urls: [url],
    slots: c.concurrency,
    prompts,
    samplingParams: { max_new_tokens: c.maxNewTokens },
    outFile,
  });
  const wallS = r.wallMs / 1000;
  const disk = countLines([outFile]);
  if (disk.lines !== c.prompts || disk.tokens !== r.outputTokens)
    throw new Error(
      `the loop wrote ${disk.lines} records (${disk.tokens} tokens) to ${outFile}, expected ${c.prompts} (${r.outputTokens})`,
    );
  const simMeanRunning = await simOccupancy(url, false);
  return {
    client: 'loop',
    simMeanRunning,
    wallS,
    prompts: r.completed,
    outputTokens: r.outputTokens,
    promptsPerSec: r.completed / wallS,
    tokensPerSec: r.outputTokens / wallS,
    cpu: cpu.stop(),
  };
}

/** The loop that starts from the prompts file: its clock covers loading the tokenizer, reading the file and tokenizing each prompt. */
async function runTokenizingLoop(env: BenchEnv, url: string, c: OverheadCase, round_: number): Promise<RoundResult> {
  const outFile = path.join(env.dir, `loop-tokenizing-${round_}.jsonl`);
  const config = benchConfig(env, {
    run: `tokenize-${round_}`,
    endpoint: url,
    concurrency: c.concurrency,
    datasets: [{ name: 'fast', prompts: 'fast.jsonl', tokenBudget: 1, maxNewTokens: c.maxNewTokens }],
  });
  await simOccupancy(url, true);
  const cpu = cpuMeter(undefined);
  const t0 = performance.now();
  const tokenizer = await loadRunTokenizer(config);
  const prompts: LoopPrompt[] = readPromptsFile(env).map((r) => ({ id: `fast/${r.id}`, text: r.prompt }));
  const r = await runSemaphoreLoop({
    urls: [url],
    slots: c.concurrency,
    prompts,
    samplingParams: { max_new_tokens: c.maxNewTokens },
    outFile,
    encode: async (text) => {
      const [ids] = await tokenizer.encodePrompts([[{ role: 'user', content: text }]]);
      if (ids === undefined || ids instanceof Error) throw new Error(`could not tokenize a prompt: ${String(ids)}`);
      return ids;
    },
  });
  const wallS = (performance.now() - t0) / 1000;
  const disk = countLines([outFile]);
  if (disk.lines !== c.prompts || disk.tokens !== r.outputTokens)
    throw new Error(
      `the loop wrote ${disk.lines} records (${disk.tokens} tokens) to ${outFile}, expected ${c.prompts} (${r.outputTokens})`,
    );
  const simMeanRunning = await simOccupancy(url, false);
  return {
    client: 'loop-tokenizing',
    simMeanRunning,
    wallS,
    prompts: r.completed,
    outputTokens: r.outputTokens,
    promptsPerSec: r.completed / wallS,
    tokensPerSec: r.outputTokens / wallS,
    cpu: cpu.stop(),
  };
}

function readPromptsFile(env: BenchEnv): { id: string; prompt: string }[] {
  return readFileSync(path.join(env.dir, 'fast.jsonl'), 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as { id: string; prompt: string });
}

async function runTokenmill(env: BenchEnv, url: string, c: OverheadCase, round_: number): Promise<RoundResult> {
  const run = `overhead-${round_}`;
  const config = benchConfig(env, {
    run,
    endpoint: url,
    concurrency: c.concurrency,
    datasets: [{ name: 'fast', prompts: 'fast.jsonl', tokenBudget: 1_000_000_000_000, maxNewTokens: c.maxNewTokens }],
  });
  await simOccupancy(url, true);
  const cpu = cpuMeter(env.redis.server.pid);
  const t0 = performance.now();
  const t0Ms = Date.now();
  const gen = await startTokenmill(config);
  const startupS = (performance.now() - t0) / 1000;
  try {
    await gen.handle.finished;
    const wallS = (performance.now() - t0) / 1000;
    const endMs = Date.now();
    const stats = await gen.ctx.redis.hmget(
      gen.ctx.keys.stats('fast'),
      'records',
      'outputTokens',
      'firstCommitMs',
      'lastCommitMs',
    );
    const firstCommitMs = Number(stats[2]);
    const lastCommitMs = Number(stats[3]);
    const cores = cpu.stop();
    const simMeanRunning = await simOccupancy(url, false);
    const dir = path.join(config.output.dir, run, 'fast', 'generations');
    const disk = countLines(
      readdirSync(dir)
        .filter((n) => n.endsWith('.jsonl'))
        .map((n) => path.join(dir, n)),
    );
    if (disk.lines !== c.prompts)
      throw new Error(`tokenmill wrote ${disk.lines} records to ${dir}, expected ${c.prompts}`);
    const steadyS = (lastCommitMs - firstCommitMs) / 1000;
    return {
      client: 'tokenmill',
      simMeanRunning,
      wallS,
      prompts: disk.lines,
      outputTokens: disk.tokens,
      promptsPerSec: disk.lines / wallS,
      tokensPerSec: disk.tokens / wallS,
      ...(steadyS > 0 ? { steadyPromptsPerSec: disk.lines / steadyS } : {}),
      startupS,
      firstCommitS: (firstCommitMs - t0Ms) / 1000,
      tailS: (endMs - lastCommitMs) / 1000,
      cpu: cores,
    };
  } finally {
    await gen.stop();
  }
}

async function runCase(c: OverheadCase, rounds: number): Promise<CaseRun> {
  const env = await openBenchEnv('overhead');
  let sim: Awaited<ReturnType<typeof startSimChild>> | undefined;
  try {
    sim = await startSimChild(c);
    writePrompts(env.dir, 'fast', c.prompts);
    // The loop sends the very ids tokenmill sends: the same prompts through the run's tokenizer.
    const config = benchConfig(env, {
      run: 'tokenize',
      endpoint: sim.url,
      concurrency: c.concurrency,
      datasets: [{ name: 'fast', prompts: 'fast.jsonl', tokenBudget: 1, maxNewTokens: c.maxNewTokens }],
    });
    const tokenizer = await loadRunTokenizer(config);
    const records = readPromptsFile(env);
    const encoded = await tokenizer.encodePrompts(records.map((r) => [{ role: 'user' as const, content: r.prompt }]));
    const prompts: LoopPrompt[] = records.map((r, i) => {
      const ids = encoded[i];
      if (ids === undefined || ids instanceof Error)
        throw new Error(`could not tokenize prompt ${r.id}: ${String(ids)}`);
      return { id: `fast/${r.id}`, inputIds: ids };
    });

    const results: RoundResult[] = [];
    for (let k = 0; k < rounds; k += 1) {
      const url = sim.url;
      if (c.ratioAgainst === 'floor' || c.bothLoops === true)
        results.push(await profiled(`${c.label}-loop-${k}`, () => runLoop(env, url, c, prompts, k)));
      if (c.ratioAgainst === 'tokenizing' || c.bothLoops === true)
        results.push(await profiled(`${c.label}-loop-tokenizing-${k}`, () => runTokenizingLoop(env, url, c, k)));
      results.push(await profiled(`${c.label}-tokenmill-${k}`, () => runTokenmill(env, url, c, k)));
    }
    const rate = (r: RoundResult): number => (c.ratioOf === 'tokens' ? r.tokensPerSec : r.promptsPerSec);
    const pick = (client: Client): RoundResult | undefined => {
      const mine = results.filter((r) => r.client === client);
      return mine.length === 0 ? undefined : mine.reduce((a, b) => (rate(b) > rate(a) ? b : a));
    };
    const loopClient: Client = c.ratioAgainst === 'floor' ? 'loop' : 'loop-tokenizing';
    const loop = pick(loopClient)!;
    const tm = pick('tokenmill')!;
    const ratio = rate(tm) / rate(loop);
    const other = pick(loopClient === 'loop' ? 'loop-tokenizing' : 'loop');
    const otherRatio = other === undefined ? undefined : rate(tm) / rate(other);
    const metrics = {
      label: c.label,
      config: c,
      rounds: results.map((r) => ({
        ...r,
        wallS: round(r.wallS, 3),
        promptsPerSec: round(r.promptsPerSec, 1),
        tokensPerSec: round(r.tokensPerSec, 0),
        ...(r.steadyPromptsPerSec === undefined ? {} : { steadyPromptsPerSec: round(r.steadyPromptsPerSec, 1) }),
        ...(r.startupS === undefined ? {} : { startupS: round(r.startupS, 3) }),
        ...(r.firstCommitS === undefined ? {} : { firstCommitS: round(r.firstCommitS, 3) }),
        ...(r.tailS === undefined ? {} : { tailS: round(r.tailS, 3) }),
      })),
      ratioAgainst: loopClient,
      loopPromptsPerSec: round(loop.promptsPerSec, 1),
      tokenmillPromptsPerSec: round(tm.promptsPerSec, 1),
      loopTokensPerSec: round(loop.tokensPerSec, 0),
      tokenmillTokensPerSec: round(tm.tokensPerSec, 0),
      ratio: round(ratio, 3),
      ...(other === undefined || otherRatio === undefined
        ? {}
        : {
            otherLoop: other.client,
            otherLoopPromptsPerSec: round(other.promptsPerSec, 1),
            otherRatio: round(otherRatio, 3),
          }),
    };
    const what = c.ratioOf === 'tokens' ? 'output tokens/s' : 'prompts/s';
    const summary = [
      `${c.label}: ${c.prompts} prompts, ${c.concurrency} in flight, simulator in a child process (timeScale ${c.timeScale}, ${c.output.distribution} outputs of mean ${c.output.mean}); best of ${rounds} rounds each`,
      ...results.map(
        (r) =>
          `${c.label}: ${r.client.padEnd(15)} ${fmtInt(r.promptsPerSec)} prompts/s, ${fmtInt(r.tokensPerSec)} output tokens/s, ${r.wallS.toFixed(2)} s` +
          (r.client === 'tokenmill'
            ? ` (start-up ${r.startupS?.toFixed(2)} s, first commit at ${r.firstCommitS?.toFixed(2)} s, first to last commit ${fmtInt(r.steadyPromptsPerSec ?? 0)} prompts/s, last commit to finished ${r.tailS?.toFixed(2)} s)`
            : '') +
          // At a huge timeScale a request lasts no measurable time: the simulator's occupancy says nothing then.
          `${r.simMeanRunning >= 0.05 ? `; ${r.simMeanRunning.toFixed(1)} running in the simulator on average` : ''}; CPU node ${r.cpu.nodeCores} cores${r.cpu.redisCores === undefined ? '' : `, redis ${r.cpu.redisCores}`}`,
      ),
      `${c.label}: tokenmill / ${loopClient} ${what} = ${ratio.toFixed(2)}`,
      ...(other === undefined || otherRatio === undefined
        ? []
        : [`${c.label}: tokenmill / ${other.client} ${what} = ${otherRatio.toFixed(2)} (reported, not the goal)`]),
    ];
    const targets: BenchResult['targets'] = [];
    if (c.minPromptsPerSec !== undefined) {
      targets.push({
        what: `${c.label}: tokenmill prompts/s end to end`,
        required: `>= ${fmtInt(c.minPromptsPerSec)}`,
        measured: fmtInt(tm.promptsPerSec),
        met: tm.promptsPerSec >= c.minPromptsPerSec,
      });
    }
    if (c.minRatio !== undefined) {
      targets.push({
        what: `${c.label}: tokenmill / hand-written loop (${loopClient === 'loop' ? 'prompts tokenized beforehand' : 'tokenizing each prompt as it goes'}), ${what}`,
        required: `>= ${c.minRatio}`,
        measured: ratio.toFixed(2),
        met: ratio >= c.minRatio,
      });
    }
    return { metrics, summary, targets };
  } finally {
    await sim?.stop();
    await env.close();
  }
}

/** `BENCH_OVERHEAD_CASES=16-token` runs only the cases whose label contains one of the comma-separated words. */
function selectedCases(): RequestOverheadOptions {
  const words = (process.env['BENCH_OVERHEAD_CASES'] ?? '')
    .split(',')
    .map((w) => w.trim())
    .filter((w) => w !== '');
  if (words.length === 0) return DEFAULT_REQUEST_OVERHEAD;
  const cases = DEFAULT_REQUEST_OVERHEAD.cases.filter((c) => words.some((w) => c.label.includes(w)));
  if (cases.length === 0) {
    throw new Error(
      `BENCH_OVERHEAD_CASES=${words.join(',')} names no case; the cases are: ${DEFAULT_REQUEST_OVERHEAD.cases.map((c) => c.label).join('; ')}`,
    );
  }
  return { ...DEFAULT_REQUEST_OVERHEAD, cases };
}

if (isMain(import.meta.url)) runAsScript(() => requestOverhead(selectedCases()));
