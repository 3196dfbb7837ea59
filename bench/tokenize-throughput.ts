// Benchmark 7: tokenizing a conversation dataset, tokenmill against Python transformers.
// One corpus (seeded, varied multi-turn conversations from test/fixtures/conversations: system
// prompts, reasoning, tool calls and results, ShareGPT lines, long conversations), the bundled
// Qwen3 tokenizer, three runs:
// - tokenmill on one thread (`rowsFromConversations`: parse, chat template, one encode, the loss
//   mask), in a child process pinned to one core (taskset, where there is one);
// - Python `transformers` (bench/tokenize_throughput.py: json.loads, apply_chat_template, one
//   encode with offsets, the mask), in a child process pinned to the same core, its Rust
//   tokenizer held to one thread;
// - tokenmill on every core (`rowsFromConversationsPooled`, one thread per core), thread start
//   included.
// The one-core runs alternate (tokenmill, Python, Python, tokenmill, …), each child tokenizing
// the file `passes` times after one warm-up pass; the best pass of each side is compared (other
// work on the machine only ever slows a pass down). Tokens/s count the tokens of the rows kept.
//   npx tsx bench/tokenize-throughput.ts [conversations]     as a script (default 5,000)
//   npm run bench -- tokenize-throughput
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { bundledTokenizerPath, loadTokenizer } from '../src/shared/index.js';
import {
  createTokenizeContext,
  emptyConversationStats,
  rowsFromConversations,
} from '../src/workers/postprocess/tokenize.js';
import { rowsFromConversationsPooled } from '../src/workers/postprocess/tokenize-pool.js';
import { conversationCorpus } from '../test/fixtures/conversations/corpus.js';
import { PYTHON_ENV, ensurePythonEnv, runProcess } from '../test/helpers/python.js';
import { fmtBytes, fmtInt, installBenchLogger, isMain, round, runAsScript, type BenchResult } from './lib.js';

export interface TokenizeThroughputOptions {
  conversations: number;
  /** One-core child runs per side (alternating). */
  rounds: number;
  /** Timed passes over the file per child, after one warm-up pass. */
  passes: number;
  /** Threads of the all-cores run. */
  threads: number;
  /** tokenmill on one thread must reach at least this share of Python's tokens/s. */
  minRatio: number;
}

export const DEFAULT_TOKENIZE_THROUGHPUT: TokenizeThroughputOptions = {
  conversations: 5_000,
  rounds: 2,
  passes: 2,
  threads: os.availableParallelism(),
  minRatio: 1.0,
};

/** One pass over the file, as a child reports it. */
interface PassReport {
  pass: number;
  seconds: number;
  rows: number;
  tokens: number;
  supervised: number;
  /** All-cores run: seconds until the threads were ready. */
  startSeconds?: number;
  threads?: number;
}

const SELF = fileURLToPath(import.meta.url);
const PYTHON_SCRIPT = path.join(path.dirname(SELF), 'tokenize_throughput.py');

/** Writes the corpus: every line a conversation with its own id. */
function writeCorpus(file: string, n: number): number {
  const lines = conversationCorpus(n, 20_261_130).map((c, i) => JSON.stringify({ ...c.record, id: `c${i}` }));
  const text = `${lines.join('\n')}\n`;
  writeFileSync(file, text);
  return Buffer.byteLength(text);
}

/** The tokenmill child: `single <file> <passes>` or `threads <file> <threads>`. */
async function childMain(mode: string, file: string, count: number): Promise<void> {
  installBenchLogger();
  const ctx = createTokenizeContext(await loadTokenizer(bundledTokenizerPath()));
  const report = (r: PassReport): void => void process.stdout.write(`${JSON.stringify(r)}\n`);
  if (mode === 'single') {
    for (let pass = 0; pass <= count; pass++) {
      const stats = emptyConversationStats();
      const t0 = performance.now();
      for await (const row of rowsFromConversations(file, { ctx, dataset: 'bench', stats })) void row;
      report({
        pass,
        seconds: (performance.now() - t0) / 1000,
        rows: stats.kept,
        tokens: stats.tokens,
        supervised: stats.supervisedTokens,
      });
    }
    return;
  }
  const stats = emptyConversationStats();
  const t0 = performance.now();
  let ready = 0;
  let threads = 0;
  const rows = rowsFromConversationsPooled(file, {
    ctx,
    dataset: 'bench',
    stats,
    threads: count,
    minPoolBytes: 0,
    onPoolStarted: (pool) => {
      ready = performance.now();
      threads = pool.size;
    },
  });
  for await (const row of rows) void row;
  const end = performance.now();
  report({
    pass: 0,
    seconds: (end - t0) / 1000,
    startSeconds: (ready - t0) / 1000,
    threads,
    rows: stats.kept,
    tokens: stats.tokens,
    supervised: stats.supervisedTokens,
  });
}

