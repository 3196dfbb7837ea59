// Benchmark: `tokenmill prepare`'s memory on a big source. A ShareGPT parquet file of 1M rows
// (written by pyarrow into a temp folder: snappy, row groups of 10,000, about 5 % of the rows
// repeating an earlier row's messages under another id, 1 % with no user turn, every row
// ending with an assistant turn) is prepared in a child process. Measured: peak RSS (the
// kernel's maxrss), peak V8 heap, rows/s, and whether every count is what was planted.
//   npx tsx bench/prepare-memory.ts [rows]          as a script (default 1,000,000)
//   BENCH_PREPARE_MEMORY_ROWS=200000 npm run bench -- prepare-memory
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../src/shared/index.js';
import { prepareSources, type DatasetPrepareOutcome } from '../src/producers/prepare/prepare.js';
import { fmtBytes, fmtInt, installBenchLogger, isMain, round, runAsScript, type BenchResult } from './lib.js';

export interface PrepareMemoryOptions {
  rows: number;
  /** Every `duplicateEvery`-th row repeats the messages of an earlier row (another id). */
  duplicateEvery: number;
  /** Every `emptyEvery`-th row (not a duplicate) has no user turn. */
  emptyEvery: number;
  /** `--max-old-space-size` of the child (MiB): a heap that grew with the source would not fit. */
  heapLimitMiB: number;
  /** The largest acceptable peak RSS of the child (MiB). */
  maxRssMiB: number;
}

export const DEFAULT_PREPARE_MEMORY: PrepareMemoryOptions = {
  rows: 1_000_000,
  duplicateEvery: 20,
  emptyEvery: 101,
  heapLimitMiB: 128,
  maxRssMiB: 400,
};

const repoRoot = fileURLToPath(new URL('../', import.meta.url));

/** The Python that writes the source: row i's text, its duplicates and empties follow the same rule as {@link expectedCounts}. */
const WRITE_PARQUET = `
import sys, pyarrow as pa, pyarrow.parquet as pq
out, rows, dup_every, empty_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
turn = pa.struct([("from", pa.string()), ("value", pa.string())])
schema = pa.schema([("id", pa.string()), ("conversations", pa.list_(turn))])
words = "the of and to in is that for it as with was on be by at this from or an are which not have".split()
def text(i):
    w = [words[(i * 7 + k * 13) % len(words)] for k in range(40 + i % 40)]
    return f"Question {i}: " + " ".join(w) + "?"
with pq.ParquetWriter(out, schema, compression="snappy") as writer:
    for start in range(0, rows, 10000):
        ids, convs = [], []
        for i in range(start, min(rows, start + 10000)):
            ids.append(f"r{i}")
            if i > 0 and i % dup_every == 0:
                src = i // 2
                while src % dup_every == 0 or src % empty_every == 0:
                    src -= 1
                convs.append([{"from": "human", "value": text(src)}, {"from": "gpt", "value": "answer " + str(i)}])
            elif i % empty_every == 0:
                convs.append([{"from": "system", "value": "no question here"}, {"from": "gpt", "value": "answer " + str(i)}])
            else:
                convs.append([{"from": "human", "value": text(i)}, {"from": "gpt", "value": "answer " + str(i)}])
        writer.write_table(pa.table({"id": ids, "conversations": convs}, schema=schema), row_group_size=10000)
`;

function expectedCounts(o: PrepareMemoryOptions): { kept: number; duplicates: number; empty: number } {
  let duplicates = 0;
  let empty = 0;
  for (let i = 0; i < o.rows; i += 1) {
    if (i > 0 && i % o.duplicateEvery === 0) duplicates += 1;
    else if (i % o.emptyEvery === 0) empty += 1;
  }
  return { kept: o.rows - duplicates - empty, duplicates, empty };
}

/** What the child reports. */
interface ChildReport {
  outcome: DatasetPrepareOutcome;
  maxRssBytes: number;
  heapUsedMaxBytes: number;
  wallMs: number;
  cpuMs: number;
}

