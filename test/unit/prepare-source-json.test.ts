import { writeFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { readJsonRows } from '../../src/producers/prepare/source-json.js';
import { readJsonlRows } from '../../src/producers/prepare/source-jsonl.js';
import type { RawRow } from '../../src/producers/prepare/source-raw.js';
import { useTempDir } from '../helpers/temp.js';

const dir = useTempDir('tm-source-json-');

let n = 0;
function write(content: string | Buffer, ext = '.json'): string {
  const file = path.join(dir, `f${n++}${ext}`);
  writeFileSync(file, content);
  return file;
}

async function rows(read: (f: string) => AsyncGenerator<RawRow>, file: string): Promise<RawRow[]> {
  const out: RawRow[] = [];
  for await (const r of read(file)) out.push(r);
  return out;
}

const values = (rs: RawRow[]): unknown[] => rs.map((r) => (r.ok ? r.value : { bad: r.reason }));

/** A small deterministic generator (mulberry32). */
function rng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = [
  '"',
  '\\',
  '[',
  ']',
  '{',
  '}',
  ',',
  ':',
  '\n',
  '\t',
  'é',
  '数',
  '🤖',
  '\u2028',
  '\\"',
  'abc ',
  '\u0000',
  '}]',
];

function trickyText(r: () => number, len: number): string {
  let s = '';
  while (s.length < len) s += PIECES[Math.floor(r() * PIECES.length)];
  return s;
}

describe('JSONL rows', () => {
  it('numbers lines from 1 and rows from 0, skipping blank lines; a bad line is a malformed row', async () => {
    const file = write('{"a":1}\n\n  \nnot json\n{"a":2}\r\n[1,2]', '.jsonl');
    const rs = await rows(readJsonlRows, file);
    expect(rs.map((r) => r.where)).toEqual([
      { file, row: 0, line: 1 },
      { file, row: 1, line: 4 },
      { file, row: 2, line: 5 },
      { file, row: 3, line: 6 },
    ]);
    expect(rs[1]).toMatchObject({ ok: false, excerpt: 'not json' });
    expect(rs[1]?.ok === false && rs[1].reason).toMatch(/^not valid JSON: /);
    expect(values(rs).filter((_, i) => i !== 1)).toEqual([{ a: 1 }, { a: 2 }, [1, 2]]);
  });

  it('a line that is not UTF-8 is a malformed row naming the byte', async () => {
    const file = write(
      Buffer.concat([Buffer.from('{"a":"ok"}\n{"a":"'), Buffer.from([0xc3, 0x28]), Buffer.from('"}\n')]),
      '.jsonl',
    );
    const rs = await rows(readJsonlRows, file);
    expect(rs[1]).toMatchObject({ ok: false, reason: 'not valid UTF-8 (byte 0xc3 at column 7)', where: { line: 2 } });
  });
});

describe('JSON rows', () => {
  it('reads a top-level list, with the line each row starts on', async () => {
    const data = [{ a: 1 }, 'two', 3, null, [4], { b: { c: ['x]', '{'] } }];
    const file = write(JSON.stringify(data, null, 2));
    const rs = await rows(readJsonRows, file);
    expect(values(rs)).toEqual(data);
    expect(rs.map((r) => r.where.line)).toEqual([2, 5, 6, 7, 8, 11]);
  });

  it('reads the one list of a top-level object, whatever else it holds', async () => {
    const file = write(
      `\uFEFF{"version": "1.0", "meta": {"rows": [1, 2]}, "note": "a [list] in a \\"string\\"", "data": [{"q": "a"}, {"q": "b"}], "n": 2}`,
    );
    expect(values(await rows(readJsonRows, file))).toEqual([{ q: 'a' }, { q: 'b' }]);
    expect(values(await rows(readJsonRows, write('{"da\\"ta": [1]}')))).toEqual([1]);
    expect(values(await rows(readJsonRows, write('[]')))).toEqual([]);
  });

  it('reads JSON Lines saved as .json', async () => {
    const file = write('{"q": 1}\n{"q": 2}\n');
    const rs = await rows(readJsonRows, file);
    expect(values(rs)).toEqual([{ q: 1 }, { q: 2 }]);
    expect(rs[1]?.where).toEqual({ file, row: 1, line: 2 });
  });

  it('refuses a file that holds no list, several, a scalar or nothing, naming it', async () => {
    const none = write('{"a": 1, "b": {"c": []}}');
    await expect(rows(readJsonRows, none)).rejects.toThrow(
      `${none} holds an object with no list (its keys: a, b): expected a list of rows, or an object holding one list of rows`,
    );
    const two = write('{"train": [1], "test": [2]}');
    await expect(rows(readJsonRows, two)).rejects.toThrow(
      `${two} holds an object with several lists (train, test): keep the one of the rows, or save the rows as JSONL`,
    );
    await expect(rows(readJsonRows, write('"text"'))).rejects.toThrow(
      /does not start with a list or an object \(it starts with "\\""\)/,
    );
    await expect(rows(readJsonRows, write('  \n'))).rejects.toThrow(/is empty: expected a list of rows/);
  });

  it('gives a bad element, a cut-off file and bytes that are not UTF-8 as malformed rows', async () => {
    const bad = write('[{"a": 1}, {"a": tru}, {"a": 3}]');
    expect(values(await rows(readJsonRows, bad))).toEqual([
      { a: 1 },
      { bad: expect.stringMatching(/^not valid JSON/) as unknown },
      { a: 3 },
    ]);
    const cut = write('[{"a": 1},\n {"a": "cut sho');
    const rs = await rows(readJsonRows, cut);
    expect(rs).toHaveLength(2);
    expect(rs[1]).toMatchObject({
      ok: false,
      reason: 'the file ends inside this row (is it cut short?)',
      where: { row: 1, line: 2 },
      excerpt: '{"a": "cut sho',
    });
    const unclosed = write('[{"a": 1},\n');
    expect(values(await rows(readJsonRows, unclosed))).toEqual([
      { a: 1 },
      { bad: 'the file ends before its list of rows closes (is it cut short?)' },
    ]);
    const latin1 = write(Buffer.concat([Buffer.from('[{"a": "'), Buffer.from([0xe9]), Buffer.from('"}]')]));
    expect(values(await rows(readJsonRows, latin1))).toEqual([{ bad: 'not valid UTF-8 (byte 0xe9 at column 8)' }]);
  });

  it('streams a file of several MiB whose strings of quotes, backslashes and brackets cross chunk boundaries', async () => {
    const r = rng(42);
    for (const pad of [0, 1, 2, 3]) {
      const data: unknown[] = [];
      for (let i = 0; i < 24; i++)
        data.push({ id: i, text: trickyText(r, 1000 + Math.floor(r() * 60_000)), nested: [{ k: trickyText(r, 20) }] });
      // Long runs of escapes land on every alignment with the 1 MiB read size across the pads.
      data.push({ id: 'run', text: '\\"'.repeat(300_000) });
      const file = write(`${' '.repeat(pad)}{"meta": "x", "rows": ${JSON.stringify(data)}}`);
      const got = values(await rows(readJsonRows, file));
      expect(got.length).toBe(data.length);
      expect(got).toEqual(data);
    }
  });
});