function parseReports(stdout: string): PassReport[] {
  return stdout
    .split('\n')
    .filter((l) => l.trim().startsWith('{'))
    .map((l) => JSON.parse(l) as PassReport);
}

/** `command args` pinned to one core with taskset when the machine has it. */
function pinned(command: string, args: string[]): [string, string[]] {
  return existsSync('/usr/bin/taskset') ? ['/usr/bin/taskset', ['-c', '0', command, ...args]] : [command, args];
}

async function runChild(command: string, args: string[], env: NodeJS.ProcessEnv, what: string): Promise<PassReport[]> {
  const r = await runProcess(command, args, { timeoutMs: 30 * 60_000, env });
  if (r.code !== 0) throw new Error(`${what} exited ${String(r.code)}:\n${r.stderr.slice(-4_000)}`);
  return parseReports(r.stdout);
}

const perSecond = (r: PassReport): number => r.tokens / r.seconds;
const best = (rs: readonly PassReport[]): PassReport => rs.reduce((a, b) => (perSecond(b) > perSecond(a) ? b : a));
const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0
    ? NaN
    : s.length % 2 === 1
      ? (s[(s.length - 1) / 2] ?? NaN)
      : ((s[s.length / 2 - 1] ?? 0) + (s[s.length / 2] ?? 0)) / 2;
};

/** The conversation count: the script's argument, else BENCH_TOKENIZE_CONVERSATIONS. */
function conversationsFromCommandLine(): number | undefined {
  const raw =
    (isMain(import.meta.url) && process.argv[2] !== 'child' ? process.argv[2] : undefined) ??
    process.env['BENCH_TOKENIZE_CONVERSATIONS'];
  if (raw === undefined) return undefined;
  const n = Number(raw.replace(/[_,]/g, ''));
  if (!Number.isInteger(n) || n < 100)
    throw new Error(
      `tokenize-throughput: the conversation count must be an integer of at least 100, got ${JSON.stringify(raw)}`,
    );
  return n;
}

