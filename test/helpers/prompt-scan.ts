// A big generated prompt file and the producer's scan of it in a child process with a small
// heap (prompt-scan-child.ts): shared by test/faults/producer-memory.test.ts and
// bench/producer-memory.ts.
import { spawn } from 'node:child_process';
import { closeSync, openSync, writeSync } from 'node:fs';
import path from 'node:path';
import { repoRoot } from './pipeline.js';

/** What prompt-scan-child.ts prints. */
export interface ScanReport {
  lines: number;
  suspects: number;
  unique: number;
  parsed: number;
  rejected: number;
  /** The first 100 rejects. */
  rejects: { file: string; line: number; reason: string; id?: string }[];
  indexMs: number;
  scanMs: number;
  cpuMs: number;
  heapUsedMaxBytes: number;
  arrayBuffersMaxBytes: number;
  maxRssBytes: number;
}

/**
 * Writes `lines` lines `{"id":"p<line>","prompt":"q"}` in 8 MiB chunks; a line in `planted`
 * (line -> an earlier line, 1-based) repeats that line's id. Returns the file's size.
 */
export function writeBigPromptFile(target: string, lines: number, planted: ReadonlyMap<number, number>): number {
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
    for (let line = 1; line <= lines; line += 1) {
      const text = `{"id":"p${planted.get(line) ?? line}","prompt":"q"}`;
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

/** The reject reason the scan gives a planted repeat of line `first`. */
export function plantedReason(first: number): string {
  return `duplicate id "p${first}" (first on line ${first})`;
}

export interface ScanChildRun {
  code: number | null;
  stdout: string;
  stderr: string;
  /** From spawn to exit, Node's start included. */
  wallMs: number;
}

/** Runs prompt-scan-child.ts on `target` under `--max-old-space-size=<heapLimitMiB>`. */
export function runScanChild(target: string, heapLimitMiB: number): Promise<ScanChildRun> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(
      process.execPath,
      [
        `--max-old-space-size=${heapLimitMiB}`,
        '--import',
        'tsx',
        path.join(repoRoot, 'test/helpers/prompt-scan-child.ts'),
        target,
      ],
      {
        cwd: repoRoot,
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('exit', (code) => resolve({ code, stdout, stderr, wallMs: performance.now() - t0 }));
  });
}
