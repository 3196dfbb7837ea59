// docs/design.md, invariant 5, for the producer's heap: a 5M-line prompt file is read with memory
// that does not grow with its lines. The old reader kept a Map of every id (~173 B each); under the
// heap limit given here it runs out of memory after a few hundred thousand lines, so 5M lines are
// ten times past that. bench/producer-memory.ts reads 20M lines (past V8's 16,777,216-entry Map
// limit too) and reports the peak heap and RSS (docs/benchmarks/generation.md).
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { useHarness } from '../helpers/fixture.js';
import { plantedReason, runScanChild, writeBigPromptFile, type ScanReport } from '../helpers/prompt-scan.js';

const LINES = 5_000_000;
/** line -> the earlier line whose id it repeats (1-based). */
const PLANTED: ReadonlyMap<number, number> = new Map([
  [7, 3],
  [2_345_678, 5],
  [4_999_999, 3_777_300],
]);
const HEAP_LIMIT_MIB = 64;

const { tmp } = useHarness({ tmp: 'tm-producer-memory-' });
let file: string;

beforeAll(() => {
  file = path.join(tmp.dir, 'big.jsonl');
  writeBigPromptFile(file, LINES, PLANTED);
}, 120_000);

describe('producer memory on a big prompt file', () => {
  it(`reads ${LINES.toLocaleString('en')} lines under a ${HEAP_LIMIT_MIB} MiB heap, every repeated id rejected with its first line`, async () => {
    const { code, stdout, stderr } = await runScanChild(file, HEAP_LIMIT_MIB);
    expect(stderr).not.toMatch(/Map maximum size exceeded|heap out of memory/);
    expect(code, stderr).toBe(0);
    const report = JSON.parse(stdout.trim()) as ScanReport;
    expect(report.lines).toBe(LINES);
    expect(report.rejected).toBe(PLANTED.size);
    expect(report.unique + report.parsed).toBe(LINES - PLANTED.size);
    expect(report.rejects.map((r) => [r.line, r.reason])).toEqual(
      [...PLANTED].map(([line, first]) => [line, plantedReason(first)]),
    );
    // Only the suspects are remembered: the repeats and the filter's few false positives.
    expect(report.suspects).toBeLessThan(LINES / 100);
    // heapUsed counts the young generation too (up to ~32 MiB beyond the old-space limit).
    expect(report.heapUsedMaxBytes).toBeLessThan(2 * HEAP_LIMIT_MIB * 2 ** 20);
    // The filter (~1.5 bytes a line at most, off the heap) plus Node itself.
    expect(report.maxRssBytes).toBeLessThan(400 * 2 ** 20);
  }, 300_000);
});
