// `torch.save` of a dict[int, int] written in TypeScript (src/cli/export/torch-*.ts): the pickle
// bytes against the ones CPython's `pickle.dumps(d, protocol=2)` writes (hex and SHA-256 taken
// from CPython 3.11, whose pickler torch.save uses), and the zip archive read back by a small
// reader here: stored entries, CRC-32s, data on 64-byte boundaries, the records torch writes.
// That torch.load reads such files is checked with Python in
// test/integration/trainer-speculators.test.ts.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { crc32 } from 'node:zlib';

import { describe, expect, it } from 'vitest';

import { archiveNameOf, torchSaveIntDict, torchSaveIntDictBytes } from '../../src/cli/export/torch-save.js';
import { pickleIntDict } from '../../src/cli/export/torch-pickle.js';
import { paddingFor, storedZip } from '../../src/cli/export/torch-zip.js';
import { useTempDir } from '../helpers/temp.js';

const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const sha256 = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

describe('pickleIntDict', () => {
  it('writes the bytes CPython writes for small dicts, every integer width', () => {
    expect(hex(pickleIntDict([]))).toBe('80027d71002e');
    // One pair: SETITEM, no MARK.
    expect(hex(pickleIntDict([[3, 1]]))).toBe('80027d71004b034b01732e');
    expect(
      hex(
        pickleIntDict([
          [3, 1],
          [300, 70000],
        ]),
      ),
    ).toBe('80027d7100284b034b014d2c014a70110100752e');
    // BININT1, BININT2, BININT up to 2^31-1, LONG1 from 2^31 (a sign byte more), up to 2^53-1.
    expect(
      hex(
        pickleIntDict([
          [0, 255],
          [256, 65535],
          [65536, 2 ** 31 - 1],
          [2 ** 31, 2 ** 32],
          [2 ** 40, 2 ** 53 - 1],
        ]),
      ),
    ).toBe(
      '80027d7100284b004bff4d00014dffff4a000001004affffff7f8a0500000080008a0500000000018a060000000000018a07ffffffffffff1f752e',
    );
    expect(
      hex(
        pickleIntDict([
          [-1, -256],
          [-(2 ** 31), -(2 ** 31) - 1],
        ]),
      ),
    ).toBe('80027d7100284affffffff4a00ffffff4a000000808a05ffffff7fff752e');
  });

  it('cuts batches of 1000 pairs as CPython does, an empty last batch included', () => {
    const thousand = pickleIntDict(Array.from({ length: 1000 }, (_, i) => [i, i * 7] as const));
    expect(thousand.length).toBe(5717);
    expect(hex(thousand.subarray(-4))).toBe('7528752e'); // SETITEMS, then an empty MARK … SETITEMS, STOP
    expect(sha256(thousand)).toBe('dfe3408c3dff674c1599766f89ec21149216b255bd92405bca957735c1618fe9');
    const more = pickleIntDict(Array.from({ length: 1001 }, (_, i) => [i, 1] as const));
    expect(more.length).toBe(4759);
    expect(sha256(more)).toBe('11013b6e1d59730fb06d06a9ae99f76e03423b03594aea68434eb92d4a9ea478');
    const mixed = new Map<number, number>();
    for (let i = 0; i < 2500; i++) mixed.set((i * 7919) % 100003, i * i);
    expect(sha256(pickleIntDict(mixed))).toBe('2745ef5cfd2a0739a7fbc717cda57cfa420aefb421f38c850cde49a466dd828a');
  });

  it('refuses what is not a safe integer', () => {
    expect(() => pickleIntDict([[1, 2 ** 53]])).toThrow(/not a safe integer/);
    expect(() => pickleIntDict([[1.5, 1]])).toThrow(/not a safe integer/);
  });
});

interface ReadEntry {
  name: string;
  dataOffset: number;
  data: Buffer;
  extra: Buffer;
}

/** Reads a zip archive through its central directory, checking each local header against it. */
function readZip(buf: Buffer): ReadEntry[] {
  const end = buf.length - 22;
  expect(buf.readUInt32LE(end)).toBe(0x06054b50);
  const count = buf.readUInt16LE(end + 10);
  const cdSize = buf.readUInt32LE(end + 12);
  let p = buf.readUInt32LE(end + 16);
  expect(p + cdSize).toBe(end);
  const entries: ReadEntry[] = [];
  for (let i = 0; i < count; i++) {
    expect(buf.readUInt32LE(p)).toBe(0x02014b50);
    const method = buf.readUInt16LE(p + 10);
    const crc = buf.readUInt32LE(p + 16);
    const size = buf.readUInt32LE(p + 20);
    expect(buf.readUInt32LE(p + 24)).toBe(size);
    const nameLen = buf.readUInt16LE(p + 28);
    const cdExtra = buf.readUInt16LE(p + 30);
    const local = buf.readUInt32LE(p + 42);
    const name = buf.subarray(p + 46, p + 46 + nameLen).toString('latin1');
    p += 46 + nameLen + cdExtra;
    expect(method).toBe(0);
    expect(buf.readUInt32LE(local)).toBe(0x04034b50);
    expect(buf.readUInt32LE(local + 14)).toBe(crc);
    expect(buf.readUInt32LE(local + 18)).toBe(size);
    const localName = buf.readUInt16LE(local + 26);
    const localExtra = buf.readUInt16LE(local + 28);
    expect(buf.subarray(local + 30, local + 30 + localName).toString('latin1')).toBe(name);
    const extra = buf.subarray(local + 30 + localName, local + 30 + localName + localExtra);
    const dataOffset = local + 30 + localName + localExtra;
    const data = buf.subarray(dataOffset, dataOffset + size);
    expect(crc32(data)).toBe(crc);
    entries.push({ name, dataOffset, data, extra });
  }
  return entries;
}

