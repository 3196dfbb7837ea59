// Benchmark 6: a merge costs what the new rows cost, not what the training dataset holds.
// Two targets are written once with the dataset writer (not through a merge): 1,000,000 rows and
// 50,000 rows of ~64 tokens each. Their id index is built once (the one-time cost of a target
// made without it, reported apart). Then 50,000 new rows are merged into each, in a child process
// per merge (as the post-process round does: rows read from a staged folder, sample keys
// required), and the merge is rolled back so the next repeat starts from the same target; the
// targets alternate. Measured per merge: wall time of the merge call and peak RSS of the child.
//   npx tsx bench/merge-scaling.ts [bigRows]           as a script (default 1,000,000)
//   BENCH_MERGE_SCALING_ROWS=200000 npm run bench -- merge-scaling
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  DatasetIndex,
  mergeIntoTarget,
  readDatasetMeta,
  readHfDataset,
  rollbackTarget,
  writeHfDataset,
  type HfRow,
} from '../src/shared/index.js';
import { fmtBytes, fmtInt, installBenchLogger, isMain, round, runAsScript, type BenchResult } from './lib.js';

export interface MergeScalingOptions {
  bigRows: number;
  smallRows: number;
  newRows: number;
  tokensPerRow: number;
  /** Merges per target (alternating); the median is compared. */
  repeats: number;
  /** Largest acceptable ratio of the median merge times, big target over small. */
  maxTimeRatio: number;
  /** Largest acceptable difference of peak RSS, big target over small (MiB). */
  maxRssDiffMiB: number;
}

export const DEFAULT_MERGE_SCALING: MergeScalingOptions = {
  bigRows: 1_000_000,
  smallRows: 50_000,
  newRows: 50_000,
  tokensPerRow: 64,
  repeats: 3,
  maxTimeRatio: 1.2,
  maxRssDiffMiB: 16,
};

const SHARD_MIB = 500;
const DATASET = 'B1_bench';

/** Row `i` of a set: `tokens` token ids (prompt half unsupervised), different for every row. */
function* rows(prefix: string, n: number, tokens: number): Generator<HfRow> {
  const half = tokens >> 1;
  for (let i = 0; i < n; i++) {
    const ids = new Array<number>(tokens);
    const mask = new Array<number>(tokens);
    let x = (i * 2654435761 + prefix.length) >>> 0;
    for (let t = 0; t < tokens; t++) {
      x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x297a2d39) >>> 0;
      ids[t] = x % 150_000;
      mask[t] = t < half ? 0 : 1;
    }
    yield {
      id: `${prefix}-${i}`,
      dataset: DATASET,
      input_ids: ids,
      loss_mask: mask,
      num_tokens: tokens,
      finish_reason: 'stop',
    };
  }
}

/** What the merge child reports. */
interface ChildReport {
  mergeMs: number;
  /** CPU time (user + system) of the child during the merge call. */
  mergeCpuMs: number;
  maxRssBytes: number;
  heapUsedMaxBytes: number;
  oldRows: number;
  newRows: number;
  rows: number;
}

/** The merge child: one merge of the staged rows into the target, timed, then its peak RSS. */
async function childMain(target: string, staged: string, runDir: string): Promise<void> {
  installBenchLogger();
  let heapMax = 0;
  const sampler = setInterval(() => {
    heapMax = Math.max(heapMax, process.memoryUsage().heapUsed);
  }, 20);
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  const ds = await readHfDataset(staged);
  const result = await mergeIntoTarget({
    target,
    newRows: ds.rows() as AsyncIterable<HfRow>,
    runDir,
    shardSizeMiB: SHARD_MIB,
    requireSampleKey: true,
  });
  const mergeMs = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  clearInterval(sampler);
  heapMax = Math.max(heapMax, process.memoryUsage().heapUsed);
  const report: ChildReport = {
    mergeMs,
    mergeCpuMs: (cpu.user + cpu.system) / 1000,
    maxRssBytes: process.resourceUsage().maxRSS * 1024,
    heapUsedMaxBytes: heapMax,
    oldRows: result.report.oldRows,
    newRows: result.report.newRows,
    rows: result.report.rows,
  };
  process.stdout.write(`${JSON.stringify(report)}\n`);
}

function runChild(target: string, staged: string, runDir: string): Promise<ChildReport> {
  const self = fileURLToPath(import.meta.url);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', self, 'child', target, staged, runDir], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('exit', (code) => {
      if (code !== 0) reject(new Error(`the merge child exited ${String(code)}:\n${stderr.slice(-4_000)}`));
      else resolve(JSON.parse(stdout.trim().split('\n').pop() ?? '{}') as ChildReport);
    });
  });
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
}

function rowsFromCommandLine(): number | undefined {
  const raw = (isMain(import.meta.url) ? process.argv[2] : undefined) ?? process.env['BENCH_MERGE_SCALING_ROWS'];
  if (raw === undefined) return undefined;
  const n = Number(raw.replace(/[_,]/g, ''));
  if (!Number.isInteger(n) || n < 1000)
    throw new Error(
      `merge-scaling: the big target's row count must be an integer of at least 1000, got ${JSON.stringify(raw)}`,
    );
  return n;
}

