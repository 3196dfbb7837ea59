// DESIGN invariant 5 for the producer's heap: a 20M-line prompt file is read with memory that
// does not grow with its lines. The old reader kept a Map of every id (~173 B each); V8
// refuses more than 16,777,216 entries ("Map maximum size exceeded") and, under the heap
// limit given here, it runs out of memory after a few hundred thousand lines.
import { spawn } from 'node:child_process';
import { closeSync, openSync, writeSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot, tempDir } from '../helpers/pipeline.js';

const LINES = 20_000_000;
/** line -> the earlier line whose id it repeats (1-based). */
const PLANTED: ReadonlyMap<number, number> = new Map([
  [7, 3],
  [12_345_678, 5],
  [19_999_999, 16_777_300],
]);
const HEAP_LIMIT_MIB = 64;

let tmp: { dir: string; cleanup: () => void };
let file: string;

/** Writes the file in 8 MiB chunks: `{"id":"p<line>","prompt":"q"}`, a few ids repeated. */
function writeBigPromptFile(target: string): void {
  const fd = openSync(target, 'w');
  try {
    let buf: string[] = [];
    let size = 0;
    for (let line = 1; line <= LINES; line += 1) {
      const text = `{"id":"p${PLANTED.get(line) ?? line}","prompt":"q"}`;
      buf.push(text);
      size += text.length + 1;
      if (size >= 8 << 20) {
        writeSync(fd, `${buf.join('\n')}\n`);
        buf = [];
        size = 0;
      }
    }
    if (buf.length > 0) writeSync(fd, `${buf.join('\n')}\n`);
  } finally {
    closeSync(fd);
  }
}

beforeAll(() => {
  tmp = tempDir('tm-producer-memory-');
  file = path.join(tmp.dir, 'big.jsonl');
  writeBigPromptFile(file);
}, 120_000);

afterAll(() => tmp?.cleanup());

interface ScanReport {
  lines: number;
  suspects: number;
  unique: number;
  parsed: number;
  rejected: number;
  rejects: { file: string; line: number; reason: string; id?: string }[];
  heapUsedMaxBytes: number;
  maxRssBytes: number;
}

function runScanChild(target: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [`--max-old-space-size=${HEAP_LIMIT_MIB}`, '--import', 'tsx', path.join(repoRoot, 'test/helpers/prompt-scan-child.ts'), target], {
      cwd: repoRoot,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('producer memory on a big prompt file', () => {
  it(`reads ${LINES.toLocaleString('en')} lines under a ${HEAP_LIMIT_MIB} MiB heap, every repeated id rejected with its first line`, async () => {
    const { code, stdout, stderr } = await runScanChild(file);
    expect(stderr).not.toMatch(/Map maximum size exceeded|heap out of memory/);
    expect(code, stderr).toBe(0);
    const report = JSON.parse(stdout.trim()) as ScanReport;
    expect(report.lines).toBe(LINES);
    expect(report.rejected).toBe(PLANTED.size);
    expect(report.unique + report.parsed).toBe(LINES - PLANTED.size);
    expect(report.rejects.map((r) => [r.line, r.reason])).toEqual(
      [...PLANTED].map(([line, first]) => [line, `duplicate id "p${first}" (first on line ${first})`]),
    );
    // Only the suspects are remembered: the repeats and the filter's few false positives.
    expect(report.suspects).toBeLessThan(LINES / 100);
    // heapUsed counts the young generation too (up to ~32 MiB beyond the old-space limit).
    expect(report.heapUsedMaxBytes).toBeLessThan(2 * HEAP_LIMIT_MIB * 2 ** 20);
    // The filter (~1.5 bytes a line at most, off the heap) plus Node itself.
    expect(report.maxRssBytes).toBeLessThan(400 * 2 ** 20);
  }, 300_000);
});
