// Shared harness of the generation benchmarks: a private redis-server, prompt files, a config,
// the generation stage started in this process, meters (event-loop delay, CPU) and the output
// format (one JSON line, then a readable summary).
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { startGeneration, type GenerationHandle } from '../src/cli/pipeline.js';
import { openRunContextFor, type RunContext } from '../src/cli/run-context.js';
import { createRootLogger, loadConfig, type Config, type ConfigInput } from '../src/shared/index.js';
import { startTestRedis, type TestRedis } from '../test/helpers/redis.js';

/** What every benchmark returns: a name, whether its targets were met, numbers, a summary. */
export interface BenchResult {
  name: string;
  /** True when every target the benchmark checks was met (see `targets`). */
  ok: boolean;
  /** Each target: what was required, what was measured, whether it was met. */
  targets: { what: string; required: string; measured: string; met: boolean }[];
  metrics: Record<string, unknown>;
  /** Human-readable lines, printed after the JSON line. */
  summary: string[];
  wallS: number;
}

/** One benchmark's private world: a temp folder and a redis-server of its own. */
export interface BenchEnv {
  dir: string;
  redis: TestRedis;
  close(): Promise<void>;
}

let loggerInstalled = false;

/** Quiet logs (errors only) unless BENCH_LOG_LEVEL says otherwise. */
export function installBenchLogger(): void {
  if (loggerInstalled) return;
  loggerInstalled = true;
  createRootLogger({ level: process.env['BENCH_LOG_LEVEL'] ?? 'error' });
}

export async function openBenchEnv(name: string): Promise<BenchEnv> {
  installBenchLogger();
  const dir = mkdtempSync(path.join(os.tmpdir(), `tm-bench-${name}-`));
  let redis: TestRedis;
  try {
    redis = await startTestRedis();
  } catch (e: unknown) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  return {
    dir,
    redis,
    async close() {
      await redis.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Writes `n` prompt records and returns the file and its size on disk. */
export function writePrompts(
  dir: string,
  name: string,
  n: number,
  make: (i: number) => object = defaultPrompt(name),
): { file: string; bytes: number } {
  const file = path.join(dir, `${name}.jsonl`);
  const lines: string[] = new Array<string>(n);
  for (let i = 0; i < n; i += 1) lines[i] = JSON.stringify(make(i));
  writeFileSync(file, `${lines.join('\n')}\n`);
  return { file, bytes: statSync(file).size };
}

function defaultPrompt(name: string): (i: number) => object {
  return (i) => ({
    id: `${name}-${i}`,
    prompt: `Question ${i}: explain, with an example, the idea numbered ${i * 13} in a few sentences.`,
  });
}

/** A prompt of about `chars` characters of plain English, different for every `i`. */
export function longPrompt(i: number, chars: number): string {
  const words = [
    'river',
    'market',
    'signal',
    'engine',
    'garden',
    'window',
    'memory',
    'stream',
    'bridge',
    'forest',
    'harbor',
    'letter',
    'circle',
    'season',
    'valley',
    'station',
  ];
  let s = `Task ${i}: write a careful answer about`;
  let x = (i * 2654435761) >>> 0;
  while (s.length < chars) {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x297a2d39) >>> 0;
    s += ` ${words[x % words.length] ?? 'word'}`;
  }
  return s;
}

export interface BenchConfigOptions {
  run: string;
  endpoint: string;
  /** Every SGLang endpoint, when there are several (`endpoint` is then ignored). */
  endpoints?: string[];
  concurrency: number;
  datasets: ConfigInput['datasets'];
  workers?: ConfigInput['workers'];
}

/** A config on the bench's Redis and folder; prompt paths are relative to `env.dir`. */
export function benchConfig(env: BenchEnv, o: BenchConfigOptions): Config {
  return loadConfig({
    baseDir: env.dir,
    object: {
      run: o.run,
      redis: { url: env.redis.url, prefix: env.redis.prefix },
      sglang: { endpoints: o.endpoints ?? [o.endpoint], concurrency: o.concurrency, requestTimeoutMs: 600_000 },
      datasets: o.datasets,
      output: { dir: 'out' },
      workers: { shutdownGraceMs: 1_000, ...o.workers },
    },
  });
}

/** The generation stage (producer, sinks, one inference worker) running in this process. */
export interface RunningGeneration {
  ctx: RunContext;
  handle: GenerationHandle;
  /** Stops the stage (requests in flight get the config's shutdown grace) and closes the context. */
  stop(): Promise<void>;
}

export async function startTokenmill(config: Config): Promise<RunningGeneration> {
  const ctx = await openRunContextFor(config);
  let handle: GenerationHandle;
  try {
    handle = await startGeneration(ctx, { produce: true, infer: true });
  } catch (e: unknown) {
    await ctx.close();
    throw e;
  }
  // `finished` may reject after a stop; nobody awaits it then.
  handle.finished.catch(() => undefined);
  let stopped = false;
  return {
    ctx,
    handle,
    async stop() {
      if (stopped) return;
      stopped = true;
      await handle.stop();
      await ctx.close();
    },
  };
}

/** Polls `cond` until it returns a truthy value or the deadline passes. */
export async function waitUntil<T>(
  cond: () => Promise<T> | T,
  what: string,
  timeoutMs: number,
  intervalMs = 20,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`benchmark timed out after ${timeoutMs} ms waiting for ${what}`);
    await delay(intervalMs);
  }
}