export async function tokenizeThroughput(options: Partial<TokenizeThroughputOptions> = {}): Promise<BenchResult> {
  const fromCli = conversationsFromCommandLine();
  const o: TokenizeThroughputOptions = {
    ...DEFAULT_TOKENIZE_THROUGHPUT,
    ...(fromCli === undefined ? {} : { conversations: fromCli }),
    ...options,
  };
  const started = performance.now();
  const loadBefore = os.loadavg().map((x) => round(x, 2));
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tm-bench-tokenize-'));
  try {
    const file = path.join(dir, 'conversations.jsonl');
    const bytes = writeCorpus(file, o.conversations);
    const python = await ensurePythonEnv('main');
    const oneThreadEnv = {
      ...PYTHON_ENV,
      RAYON_NUM_THREADS: '1',
      TOKENIZERS_PARALLELISM: 'false',
      OMP_NUM_THREADS: '1',
    };
    const ts: PassReport[] = [];
    const py: PassReport[] = [];
    const runTs = async (): Promise<void> => {
      const [cmd, args] = pinned(process.execPath, [
        '--import',
        'tsx',
        SELF,
        'child',
        'single',
        file,
        String(o.passes),
      ]);
      ts.push(...(await runChild(cmd, args, process.env, 'the tokenmill child')).filter((r) => r.pass > 0));
    };
    const runPy = async (): Promise<void> => {
      const [cmd, args] = pinned(python, [PYTHON_SCRIPT, bundledTokenizerPath(), file, String(o.passes + 1)]);
      py.push(...(await runChild(cmd, args, oneThreadEnv, 'the Python child')).filter((r) => r.pass > 0));
    };
    for (let round = 0; round < o.rounds; round++) {
      if (round % 2 === 0) {
        await runTs();
        await runPy();
      } else {
        await runPy();
        await runTs();
      }
    }
    const [all] = await runChild(
      process.execPath,
      ['--import', 'tsx', SELF, 'child', 'threads', file, String(o.threads)],
      process.env,
      'the all-cores child',
    );
    if (all === undefined) throw new Error('the all-cores child reported nothing');

    const tsBest = best(ts);
    const pyBest = best(py);
    const ratio = perSecond(tsBest) / perSecond(pyBest);
    const medianRatio = median(ts.map(perSecond)) / median(py.map(perSecond));
    const threadsRatio = perSecond(all) / perSecond(tsBest);
    const kps = (x: number): string => `${fmtInt(x / 1000)}K tokens/s`;
    const result: BenchResult = {
      name: 'tokenize-throughput',
      ok: ratio >= o.minRatio,
      targets: [
        {
          what: 'tokenmill on one thread vs Python transformers on one core (best pass each)',
          required: `≥ ${o.minRatio.toFixed(2)}×`,
          measured: `${ratio.toFixed(2)}× (${kps(perSecond(tsBest))} vs ${kps(perSecond(pyBest))})`,
          met: ratio >= o.minRatio,
        },
      ],
      metrics: {
        conversations: o.conversations,
        fileBytes: bytes,
        cores: os.availableParallelism(),
        pinnedToOneCore: existsSync('/usr/bin/taskset'),
        rows: { tokenmill: tsBest.rows, python: pyBest.rows },
        tokens: { tokenmill: tsBest.tokens, python: pyBest.tokens },
        supervisedTokens: { tokenmill: tsBest.supervised, python: pyBest.supervised },
        oneThreadTokensPerS: {
          tokenmill: ts.map((r) => round(perSecond(r), 0)),
          python: py.map((r) => round(perSecond(r), 0)),
        },
        bestTokensPerS: { tokenmill: round(perSecond(tsBest), 0), python: round(perSecond(pyBest), 0) },
        ratioBest: round(ratio, 3),
        ratioMedian: round(medianRatio, 3),
        allCores: {
          threads: all.threads,
          seconds: round(all.seconds, 2),
          startSeconds: round(all.startSeconds ?? NaN, 2),
          tokensPerS: round(perSecond(all), 0),
          /** Once the threads were ready. */
          steadyTokensPerS: round(all.tokens / (all.seconds - (all.startSeconds ?? 0)), 0),
          vsOneThread: round(threadsRatio, 2),
          rows: all.rows,
          tokens: all.tokens,
        },
      },
      summary: [
        `corpus: ${fmtInt(o.conversations)} conversations, ${fmtBytes(bytes)}, ${fmtInt(tsBest.tokens)} tokens in ${fmtInt(tsBest.rows)} rows (Python: ${fmtInt(pyBest.tokens)} in ${fmtInt(pyBest.rows)})`,
        `one core: tokenmill ${kps(perSecond(tsBest))}, Python ${kps(perSecond(pyBest))}: ${ratio.toFixed(2)}× (medians: ${medianRatio.toFixed(2)}×)`,
        `all cores (${String(all.threads)} threads, thread start ${(all.startSeconds ?? NaN).toFixed(1)} s included): ${kps(perSecond(all))}, ${threadsRatio.toFixed(2)}× one thread; ${kps(all.tokens / (all.seconds - (all.startSeconds ?? 0)))} once the threads were ready`,
      ],
      wallS: (performance.now() - started) / 1000,
    };
    const resultsDir = path.join(path.dirname(SELF), 'results');
    mkdirSync(resultsDir, { recursive: true });
    writeFileSync(
      path.join(resultsDir, 'tokenize-throughput.json'),
      `${JSON.stringify({ at: new Date().toISOString(), loadAverageBefore: loadBefore, loadAverageAfter: os.loadavg().map((x) => round(x, 2)), cpuModel: os.cpus()[0]?.model, ...result }, null, 2)}\n`,
    );
    return result;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (isMain(import.meta.url)) {
  if (process.argv[2] === 'child') {
    const [mode, file, count] = process.argv.slice(3);
    if ((mode !== 'single' && mode !== 'threads') || file === undefined || count === undefined) {
      throw new Error('usage: tokenize-throughput.ts child single|threads <file> <passes|threads>');
    }
    childMain(mode, file, Number(count)).then(
      () => process.exit(0),
      (e: unknown) => {
        process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
        process.exit(2);
      },
    );
  } else runAsScript(() => tokenizeThroughput());
}
