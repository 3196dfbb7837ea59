// Benchmark: the producer's memory on a big file of whole conversations (`datasets[].turns: all`,
// docs/design.md, invariant 5, for its heap). The real generation stage with `produce` only
// (producer + results sinks, no inference worker: `startGeneration(ctx, { produce: true,
// infer: false })`) runs in a child process whose old space is capped, against a real
// redis-server, with the bundled tokenizer (the default config's), on 1M conversations of 3–5
// user turns with their source answers (a system message on every 4th). The producer indexes the
// file, renders and tokenizes turn 1 of each conversation and enqueues batches carrying each
// conversation's messages, never more than its window at once. No worker answers, so this
// process drains the queue instead: a BullMQ worker on the dataset's queue takes each batch and
// records each of its conversations as finished exactly as finish-conversation-4.lua does (HSETNX
// in the conversations hash, HINCRBY conversationsComplete), and the job completes, which moves
// the window. The same is measured on 100k conversations (memory must not grow with the file)
// and on 1M single-turn prompts (`{"id","prompt"}`) with the same line lengths, drained as
// commit-sample-9.lua records a commit (SADD done, HINCRBY records).
// Measured in the child: peak RSS, peak V8 heap used, wall from start to `finished`, CPU.
//   npx tsx bench/producer-memory-conversations.ts [conversations]     as a script (default 1,000,000)
//   BENCH_PRODUCER_CONVERSATIONS=200000 npm run bench -- producer-memory-conversations
import { spawn } from 'node:child_process';
import { closeSync, openSync, writeSync } from 'node:fs';
import path from 'node:path';
import { Worker, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { startGeneration } from '../src/cli/pipeline.js';
import { openRunContextFor } from '../src/cli/run-context.js';
import {
  RunKeys,
  generateQueueName,
  loadConfig,
  type ChatMessage,
  type GenerateBatchPayload,
} from '../src/shared/index.js';
import { repoRoot } from '../test/helpers/pipeline.js';
import {
  fmtBytes,
  fmtInt,
  installBenchLogger,
  isMain,
  longPrompt,
  openBenchEnv,
  round,
  runAsScript,
  type BenchResult,
} from './lib.js';

export interface ProducerMemoryConversationsOptions {
  /** Conversations of the big file (and single-turn prompts of the comparison). */
  conversations: number;
  /** Conversations of the small file: memory on the big one over this one should be ≈ 1. */
  smallConversations: number;
  /** `--max-old-space-size` of the child (MiB). */
  heapLimitMiB: number;
  /** The largest acceptable peak RSS of the child (MiB). */
  maxRssMiB: number;
  /** Largest acceptable ratio of peak memory (RSS, heap) on the big file to the small one. */
  maxGrowth: number;
  batchSize: number;
  /** `sglang.concurrency` of the config: with `batchSize`, it sets the producer's window. */
  concurrency: number;
  /** Batches the drain takes at once. */
  drainConcurrency: number;
}

export const DEFAULT_PRODUCER_MEMORY_CONVERSATIONS: ProducerMemoryConversationsOptions = {
  conversations: 1_000_000,
  smallConversations: 100_000,
  heapLimitMiB: 256,
  maxRssMiB: 600,
  maxGrowth: 1.25,
  batchSize: 64,
  concurrency: 64,
  drainConcurrency: 4,
};

/** The user turns of conversation `i` (3–5). */
export function userTurnsOf(i: number): number {
  return 3 + (mix(i) % 3);
}

/** Conversation `i`: a system message on every 4th, 3–5 user turns of 30–200 characters, each answered in 40–300. */
export function conversationOf(i: number): ChatMessage[] {
  const out: ChatMessage[] = [];
  if (i % 4 === 0) out.push({ role: 'system', content: `You are assistant ${i % 97}: answer briefly and exactly.` });
  const turns = userTurnsOf(i);
  for (let t = 0; t < turns; t += 1) {
    const h = mix(i * 8 + t);
    out.push({ role: 'user', content: longPrompt(i * 8 + t, 30 + (h % 171)) });
    out.push({ role: 'assistant', content: longPrompt(i * 8 + t + 4, 40 + ((h >>> 9) % 261)) });
  }
  return out;
}

function mix(x: number): number {
  let h = (x * 2654435761) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x45d9f3b) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * Writes `n` lines in 8 MiB chunks: conversations (`{"id":"c<i>","messages":[…]}`), or
 * single-turn prompts (`{"id":"p<i>","prompt":"…"}`) each as long as conversation i's line.
 * Returns the file's size.
 */
export function writeBenchFile(target: string, n: number, kind: 'conversations' | 'prompts'): number {
  const fd = openSync(target, 'w');
  let bytes = 0;
  try {
    let buf: string[] = [];
    let size = 0;
    const flush = (): void => {
      const text = `${buf.join('\n')}\n`;
      writeSync(fd, text);
      bytes += Buffer.byteLength(text);
      buf = [];
      size = 0;
    };
    for (let i = 0; i < n; i += 1) {
      const conv = JSON.stringify({ id: `c${i}`, messages: conversationOf(i) });
      let text = conv;
      if (kind === 'prompts') {
        const head = `{"id":"p${i}","prompt":""}`;
        text = JSON.stringify({ id: `p${i}`, prompt: longPrompt(i, Math.max(1, conv.length - head.length)) });
      }
      buf.push(text);
      size += text.length + 1;
      if (size >= 8 << 20) flush();
    }
    if (buf.length > 0) flush();
  } finally {
    closeSync(fd);
  }
  return bytes;
}

/** What the child is told (argv[3], JSON). */
interface ChildInput {
  dir: string;
  redisUrl: string;
  prefix: string;
  run: string;
  file: string;
  turns: 'all' | 'last';
  batchSize: number;
  concurrency: number;
}

/** What the child prints after `CHILD_RESULT `. */
interface ChildReport {
  wallMs: number;
  cpuMs: number;
  heapUsedMaxBytes: number;
  rssMaxBytes: number;
  arrayBuffersMaxBytes: number;
  status: string | null;
  epoch: string | null;
}

const DATASET = 'd';

function childConfig(c: ChildInput): ReturnType<typeof loadConfig> {
  return loadConfig({
    baseDir: c.dir,
    object: {
      run: c.run,
      redis: { url: c.redisUrl, prefix: c.prefix },
      // Nothing listens there: no worker runs, and the producer never calls a server
      // (the context length is given; the tokenizer check skips an endpoint that does not answer).
      sglang: { endpoints: ['http://127.0.0.1:9'], concurrency: c.concurrency, contextLength: 32_768 },
      datasets: [
        {
          name: DATASET,
          prompts: path.basename(c.file),
          tokenBudget: 1_000_000_000_000,
          maxNewTokens: 512,
          batchSize: c.batchSize,
          ...(c.turns === 'all' ? { turns: 'all' as const } : {}),
        },
      ],
      output: { dir: 'out' },
      workers: { shutdownGraceMs: 1_000 },
    },
  });
}

/** The child: the generation stage with `produce` only, until every dataset is completed. */
async function childMain(input: ChildInput): Promise<void> {
  installBenchLogger();
  let heapUsedMax = 0;
  let rssMax = 0;
  let arrayBuffersMax = 0;
  const sample = (): void => {
    const m = process.memoryUsage();
    heapUsedMax = Math.max(heapUsedMax, m.heapUsed);
    rssMax = Math.max(rssMax, m.rss);
    arrayBuffersMax = Math.max(arrayBuffersMax, m.arrayBuffers);
  };
  const sampler = setInterval(sample, 20);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const config = childConfig(input);
  const ctx = await openRunContextFor(config);
  const handle = await startGeneration(ctx, { produce: true, infer: false });
  await handle.finished;
  const wallMs = performance.now() - t0;
  sample();
  clearInterval(sampler);
  const cpu = process.cpuUsage(cpu0);
  const keys = new RunKeys(input.prefix, input.run);
  const status = await ctx.redis.hget(keys.stats(DATASET), 'status');
  const epoch = await ctx.redis.hget(keys.producer(DATASET), 'epoch');
  await handle.stop();
  await ctx.close();
  const report: ChildReport = {
    wallMs: Math.round(wallMs),
    cpuMs: Math.round((cpu.user + cpu.system) / 1000),
    heapUsedMaxBytes: heapUsedMax,
    // ru_maxrss is in KiB on Linux: the peak, between samples too.
    rssMaxBytes: Math.max(rssMax, process.resourceUsage().maxRSS * 1024),
    arrayBuffersMaxBytes: arrayBuffersMax,
    status,
    epoch,
  };
  process.stdout.write(`CHILD_RESULT ${JSON.stringify(report)}\n`);
}

interface CaseResult {
  label: string;
  kind: 'conversations' | 'prompts';
  n: number;
  fileBytes: number;
  code: number | null;
  child: ChildReport | undefined;
  stderrTail: string;
  /** Distinct samples the drain recorded (first HSETNX / SADD), and repeats. */
  drained: number;
  repeats: number;
  /** Batches whose payload was not what `turns` promises (conversations missing, a wrong turn count). */
  badBatches: number;
  /** Wall ms from the child's spawn to the drain recording the last sample (the first pass). */
  drainedMs: number | undefined;
  /** Entries in the conversations hash (turns: all) or the done set, read after the child. */
  recorded: number;
}

/** One file, one fresh redis-server: the child producing, this process draining. */
async function runCase(
  o: ProducerMemoryConversationsOptions,
  label: string,
  kind: 'conversations' | 'prompts',
  n: number,
): Promise<CaseResult> {
  const env = await openBenchEnv('producer-memory-conversations');
  const drainConn = new Redis(env.redis.url, { maxRetriesPerRequest: null });
  let worker: Worker | undefined;
  try {
    const file = path.join(env.dir, `${kind}.jsonl`);
    const fileBytes = writeBenchFile(file, n, kind);
    const run = `pmc-${label}`;
    const keys = new RunKeys(env.redis.prefix, run);
    const turns = kind === 'conversations' ? 'all' : 'last';
    let drained = 0;
    let repeats = 0;
    let badBatches = 0;
    let drainedMs: number | undefined;
    const t0 = performance.now();
    worker = new Worker(
      generateQueueName(DATASET),
      async (job: Job) => {
        const p = job.data as GenerateBatchPayload;
        const ids = p.samples.map((s) => s.id);
        if (turns === 'all') {
          const convs = p.conversations;
          const right =
            p.turns === 'all' &&
            convs?.length === ids.length &&
            ids.every((id, i) => {
              const msgs = (convs[i] ?? []) as ChatMessage[];
              return msgs.filter((m) => m.role === 'user').length === userTurnsOf(Number(id.slice(1)));
            });
          if (!right) badBatches += 1;
          // finish-conversation-4.lua's effect for a complete conversation (its history key is absent here).
          const m = drainConn.multi();
          for (const id of ids) m.hsetnx(keys.conversations(DATASET), id, JSON.stringify({ kind: 'complete' }));
          m.hincrby(keys.stats(DATASET), 'conversationsComplete', ids.length);
          const res = (await m.exec()) ?? [];
          const firsts = res.slice(0, ids.length).filter(([, v]) => v === 1).length;
          drained += firsts;
          repeats += ids.length - firsts;
        } else {
          if (p.conversations !== undefined) badBatches += 1;
          // commit-sample-9.lua's bookkeeping of a first commit: the done set and the records count.
          const added = await drainConn.sadd(keys.done(DATASET), ...ids);
          await drainConn.hincrby(keys.stats(DATASET), 'records', added);
          drained += added;
          repeats += ids.length - added;
        }
        if (drained >= n && drainedMs === undefined) drainedMs = performance.now() - t0;
      },
      { connection: drainConn, prefix: keys.bullPrefix, concurrency: o.drainConcurrency },
    );
    worker.on('error', () => undefined);
    const input: ChildInput = {
      dir: env.dir,
      redisUrl: env.redis.url,
      prefix: env.redis.prefix,
      run,
      file,
      turns,
      batchSize: o.batchSize,
      concurrency: o.concurrency,
    };
    const { code, stdout, stderr } = await runChild(input, o.heapLimitMiB);
    const line = stdout.split('\n').find((l) => l.startsWith('CHILD_RESULT '));
    const child = line === undefined ? undefined : (JSON.parse(line.slice('CHILD_RESULT '.length)) as ChildReport);
    const recorded =
      turns === 'all' ? await drainConn.hlen(keys.conversations(DATASET)) : await drainConn.scard(keys.done(DATASET));
    return {
      label,
      kind,
      n,
      fileBytes,
      code,
      child,
      stderrTail: stderr.slice(-4_000),
      drained,
      repeats,
      badBatches,
      drainedMs,
      recorded,
    };
  } finally {
    await worker?.close();
    drainConn.disconnect();
    await env.close();
  }
}

function runChild(
  input: ChildInput,
  heapLimitMiB: number,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [
        `--max-old-space-size=${heapLimitMiB}`,
        '--import',
        'tsx',
        path.join(repoRoot, 'bench/producer-memory-conversations.ts'),
        '--child',
        JSON.stringify(input),
      ],
      { cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

/** The conversation count: the script's argument, else BENCH_PRODUCER_CONVERSATIONS, else the default. */
function conversationsFromCommandLine(): number | undefined {
  const raw = (isMain(import.meta.url) ? process.argv[2] : undefined) ?? process.env['BENCH_PRODUCER_CONVERSATIONS'];
  if (raw === undefined) return undefined;
  const n = Number(raw.replace(/[_,]/g, ''));
  if (!Number.isInteger(n) || n < 1_000)
    throw new Error(
      `producer-memory-conversations: the conversation count must be an integer of at least 1,000, got ${JSON.stringify(raw)}`,
    );
  return n;
}

export async function producerMemoryConversations(
  options: Partial<ProducerMemoryConversationsOptions> = {},
): Promise<BenchResult> {
  const fromCli = conversationsFromCommandLine();
  const o: ProducerMemoryConversationsOptions = {
    ...DEFAULT_PRODUCER_MEMORY_CONVERSATIONS,
    ...(fromCli === undefined ? {} : { conversations: fromCli, smallConversations: Math.max(1_000, fromCli / 10) }),
    ...options,
  };
  const started = performance.now();
  const cases = [
    await runCase(o, 'conversations-small', 'conversations', o.smallConversations),
    await runCase(o, 'conversations', 'conversations', o.conversations),
    await runCase(o, 'prompts', 'prompts', o.conversations),
  ];
  const [small, big, single] = cases as [CaseResult, CaseResult, CaseResult];
  const failed = cases.find((c) => c.code !== 0 || c.child === undefined);
  if (failed !== undefined)
    throw new Error(
      `the producer child of ${failed.label} exited ${failed.code} under a ${o.heapLimitMiB} MiB old space:\n${failed.stderrTail}`,
    );
  const rep = (c: CaseResult): ChildReport => c.child as ChildReport;
  const perS = (c: CaseResult): number => c.n / (rep(c).wallMs / 1000);
  const ratio = (a: number, b: number): number => round(a / b, 3);
  const rssGrowth = ratio(rep(big).rssMaxBytes, rep(small).rssMaxBytes);
  const heapGrowth = ratio(rep(big).heapUsedMaxBytes, rep(small).heapUsedMaxBytes);
  const maxRssBytes = o.maxRssMiB * 2 ** 20;
  const heapLimitBytes = o.heapLimitMiB * 2 ** 20;
  const targets: BenchResult['targets'] = cases.map((c) => ({
    what: `${c.label}: every ${c.kind === 'conversations' ? 'conversation' : 'prompt'} enqueued once, the dataset completed (exhausted)`,
    required: `${fmtInt(c.n)} recorded, 0 repeats, 0 wrong batches, status completed`,
    measured: `${fmtInt(c.recorded)} recorded, ${c.repeats} repeats, ${c.badBatches} wrong batches, status ${rep(c).status ?? 'none'}`,
    met:
      c.recorded === c.n && c.drained === c.n && c.repeats === 0 && c.badBatches === 0 && rep(c).status === 'completed',
  }));
  targets.push(
    {
      what: `peak RSS, ${fmtInt(o.conversations)} conversations / ${fmtInt(o.smallConversations)}`,
      required: `≤ ${o.maxGrowth}`,
      measured: String(rssGrowth),
      met: rssGrowth <= o.maxGrowth,
    },
    {
      what: `peak V8 heap used, ${fmtInt(o.conversations)} conversations / ${fmtInt(o.smallConversations)}`,
      required: `≤ ${o.maxGrowth}`,
      measured: String(heapGrowth),
      met: heapGrowth <= o.maxGrowth,
    },
    {
      what: `peak RSS of the producer child on ${fmtInt(o.conversations)} conversations`,
      required: `< ${fmtBytes(maxRssBytes)}`,
      measured: fmtBytes(rep(big).rssMaxBytes),
      met: rep(big).rssMaxBytes < maxRssBytes,
    },
    // heapUsed counts the young generation too (beyond the old-space limit).
    {
      what: `peak V8 heap used of the producer child on ${fmtInt(o.conversations)} conversations`,
      required: `< ${fmtBytes(heapLimitBytes + 64 * 2 ** 20)}`,
      measured: fmtBytes(rep(big).heapUsedMaxBytes),
      met: rep(big).heapUsedMaxBytes < heapLimitBytes + 64 * 2 ** 20,
    },
  );
  const line = (c: CaseResult): string => {
    const r = rep(c);
    return (
      `${c.label}: ${fmtInt(c.n)} lines, ${fmtBytes(c.fileBytes)}; wall ${(r.wallMs / 1000).toFixed(1)} s ` +
      `(${fmtInt(perS(c))}/s; drained after ${((c.drainedMs ?? NaN) / 1000).toFixed(1)} s, passes ${Number(r.epoch ?? 0) + 1}), CPU ${(r.cpuMs / 1000).toFixed(1)} s; ` +
      `peak RSS ${fmtBytes(r.rssMaxBytes)}, peak heap used ${fmtBytes(r.heapUsedMaxBytes)}, peak off-heap buffers ${fmtBytes(r.arrayBuffersMaxBytes)}`
    );
  };
  const summary = [
    `the generation stage with produce only (no worker) in a child under --max-old-space-size=${o.heapLimitMiB}, bundled tokenizer, batchSize ${o.batchSize}, concurrency ${o.concurrency}; this process drains the queue`,
    ...cases.map(line),
    `${fmtInt(o.conversations)} conversations / ${fmtInt(o.smallConversations)}: RSS ${rssGrowth}×, heap ${heapGrowth}×`,
    `${fmtInt(o.conversations)} conversations / as many single-turn prompts: RSS ${ratio(rep(big).rssMaxBytes, rep(single).rssMaxBytes)}×, heap ${ratio(rep(big).heapUsedMaxBytes, rep(single).heapUsedMaxBytes)}×, wall ${ratio(rep(big).wallMs, rep(single).wallMs)}×`,
  ];
  const metricsOf = (c: CaseResult): Record<string, unknown> => ({
    n: c.n,
    fileBytes: c.fileBytes,
    wallS: round(rep(c).wallMs / 1000, 2),
    drainedS: c.drainedMs === undefined ? null : round(c.drainedMs / 1000, 2),
    perS: Math.round(perS(c)),
    cpuS: round(rep(c).cpuMs / 1000, 2),
    passes: Number(rep(c).epoch ?? 0) + 1,
    rssMaxBytes: rep(c).rssMaxBytes,
    heapUsedMaxBytes: rep(c).heapUsedMaxBytes,
    arrayBuffersMaxBytes: rep(c).arrayBuffersMaxBytes,
    recorded: c.recorded,
    repeats: c.repeats,
    badBatches: c.badBatches,
    status: rep(c).status,
  });
  return {
    name: 'producer-memory-conversations',
    ok: targets.every((t) => t.met),
    targets,
    metrics: {
      config: o,
      conversationsSmall: metricsOf(small),
      conversations: metricsOf(big),
      prompts: metricsOf(single),
      ratios: {
        rssBigOverSmall: rssGrowth,
        heapBigOverSmall: heapGrowth,
        rssConversationsOverPrompts: ratio(rep(big).rssMaxBytes, rep(single).rssMaxBytes),
        heapConversationsOverPrompts: ratio(rep(big).heapUsedMaxBytes, rep(single).heapUsedMaxBytes),
        wallConversationsOverPrompts: ratio(rep(big).wallMs, rep(single).wallMs),
      },
    },
    summary,
    wallS: (performance.now() - started) / 1000,
  };
}

if (isMain(import.meta.url)) {
  if (process.argv[2] === '--child') {
    childMain(JSON.parse(process.argv[3] ?? '{}') as ChildInput).then(
      () => process.exit(0),
      (e: unknown) => {
        process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
        process.exit(1);
      },
    );
  } else {
    runAsScript(() => producerMemoryConversations());
  }
}