/** The child: prepares the config's datasets, sampling its memory, and prints a {@link ChildReport}. */
async function child(configFile: string): Promise<void> {
  installBenchLogger();
  let heapUsedMax = 0;
  const timer = setInterval(() => (heapUsedMax = Math.max(heapUsedMax, process.memoryUsage().heapUsed)), 20);
  const started = performance.now();
  const cpu0 = process.cpuUsage();
  const [outcome] = await prepareSources({ config: loadConfig({ path: configFile }) });
  clearInterval(timer);
  const cpu = process.cpuUsage(cpu0);
  const report: ChildReport = {
    outcome: outcome as DatasetPrepareOutcome,
    maxRssBytes: process.resourceUsage().maxRSS * 1024,
    heapUsedMaxBytes: heapUsedMax,
    wallMs: performance.now() - started,
    cpuMs: (cpu.user + cpu.system) / 1000,
  };
  process.stdout.write(`${JSON.stringify(report)}\n`);
}

function runChild(
  configFile: string,
  heapLimitMiB: number,
): Promise<{ code: number | null; stdout: string; stderr: string; wallMs: number }> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const p = spawn(
      process.execPath,
      [
        `--max-old-space-size=${heapLimitMiB}`,
        '--import',
        'tsx',
        fileURLToPath(import.meta.url),
        '--child',
        configFile,
      ],
      { cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    p.on('error', reject);
    p.on('exit', (code) => resolve({ code, stdout, stderr, wallMs: performance.now() - started }));
  });
}

function rowsFromCommandLine(): number | undefined {
  const raw =
    (isMain(import.meta.url) && process.argv[2] !== '--child' ? process.argv[2] : undefined) ??
    process.env['BENCH_PREPARE_MEMORY_ROWS'];
  if (raw === undefined) return undefined;
  const n = Number(raw.replace(/[_,]/g, ''));
  if (!Number.isInteger(n) || n < 1000)
    throw new Error(`prepare-memory: the row count must be an integer of at least 1000, got ${JSON.stringify(raw)}`);
  return n;
}

