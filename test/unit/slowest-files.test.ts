import { describe, expect, it } from 'vitest';
import { slowestFilesReport } from '../helpers/slowest-files.js';

describe('slowest files report', () => {
  it('lists the slowest files first, at most `count`, seconds aligned', () => {
    const files = Array.from({ length: 12 }, (_, i) => ({ file: `test/f${i}.test.ts`, seconds: i * 1.5 }));
    const lines = slowestFilesReport(files, 10);
    expect(lines[0]).toBe('Slowest 10 files:');
    expect(lines.slice(1, 3)).toEqual(['  16.5 s  test/f11.test.ts', '  15.0 s  test/f10.test.ts']);
    expect(lines.at(-1)).toBe('   3.0 s  test/f2.test.ts');
    expect(lines).toHaveLength(11);
  });

  it('prints nothing for a run with no files', () => {
    expect(slowestFilesReport([])).toEqual([]);
  });
});