export async function mergeScaling(options: Partial<MergeScalingOptions> = {}): Promise<BenchResult> {
  installBenchLogger();
  const fromCli = rowsFromCommandLine();
  const o: MergeScalingOptions = {
    ...DEFAULT_MERGE_SCALING,
    ...(fromCli === undefined ? {} : { bigRows: fromCli }),
    ...options,
  };
  const started = performance.now();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tm-bench-merge-scaling-'));
  try {
    const runDir = path.join(dir, 'run');
    const targets = { big: path.join(dir, 'big'), small: path.join(dir, 'small') };
    const sizes = { big: o.bigRows, small: o.smallRows };
    const build: Record<string, { writeS: number; bytes: number; indexS: number }> = {};
    for (const k of ['big', 'small'] as const) {
      const tw = performance.now();
      const w = await writeHfDataset(targets[k], rows(`old-${k}`, sizes[k], o.tokensPerRow), {
        shardSizeMiB: SHARD_MIB,
      });
      const writeS = (performance.now() - tw) / 1000;
      const ti = performance.now();
      const index = await DatasetIndex.open(targets[k], (await readDatasetMeta(targets[k])).shards, { persist: true });
      await index.close();
      build[k] = { writeS, bytes: w.bytes, indexS: (performance.now() - ti) / 1000 };
    }
    const staged = path.join(dir, 'staged');
    await writeHfDataset(staged, rows('new', o.newRows, o.tokensPerRow), { shardSizeMiB: SHARD_MIB });

    const runs: Record<'big' | 'small', ChildReport[]> = { big: [], small: [] };
    for (let r = 0; r < o.repeats; r++) {
      for (const k of r % 2 === 0 ? (['small', 'big'] as const) : (['big', 'small'] as const)) {
        const rep = await runChild(targets[k], staged, runDir);
        if (rep.oldRows !== sizes[k] || rep.newRows !== o.newRows) {
          throw new Error(
            `merge into the ${k} target: ${rep.oldRows} old + ${rep.newRows} new rows, expected ${sizes[k]} + ${o.newRows}`,
          );
        }
        runs[k].push(rep);
        await rollbackTarget({ target: targets[k], runDir });
      }
    }
    const ms = { big: median(runs.big.map((x) => x.mergeMs)), small: median(runs.small.map((x) => x.mergeMs)) };
    const rss = {
      big: Math.max(...runs.big.map((x) => x.maxRssBytes)),
      small: Math.max(...runs.small.map((x) => x.maxRssBytes)),
    };
    const ratio = ms.big / ms.small;
    const cpuMs = {
      big: median(runs.big.map((x) => x.mergeCpuMs)),
      small: median(runs.small.map((x) => x.mergeCpuMs)),
    };
    const rssDiff = rss.big - rss.small;
    const targetsMet: BenchResult['targets'] = [
      {
        what: `merge time of ${fmtInt(o.newRows)} new rows, ${fmtInt(o.bigRows)}-row target over ${fmtInt(o.smallRows)}-row target (median of ${o.repeats})`,
        required: `≤ ${o.maxTimeRatio}`,
        measured: ratio.toFixed(2),
        met: ratio <= o.maxTimeRatio,
      },
      {
        what: 'peak RSS of the merging process, big target minus small target',
        required: `< ${o.maxRssDiffMiB} MiB`,
        measured: fmtBytes(rssDiff),
        met: rssDiff < o.maxRssDiffMiB * 2 ** 20,
      },
    ];
    const line = (k: 'big' | 'small'): string =>
      `${k} target ${fmtInt(sizes[k])} rows (${fmtBytes(build[k]?.bytes ?? 0)}, written in ${(build[k]?.writeS ?? 0).toFixed(1)} s, index built once in ${(build[k]?.indexS ?? 0).toFixed(1)} s): ` +
      `merges ${runs[k].map((x) => `${(x.mergeMs / 1000).toFixed(2)} s`).join(', ')}; peak RSS ${runs[k].map((x) => fmtBytes(x.maxRssBytes)).join(', ')}`;
    return {
      name: 'merge-scaling',
      ok: targetsMet.every((t) => t.met),
      targets: targetsMet,
      metrics: {
        config: o,
        build,
        mergeMs: { big: runs.big.map((x) => round(x.mergeMs, 1)), small: runs.small.map((x) => round(x.mergeMs, 1)) },
        medianMergeMs: { big: round(ms.big, 1), small: round(ms.small, 1) },
        timeRatio: round(ratio, 3),
        mergeCpuMs: {
          big: runs.big.map((x) => round(x.mergeCpuMs, 1)),
          small: runs.small.map((x) => round(x.mergeCpuMs, 1)),
        },
        cpuRatio: round(cpuMs.big / cpuMs.small, 3),
        maxRssBytes: { big: runs.big.map((x) => x.maxRssBytes), small: runs.small.map((x) => x.maxRssBytes) },
        heapUsedMaxBytes: {
          big: runs.big.map((x) => x.heapUsedMaxBytes),
          small: runs.small.map((x) => x.heapUsedMaxBytes),
        },
      },
      summary: [
        line('small'),
        line('big'),
        `median merge ${(ms.big / 1000).toFixed(2)} s vs ${(ms.small / 1000).toFixed(2)} s: ratio ${ratio.toFixed(2)} (CPU ${(cpuMs.big / 1000).toFixed(2)} s vs ${(cpuMs.small / 1000).toFixed(2)} s: ${(cpuMs.big / cpuMs.small).toFixed(2)}); peak RSS ${fmtBytes(rss.big)} vs ${fmtBytes(rss.small)}`,
      ],
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (isMain(import.meta.url)) {
  if (process.argv[2] === 'child') {
    const [target, staged, runDir] = process.argv.slice(3);
    if (target === undefined || staged === undefined || runDir === undefined)
      throw new Error('usage: merge-scaling.ts child <target> <staged> <runDir>');
    childMain(target, staged, runDir).then(
      () => process.exit(0),
      (e: unknown) => {
        process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
        process.exit(2);
      },
    );
  } else runAsScript(() => mergeScaling());
}
