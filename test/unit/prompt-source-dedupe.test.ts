import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  BloomFilter,
  DuplicateTracker,
  PromptFileIndex,
  fastPromptId,
  parsePromptLine,
  parseScannedLine,
  readPromptFile,
  scanPromptFile,
  type ScannedLine,
} from '../../src/shared/index.js';
import { useTempDir } from '../helpers/temp.js';

function withFile(lines: string[], fn: (file: string) => Promise<void>): Promise<void> {
  const file = path.join(useTempDir('tm-dedupe-'), 'p.jsonl');
  writeFileSync(file, `${lines.join('\n')}\n`);
  return fn(file);
}

describe('fastPromptId', () => {
  it.each([
    '{"id":"a","prompt":"q"}',
    ' { "id" : "with \\"quotes\\" and \\u00e9" , "prompt":"q"}',
    '{"id":42,"prompt":"q"}',
    '{"id":-1.5e3,"messages":[{"role":"user","content":"q"}]}',
    '{"id":"x y","conversations":[{"from":"human","value":"q"}]}',
  ])('gives the id parsePromptLine gives: %s', (text) => {
    const parsed = parsePromptLine(text, 'f', 1);
    expect(parsed.ok).toBe(true);
    expect(fastPromptId(text)).toBe(parsed.ok ? parsed.record.id : 'not ok');
  });

  it.each([
    ['no id', '{"prompt":"q"}'],
    ['id not first', '{"prompt":"q","id":"a"}'],
    ['a second id key (the last one wins in JSON.parse)', '{"id":"a","prompt":"q","id":"b"}'],
    [
      'an id nested further on',
      '{"id":"a","messages":[{"role":"assistant","content":"","tool_calls":[{"id":"c1"}]},{"role":"user","content":"q"}]}',
    ],
    ['an empty id', '{"id":"  ","prompt":"q"}'],
    ['a null id', '{"id":null,"prompt":"q"}'],
    ['a raw control character in the id', '{"id":"a\tb","prompt":"q"}'],
  ])('declines when it cannot be sure (%s): the line is parsed instead', (_what, text) => {
    expect(fastPromptId(text)).toBeUndefined();
  });
});

describe('BloomFilter', () => {
  it('never forgets an id, and rarely claims one it never saw', () => {
    const n = 100_000;
    const filter = new BloomFilter(n * 13);
    for (let i = 0; i < n; i += 1) filter.testAndAdd(`id-${i}`);
    for (let i = 0; i < n; i += 1) expect(filter.has(`id-${i}`)).toBe(true);
    let falsePositives = 0;
    for (let i = 0; i < n; i += 1) if (filter.has(`other-${i}`)) falsePositives += 1;
    // ~0.3 % expected at 13+ bits per id; 1 % leaves room.
    expect(falsePositives / n).toBeLessThan(0.01);
  });

  it('sizes from the file within bounds', () => {
    expect(BloomFilter.forFileBytes(0).sizeBytes).toBe(2 ** 16 / 8);
    expect(BloomFilter.forFileBytes(3 * 2 ** 24).sizeBytes).toBe(2 ** 24 / 8);
    expect(BloomFilter.forFileBytes(1e12).sizeBytes).toBe(2 ** 30 / 8);
  });
});

describe('repeated ids without remembering every id', () => {
  it('rejects a repeat with the line of its first occurrence, for ids and content hashes alike', async () => {
    const lines = [
      '{"id":"a","prompt":"1"}',
      '{"prompt":"same content"}',
      '{"id":"b","prompt":"2"}',
      '{"id":"a","prompt":"3"}',
      '{"prompt":"same content"}',
      '{"id":"c","prompt":""}',
      '{"id":"c","prompt":"valid now"}',
      '{"id":"c","prompt":"again"}',
    ];
    await withFile(lines, async (file) => {
      const out: string[] = [];
      for await (const l of readPromptFile(file))
        out.push(l.ok ? `ok:${l.record.id}@${l.record.line}` : `bad@${l.reject.line}:${l.reject.reason}`);
      expect(out).toEqual([
        'ok:a@1',
        expect.stringMatching(/^ok:h:[0-9a-f]{16}@2$/),
        'ok:b@3',
        'bad@4:duplicate id "a" (first on line 1)',
        expect.stringMatching(/^bad@5:duplicate id "h:[0-9a-f]{16}" \(first on line 2\)$/),
        // An invalid line is no first occurrence: the first valid "c" is line 7.
        'bad@6:the user turn to answer is empty',
        'ok:c@7',
        'bad@8:duplicate id "c" (first on line 7)',
      ]);
      const index = await PromptFileIndex.build(file);
      expect([...index.suspects].sort()).toEqual(expect.arrayContaining(['a', 'c']));
      expect(index.lines).toBe(8);
    });
  });

  it('a false positive of the filter drops nothing: a suspect that occurs once is kept', () => {
    // Every id a suspect, as if the filter said "maybe" to all of them.
    const tracker = new DuplicateTracker(new Set(['x', 'y', 'z']));
    expect(tracker.firstLineOf('x', 1)).toBeUndefined();
    expect(tracker.firstLineOf('y', 2)).toBeUndefined();
    expect(tracker.firstLineOf('z', 3)).toBeUndefined();
    expect(tracker.firstLineOf('x', 9)).toBe(1);
    // An id the filter never flagged occurs once, certainly: nothing is remembered for it.
    expect(tracker.isUnique('w')).toBe(true);
    expect(tracker.firstLineOf('w', 4)).toBeUndefined();
    expect(tracker.firstLineOf('w', 5)).toBeUndefined();
  });

  it('a scan leaves lines with a unique leading id unparsed until asked, and parses the rest', async () => {
    const lines = [
      '{"id":"u1","prompt":"q1"}',
      '{"prompt":"no id"}',
      '{"id":"u2","prompt":"q2"}',
      '{"id":"u2","prompt":"q3"}',
      '{"id":"u3","prompt":""}',
    ];
    await withFile(lines, async (file) => {
      const index = await PromptFileIndex.build(file);
      const scanned: ScannedLine[] = [];
      for await (const chunk of scanPromptFile(file, index)) scanned.push(...chunk);
      expect(scanned.map((s) => s.kind)).toEqual(['unique', 'parsed', 'parsed', 'rejected', 'unique']);
      const last = scanned[4];
      // Valid or not is decided when the caller needs the record (u3 has an empty prompt).
      expect(last !== undefined && parseScannedLine(file, last)).toMatchObject({
        ok: false,
        reject: { line: 5, reason: 'the user turn to answer is empty' },
      });
      const first = scanned[0];
      expect(first !== undefined && parseScannedLine(file, first)).toMatchObject({
        ok: true,
        record: { id: 'u1', line: 1 },
      });
    });
  });

  it('counts lines the way the file has them: CRLF endings, blank lines, no final newline', async () => {
    const dir = useTempDir('tm-dedupe-');
    const file = path.join(dir, 'crlf.jsonl');
    writeFileSync(file, '{"id":"a","prompt":"1"}\r\n\r\n{"id":"b","prompt":"2"}\r\n{"id":"a","prompt":"3"}');
    const out: string[] = [];
    for await (const l of readPromptFile(file))
      out.push(l.ok ? `ok:${l.record.id}@${l.record.line}` : `bad@${l.reject.line}`);
    expect(out).toEqual(['ok:a@1', 'ok:b@3', 'bad@4']);
  });
});
