import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  PromptFileIndex,
  readPromptFile,
  readRawLines,
  scanPromptFile,
  type RawPromptLine,
} from '../../src/shared/index.js';
import { useTempDir } from '../helpers/temp.js';
import { firstInvalidUtf8 } from '../../src/shared/prompts/line-reader.js';

async function withBytes<T>(bytes: Buffer, fn: (file: string) => Promise<T>): Promise<T> {
  const file = path.join(useTempDir('tm-line-reader-'), 'p.jsonl');
  writeFileSync(file, bytes);
  return fn(file);
}

async function rawLines(bytes: Buffer): Promise<RawPromptLine[]> {
  return withBytes(bytes, async (file) => {
    const out: RawPromptLine[] = [];
    for await (const l of readRawLines(file)) out.push(l);
    return out;
  });
}

const utf8 = (s: string): Buffer => Buffer.from(s, 'utf8');
const BOM = Buffer.from([0xef, 0xbb, 0xbf]);

describe('readRawLines', () => {
  it('skips a UTF-8 byte order mark before the first line, and only there', async () => {
    const lines = await rawLines(Buffer.concat([BOM, utf8('{"id":"a"}\r\n\uFEFF{"id":"b"}\n')]));
    expect(lines).toEqual([
      { line: 1, text: '{"id":"a"}' },
      { line: 2, text: '\uFEFF{"id":"b"}' },
    ]);
  });

  it('a file that is only a byte order mark, or a BOM and a blank line, has no lines', async () => {
    expect(await rawLines(BOM)).toEqual([]);
    expect(await rawLines(Buffer.concat([BOM, utf8('\r\n\n')]))).toEqual([]);
  });

  it('a line whose bytes are not UTF-8 is unreadable, naming the byte and its column; its neighbours are read', async () => {
    const bad = Buffer.concat([utf8('{"id":"x","prompt":"bri'), Buffer.from([0xff, 0xfe, 0xc3, 0x28]), utf8('efly"}')]);
    const lines = await rawLines(Buffer.concat([utf8('{"id":"a"}\r\n'), bad, utf8('\r\n\n{"id":"b"}')]));
    expect(lines).toEqual([
      { line: 1, text: '{"id":"a"}' },
      { line: 2, unreadable: 'not valid UTF-8 (byte 0xff at column 24)' },
      { line: 4, text: '{"id":"b"}' },
    ]);
  });

  it('a U+FFFD written in the file (valid UTF-8) is kept as text', async () => {
    expect(await rawLines(utf8('{"id":"\uFFFD"}\n'))).toEqual([{ line: 1, text: '{"id":"\uFFFD"}' }]);
  });

  it('says when the file looks like UTF-16', async () => {
    const lines = await rawLines(Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('{"id":"a"}\n', 'utf16le')]));
    expect(lines[0]).toEqual({
      line: 1,
      unreadable: 'not valid UTF-8 (byte 0xff at column 1; the file looks like UTF-16: save it as UTF-8)',
    });
  });

  it('keeps line numbers and characters across 1 MiB read chunks: a long line, a character split between chunks, a bad byte past the first chunk', async () => {
    const long = `{"id":"long","prompt":"${'é'.repeat(700_000)}"}`; // 1.4 MB: spans two chunks
    const filler = Array.from({ length: 40_000 }, (_, i) => `{"id":"f${i}","prompt":"日本語"}`);
    const parts = [
      utf8(`${long}\n`),
      utf8(`${filler.join('\n')}\n`),
      Buffer.from([0x7b, 0x80, 0x7d, 0x0a]),
      utf8('{"id":"last"}'),
    ];
    const lines = await rawLines(Buffer.concat(parts));
    expect(lines).toHaveLength(1 + filler.length + 2);
    expect(lines[0]).toEqual({ line: 1, text: long });
    expect(lines.slice(1, -2).every((l, i) => l.text === filler[i] && l.line === i + 2)).toBe(true);
    expect(lines.at(-2)).toEqual({ line: filler.length + 2, unreadable: 'not valid UTF-8 (byte 0x80 at column 2)' });
    expect(lines.at(-1)).toEqual({ line: filler.length + 3, text: '{"id":"last"}' });
  });
});

describe('firstInvalidUtf8', () => {
  it.each([
    ['ascii and valid multi-byte: none (the length)', utf8('a é 日 😀'), 13],
    ['a lone continuation byte', Buffer.from([0x61, 0x80]), 1],
    ['an overlong encoding', Buffer.from([0xc0, 0xaf]), 0],
    ['an overlong three-byte encoding', Buffer.from([0x61, 0xe0, 0x80, 0xaf]), 1],
    ['a UTF-16 surrogate', Buffer.from([0xed, 0xa0, 0x80]), 0],
    ['beyond U+10FFFF', Buffer.from([0xf4, 0x90, 0x80, 0x80]), 0],
    ['a sequence cut short', Buffer.from([0x61, 0x62, 0xe6, 0x97]), 2],
    ['0xff', Buffer.from([0xff]), 0],
  ])('%s', (_what, bytes, expected) => {
    expect(firstInvalidUtf8(bytes)).toBe(expected);
  });
});

describe('the prompt readers on a BOM and bytes that are not UTF-8', () => {
  const file = Buffer.concat([
    BOM,
    utf8('{"id":"first","prompt":"q"}\n'),
    utf8('{"id":"x","prompt":"caf'),
    Buffer.from([0xe9]), // Latin-1 é
    utf8('"}\n{"id":"last","prompt":"q"}\n'),
  ]);

  it('the scan (fast id path) and readPromptFile agree: line 1 by its id, line 2 rejected, line 3 read', async () => {
    await withBytes(file, async (f) => {
      const index = await PromptFileIndex.build(f);
      expect(index.lines).toBe(3);
      const scanned: string[] = [];
      for await (const chunk of scanPromptFile(f, index)) {
        for (const s of chunk)
          scanned.push(
            s.kind === 'unique'
              ? `unique:${s.id}@${s.line}`
              : s.kind === 'parsed'
                ? `parsed:${s.record.id}`
                : `rejected@${s.reject.line}:${s.reject.reason}`,
          );
      }
      const read: string[] = [];
      for await (const l of readPromptFile(f))
        read.push(l.ok ? `ok:${l.record.id}@${l.record.line}` : `rejected@${l.reject.line}:${l.reject.reason}`);
      const reason = 'not valid UTF-8 (byte 0xe9 at column 24)';
      expect(scanned).toEqual(['unique:first@1', `rejected@2:${reason}`, 'unique:last@3']);
      expect(read).toEqual(['ok:first@1', `rejected@2:${reason}`, 'ok:last@3']);
    });
  });
});