export async function prepareMemory(options: Partial<PrepareMemoryOptions> = {}): Promise<BenchResult> {
  const rows = rowsFromCommandLine();
  const o: PrepareMemoryOptions = { ...DEFAULT_PREPARE_MEMORY, ...(rows === undefined ? {} : { rows }), ...options };
  const python = path.join(repoRoot, '.venv/bin/python');
  if (!existsSync(python))
    throw new Error(`prepare-memory needs ${python} with pyarrow to write its source (scripts/setup-python.sh)`);
  const started = performance.now();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tm-bench-prepare-memory-'));
  try {
    const write = (name: string, rows: number): string => {
      const file = path.join(dir, `${name}.parquet`);
      execFileSync(python, ['-c', WRITE_PARQUET, file, String(rows), String(o.duplicateEvery), String(o.emptyEvery)], {
        stdio: 'inherit',
      });
      const configFile = path.join(dir, `${name}.yaml`);
      writeFileSync(
        configFile,
        `run: ${name}\ndatasets:\n  - name: big\n    source: { path: ${name}.parquet }\n    tokenBudget: 1000\noutput: { dir: out }\n`,
      );
      return configFile;
    };
    const prepare = async (
      configFile: string,
    ): Promise<{ run: Awaited<ReturnType<typeof runChild>>; r: ChildReport }> => {
      const run = await runChild(configFile, o.heapLimitMiB);
      if (run.code !== 0)
        throw new Error(
          `the prepare child exited ${run.code} under --max-old-space-size=${o.heapLimitMiB}:\n${run.stderr.slice(-4_000)}`,
        );
      return { run, r: JSON.parse(run.stdout.trim().split('\n').at(-1) ?? '{}') as ChildReport };
    };
    // A source a twentieth the size first: how much the peak grows with the source.
    const small = await prepare(write('small', Math.max(1000, Math.round(o.rows / 20))));
    const tw = performance.now();
    const configFile = write('big', o.rows);
    const writeS = (performance.now() - tw) / 1000;
    const sourceBytes = statSync(path.join(dir, 'big.parquet')).size;
    const { run, r } = await prepare(configFile);
    const c = r.outcome.counts;
    const want = expectedCounts(o);
    const promptsBytes = statSync(r.outcome.prompts).size;
    const rowsPerS = c.rowsRead / (r.wallMs / 1000);
    const countsRight =
      c.rowsRead === o.rows &&
      c.kept === want.kept &&
      c.duplicates === want.duplicates &&
      c.empty === want.empty &&
      c.malformed === 0;
    const maxRssBytes = o.maxRssMiB * 2 ** 20;
    const targets: BenchResult['targets'] = [
      {
        what: 'every row read; kept, duplicates and empty rows as planted',
        required: `${fmtInt(o.rows)} read, ${fmtInt(want.kept)} kept, ${fmtInt(want.duplicates)} duplicates, ${fmtInt(want.empty)} empty`,
        measured: `${fmtInt(c.rowsRead)} read, ${fmtInt(c.kept)} kept, ${fmtInt(c.duplicates)} duplicates, ${fmtInt(c.empty)} empty, ${fmtInt(c.malformed)} malformed`,
        met: countsRight,
      },
      {
        what: 'peak RSS of the child',
        required: `< ${fmtBytes(maxRssBytes)}`,
        measured: fmtBytes(r.maxRssBytes),
        met: r.maxRssBytes < maxRssBytes,
      },
    ];
    const summary = [
      `${fmtInt(o.rows)} ShareGPT rows, parquet ${fmtBytes(sourceBytes)} (written by pyarrow in ${writeS.toFixed(1)} s); prompt file ${fmtBytes(promptsBytes)}`,
      `child under --max-old-space-size=${o.heapLimitMiB}; prepare ${(r.wallMs / 1000).toFixed(1)} s (${fmtInt(rowsPerS)} rows/s), CPU ${(r.cpuMs / 1000).toFixed(1)} s; child wall ${(run.wallMs / 1000).toFixed(1)} s with Node's start`,
      `peak RSS ${fmtBytes(r.maxRssBytes)} (${round(r.maxRssBytes / promptsBytes, 2)}x the prompt file), peak V8 heap used ${fmtBytes(r.heapUsedMaxBytes)}`,
      `a source of ${fmtInt(small.r.outcome.counts.rowsRead)} rows: peak RSS ${fmtBytes(small.r.maxRssBytes)}, so ${round(r.maxRssBytes / small.r.maxRssBytes, 2)}x the peak for ${round(o.rows / small.r.outcome.counts.rowsRead, 1)}x the rows`,
    ];
    return {
      name: 'prepare-memory',
      ok: targets.every((t) => t.met),
      targets,
      metrics: {
        config: o,
        sourceBytes,
        promptsBytes,
        writeS: round(writeS, 2),
        prepareS: round(r.wallMs / 1000, 2),
        childWallS: round(run.wallMs / 1000, 2),
        cpuS: round(r.cpuMs / 1000, 2),
        rowsPerS: Math.round(rowsPerS),
        maxRssBytes: r.maxRssBytes,
        heapUsedMaxBytes: r.heapUsedMaxBytes,
        smallRows: small.r.outcome.counts.rowsRead,
        smallMaxRssBytes: small.r.maxRssBytes,
        rssGrowthRatio: round(r.maxRssBytes / small.r.maxRssBytes, 3),
        counts: c,
      },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (isMain(import.meta.url)) {
  const childAt = process.argv.indexOf('--child');
  if (childAt >= 0) {
    child(process.argv[childAt + 1] ?? '').catch((e: unknown) => {
      process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
      process.exit(1);
    });
  } else {
    runAsScript(() => prepareMemory());
  }
}
