// Benchmark 5: the producer's memory on a big prompt file (docs/design.md, invariant 5, for its
// heap). A generated file of 20M short lines, a few ids repeated, is read the way the producer
// reads it (the duplicate index, then a pass by ids) in a child process whose old space is capped
// at 64 MiB. Measured: peak RSS, peak V8 heap, off-heap buffers, wall and CPU time, suspects.
//   npx tsx bench/producer-memory.ts [lines]          as a script (default 20,000,000)
//   BENCH_PRODUCER_MEMORY_LINES=2000000 npm run bench -- producer-memory
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { plantedReason, runScanChild, writeBigPromptFile, type ScanReport } from '../test/helpers/prompt-scan.js';
import { fmtBytes, fmtInt, isMain, round, runAsScript, type BenchResult } from './lib.js';

export interface ProducerMemoryOptions {
  lines: number;
  /** `--max-old-space-size` of the child (MiB). */
  heapLimitMiB: number;
  /** The largest acceptable peak RSS of the child (MiB). */
  maxRssMiB: number;
}

export const DEFAULT_PRODUCER_MEMORY: ProducerMemoryOptions = {
  lines: 20_000_000,
  heapLimitMiB: 64,
  maxRssMiB: 400,
};

/** line -> the earlier line whose id it repeats: near the start, past 16,777,216 ids (V8's Map limit at 20M), at the end. */
function plantedRepeats(lines: number): Map<number, number> {
  return new Map([
    [7, 3],
    [Math.round(lines * 0.617), 5],
    [lines - 1, Math.round(lines * 0.839)],
  ]);
}

/** The line count: the script's argument, else BENCH_PRODUCER_MEMORY_LINES, else the default. */
function linesFromCommandLine(): number | undefined {
  const raw = (isMain(import.meta.url) ? process.argv[2] : undefined) ?? process.env['BENCH_PRODUCER_MEMORY_LINES'];
  if (raw === undefined) return undefined;
  const n = Number(raw.replace(/[_,]/g, ''));
  if (!Number.isInteger(n) || n < 100)
    throw new Error(`producer-memory: the line count must be an integer of at least 100, got ${JSON.stringify(raw)}`);
  return n;
}

export async function producerMemory(options: Partial<ProducerMemoryOptions> = {}): Promise<BenchResult> {
  const o: ProducerMemoryOptions = {
    ...DEFAULT_PRODUCER_MEMORY,
    ...withoutUndefined({ lines: linesFromCommandLine() } as Partial<ProducerMemoryOptions>),
    ...options,
  };
  const started = performance.now();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tm-bench-producer-memory-'));
  try {
    const file = path.join(dir, 'big.jsonl');
    const planted = plantedRepeats(o.lines);
    const tw = performance.now();
    const fileBytes = writeBigPromptFile(file, o.lines, planted);
    const writeS = (performance.now() - tw) / 1000;

    const run = await runScanChild(file, o.heapLimitMiB);
    if (run.code !== 0)
      throw new Error(
        `the scan child exited ${run.code} under a ${o.heapLimitMiB} MiB heap:\n${run.stderr.slice(-4_000)}`,
      );
    const r = JSON.parse(run.stdout.trim()) as ScanReport;

    const expectedRejects = [...planted].map(([line, first]) => `${line}: ${plantedReason(first)}`);
    const gotRejects = r.rejects.map((x) => `${x.line}: ${x.reason}`);
    const rejectsRight = r.rejected === planted.size && JSON.stringify(gotRejects) === JSON.stringify(expectedRejects);
    const heapLimitBytes = o.heapLimitMiB * 2 ** 20;
    const maxRssBytes = o.maxRssMiB * 2 ** 20;
    const suspectShare = r.suspects / r.lines;
    const linesPerS = r.lines / ((r.indexMs + r.scanMs) / 1000);
    const targets: BenchResult['targets'] = [
      {
        what: `the index and a pass over ${fmtInt(o.lines)} lines under --max-old-space-size=${o.heapLimitMiB}`,
        required: 'exit 0, every line read',
        measured: `exit ${run.code}, ${fmtInt(r.lines)} lines`,
        met: r.lines === o.lines,
      },
      {
        what: 'every planted repeat rejected naming its first line, nothing else rejected',
        required: `${planted.size} rejects`,
        measured: rejectsRight
          ? `${r.rejected} rejects, as planted`
          : `${r.rejected} rejects: ${gotRejects.slice(0, 5).join('; ')}`,
        met: rejectsRight,
      },
      // heapUsed counts the young generation too (up to ~32 MiB beyond the old-space limit).
      {
        what: 'peak V8 heap used',
        required: `< ${fmtBytes(2 * heapLimitBytes)}`,
        measured: fmtBytes(r.heapUsedMaxBytes),
        met: r.heapUsedMaxBytes < 2 * heapLimitBytes,
      },
      {
        what: 'peak RSS of the child',
        required: `< ${fmtBytes(maxRssBytes)}`,
        measured: fmtBytes(r.maxRssBytes),
        met: r.maxRssBytes < maxRssBytes,
      },
      {
        what: 'suspects (ids tracked exactly) as a share of lines',
        required: '< 1 %',
        measured: `${(suspectShare * 100).toFixed(3)} %`,
        met: suspectShare < 0.01,
      },
    ];
    const summary = [
      `${fmtInt(o.lines)} lines, ${fmtBytes(fileBytes)} on disk (written in ${writeS.toFixed(1)} s), ${planted.size} repeated ids planted; child under --max-old-space-size=${o.heapLimitMiB}`,
      `index ${(r.indexMs / 1000).toFixed(1)} s, pass ${(r.scanMs / 1000).toFixed(1)} s (${fmtInt(linesPerS)} lines/s over both reads); child wall ${(run.wallMs / 1000).toFixed(1)} s with Node's start, CPU ${(r.cpuMs / 1000).toFixed(1)} s`,
      `peak RSS ${fmtBytes(r.maxRssBytes)}, peak V8 heap used ${fmtBytes(r.heapUsedMaxBytes)}, peak off-heap buffers ${fmtBytes(r.arrayBuffersMaxBytes)} (the Bloom filter and read chunks)`,
      `suspects ${fmtInt(r.suspects)} (${(suspectShare * 100).toFixed(3)} % of lines: the ${planted.size} repeats and the filter's false positives); lines: ${fmtInt(r.unique)} read by id only, ${fmtInt(r.parsed)} parsed, ${fmtInt(r.rejected)} rejected`,
    ];
    return {
      name: 'producer-memory',
      ok: targets.every((t) => t.met),
      targets,
      metrics: {
        config: o,
        fileBytes,
        writeS: round(writeS, 2),
        childWallS: round(run.wallMs / 1000, 2),
        indexS: round(r.indexMs / 1000, 2),
        scanS: round(r.scanMs / 1000, 2),
        cpuS: round(r.cpuMs / 1000, 2),
        linesPerS: Math.round(linesPerS),
        maxRssBytes: r.maxRssBytes,
        heapUsedMaxBytes: r.heapUsedMaxBytes,
        arrayBuffersMaxBytes: r.arrayBuffersMaxBytes,
        suspects: r.suspects,
        unique: r.unique,
        parsed: r.parsed,
        rejected: r.rejected,
        rejects: r.rejects.slice(0, 10),
      },
      summary,
      wallS: (performance.now() - started) / 1000,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function withoutUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

if (isMain(import.meta.url)) runAsScript(() => producerMemory());