describe('storedZip', () => {
  it("pads as PyTorch's writer does (the paddings of a token_freq.pt torch.save wrote)", () => {
    // token_freq/data.pkl at 0 (extra field 15 bytes: FB, length, 11 Z), token_freq/.format_version at 104 (32 bytes).
    expect(paddingFor(0, 'token_freq/data.pkl'.length, 64)).toBe(11);
    expect(paddingFor(104, 'token_freq/.format_version'.length, 64)).toBe(28);
    expect(paddingFor(30, 0, 64)).toBe(0);
  });

  it('writes stored entries, data on the alignment, readable through the central directory', () => {
    const entries = [
      { name: 'a/data.pkl', data: Buffer.from('0123456789') },
      { name: 'a/empty', data: Buffer.alloc(0) },
      { name: 'a/.data/x', data: Buffer.alloc(1000, 7) },
    ];
    const zip = storedZip(entries, 64);
    const read = readZip(zip);
    expect(read.map((e) => e.name)).toEqual(entries.map((e) => e.name));
    for (const [i, e] of read.entries()) {
      expect(e.dataOffset % 64, e.name).toBe(0);
      expect(hex(e.data)).toBe(hex(entries[i]?.data ?? Buffer.alloc(0)));
      expect(e.extra.subarray(0, 2).toString('latin1')).toBe('FB');
      expect(e.extra.readUInt16LE(2)).toBe(e.extra.length - 4);
      expect(/^Z*$/.test(e.extra.subarray(4).toString('latin1'))).toBe(true);
    }
    expect(() => storedZip([{ name: 'é', data: Buffer.alloc(1) }])).toThrow(/not ASCII/);
  });
});

describe('torchSaveIntDict', () => {
  const dir = useTempDir('tm-torch-save-');

  it("holds torch.save's records in its order, under the file's name", () => {
    const dict = new Map([
      [3, 1],
      [4, 1],
      [6, 1],
      [7, 1],
    ]);
    const bytes = torchSaveIntDictBytes(dict, 'token_freq');
    const read = readZip(bytes);
    expect(read.map((e) => e.name)).toEqual([
      'token_freq/data.pkl',
      'token_freq/.format_version',
      'token_freq/.storage_alignment',
      'token_freq/byteorder',
      'token_freq/version',
      'token_freq/.data/serialization_id',
    ]);
    const text = (i: number): string => read[i]?.data.toString('latin1') ?? '';
    // The pickle of torch.save({3: 1, 4: 1, 6: 1, 7: 1}) (read out of a file torch 2.13 wrote).
    expect(hex(read[0]?.data ?? Buffer.alloc(0))).toBe('80027d7100284b034b014b044b014b064b014b074b01752e');
    expect([text(1), text(2), text(3), text(4)]).toEqual(['1', '64', 'little', '3\n']);
    expect(text(5)).toMatch(/^\d{40}$/);
    // Same dict, same bytes.
    expect(hex(torchSaveIntDictBytes(dict, 'token_freq'))).toBe(hex(bytes));
  });

  it('names the archive after the file, writes it whole and never over another file', async () => {
    expect(archiveNameOf('/x/y/token_freq.pt')).toBe('token_freq');
    expect(archiveNameOf('/x/y/freq')).toBe('freq');
    expect(archiveNameOf('/x/y/counts.v2.pt')).toBe('counts.v2');
    const file = path.join(dir, 'token_freq.pt');
    const size = await torchSaveIntDict(file, [[5, 9]]);
    const bytes = readFileSync(file);
    expect(bytes.length).toBe(size);
    expect(hex(bytes)).toBe(hex(torchSaveIntDictBytes([[5, 9]], 'token_freq')));
    writeFileSync(path.join(dir, 'taken.pt'), 'x');
    await expect(torchSaveIntDict(path.join(dir, 'taken.pt'), [[1, 1]])).rejects.toThrow(/EEXIST/);
  });
});