export function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Event-loop delay of this process over a stretch of the run (ms). */
export function eventLoopMeter(): { stop(): { meanMs: number; p99Ms: number; maxMs: number } } {
  const h = monitorEventLoopDelay({ resolution: 10 });
  h.enable();
  return {
    stop() {
      h.disable();
      return { meanMs: round(h.mean / 1e6, 2), p99Ms: round(h.percentile(99) / 1e6, 2), maxMs: round(h.max / 1e6, 2) };
    },
  };
}

/** CPU seconds of a process from /proc (Linux), or undefined where it cannot be read. */
export function procCpuSeconds(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime and stime are fields 14 and 15 of /proc/<pid>/stat (1-based), in clock ticks.
    const ticks = Number(fields[11]) + Number(fields[12]);
    return ticks / 100;
  } catch {
    return undefined;
  }
}

/** CPU used by this process and by the benchmark's redis-server, as cores busy on average. */
export function cpuMeter(redisPid: number | undefined): {
  stop(): { nodeCores: number; redisCores: number | undefined };
} {
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  const r0 = redisPid === undefined ? undefined : procCpuSeconds(redisPid);
  return {
    stop() {
      const wallS = (performance.now() - t0) / 1000;
      const c = process.cpuUsage(c0);
      const r1 = redisPid === undefined ? undefined : procCpuSeconds(redisPid);
      return {
        nodeCores: round((c.user + c.system) / 1e6 / wallS, 2),
        redisCores: r0 === undefined || r1 === undefined ? undefined : round((r1 - r0) / wallS, 2),
      };
    },
  };
}

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

export function fmtInt(x: number): string {
  return Math.round(x).toLocaleString('en-US');
}

export function fmtBytes(x: number): string {
  if (Math.abs(x) >= 1024 * 1024) return `${(x / 1024 / 1024).toFixed(2)} MiB`;
  if (Math.abs(x) >= 1024) return `${(x / 1024).toFixed(1)} KiB`;
  return `${Math.round(x)} B`;
}

/** Prints the result: one JSON line (`BENCH_RESULT {...}`), then the summary. */
export function printResult(r: BenchResult): void {
  process.stdout.write(`BENCH_RESULT ${JSON.stringify(r)}\n`);
  process.stdout.write(`\n== ${r.name}: ${r.ok ? 'targets met' : 'TARGET NOT MET'} (${r.wallS.toFixed(1)} s)\n`);
  for (const line of r.summary) process.stdout.write(`  ${line}\n`);
  for (const t of r.targets)
    process.stdout.write(`  [${t.met ? 'ok' : 'MISS'}] ${t.what}: required ${t.required}, measured ${t.measured}\n`);
  process.stdout.write('\n');
}

/** True when the module at `url` is the script node was started with. */
export function isMain(url: string): boolean {
  const entry = process.argv[1];
  return entry !== undefined && pathToFileURL(path.resolve(entry)).href === url;
}

/** Runs one benchmark as a script: prints its result, exits 0 (targets met) or 1. */
export function runAsScript(bench: () => Promise<BenchResult>): void {
  bench().then(
    (r) => {
      printResult(r);
      process.exit(r.ok ? 0 : 1);
    },
    (e: unknown) => {
      process.stderr.write(`benchmark failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
      process.exit(2);
    },
  );
}

/** The part of a simulator {@link busyMeter} reads. */
export interface MeteredServer {
  stats(): {
    requestsReceived: number;
    requests: unknown[];
    running: number;
    queued: number;
    outputTokensTotal: number;
    occupancy: { meanRunning: number; windowMs: number };
  };
  resetStats(): void;
}

/** What a set of simulators did from the first request received to the last one finished. */
export interface BusySpan {
  /** Wall ms from the first request received to the last poll that saw one running or queued. */
  spanMs: number;
  /** Running requests summed over the servers, time-weighted over the span. */
  meanRunning: number;
  requests: number;
  outputTokens: number;
}

/**
 * Polls simulators every `intervalMs` (wall): the busy span starts at the first request any of
 * them receives and ends at the last poll that finds a request running or queued. Each poll
 * reads and resets a server's stats in one synchronous step and adds them up here, so that no
 * request log grows and a poll stays cheap over tens of thousands of requests.
 */
export function busyMeter(servers: readonly MeteredServer[], intervalMs = 20): { stop(): BusySpan } {
  let t0: number | undefined;
  let lastBusy = 0;
  let requests = 0;
  let outputTokens = 0;
  let runningIntegral = 0;
  const poll = (): void => {
    const now = performance.now();
    if (t0 === undefined && servers.every((s) => s.stats().requestsReceived === 0)) return;
    const first = t0 === undefined;
    t0 ??= now;
    let busy = false;
    for (const s of servers) {
      const st = s.stats();
      requests += st.requestsReceived;
      outputTokens += st.outputTokensTotal;
      // Before the first request the occupancy window holds only idle time.
      if (!first) runningIntegral += st.occupancy.meanRunning * st.occupancy.windowMs;
      if (st.running + st.queued > 0) busy = true;
      s.resetStats();
    }
    if (busy || first) lastBusy = now;
  };
  const timer = setInterval(poll, intervalMs);
  return {
    stop() {
      clearInterval(timer);
      poll();
      if (t0 === undefined) return { spanMs: 0, meanRunning: 0, requests: 0, outputTokens: 0 };
      const spanMs = lastBusy - t0;
      return { spanMs, meanRunning: spanMs > 0 ? runningIntegral / spanMs : 0, requests, outputTokens };
    },
  };
}
