/**
 * The zip archive of `torch.save`'s format: stored (uncompressed) entries whose data starts on
 * a multiple of the storage alignment (64 bytes), padded as PyTorch's own writer pads them (an
 * extra field `FB`, its length, then `Z`s), with a central directory and an end record. Built
 * in memory: it holds small objects (a vocabulary-sized dict is a few MiB).
 */
import { crc32 } from 'node:zlib';

/** One file of the archive. */
export interface ZipEntry {
  /** Path inside the archive (`token_freq/data.pkl`): ASCII. */
  name: string;
  data: Uint8Array;
}

const LOCAL_HEADER = 0x04034b50;
const CENTRAL_HEADER = 0x02014b50;
const END_OF_CENTRAL_DIRECTORY = 0x06054b50;
const LOCAL_HEADER_BYTES = 30;
const CENTRAL_HEADER_BYTES = 46;
const END_BYTES = 22;
/** "Version needed to extract" of a stored entry without zip64 (1.0). */
const VERSION = 10;
/** The extra field PyTorch's writer pads with: id `FB`, 2-byte length. */
const PAD_HEADER_BYTES = 4;
/** Beyond this the archive would need zip64 records, which this writer does not make. */
const MAX_ZIP32 = 0xffffffff;

/** Bytes of `Z` padding that put an entry's data, after a local header at `cursor`, on `alignment`. */
export function paddingFor(cursor: number, nameBytes: number, alignment: number): number {
  const start = cursor + LOCAL_HEADER_BYTES + nameBytes + PAD_HEADER_BYTES;
  const mod = start % alignment;
  return mod === 0 ? 0 : alignment - mod;
}

/**
 * The archive of `entries`, in their order: each a local header, its `FB` padding and its data
 * (CRC-32 and sizes in the header, no data descriptor, time and date 0), then the central
 * directory and the end record.
 */
export function storedZip(entries: readonly ZipEntry[], alignment = 64): Buffer {
  const parts: Buffer[] = [];
  const central: Buffer[] = [];
  let cursor = 0;
  for (const e of entries) {
    if (!/^[\x20-\x7e]+$/.test(e.name)) throw new RangeError(`zip entry name ${JSON.stringify(e.name)} is not ASCII`);
    const name = Buffer.from(e.name, 'latin1');
    const pad = paddingFor(cursor, name.length, alignment);
    const extra = Buffer.alloc(PAD_HEADER_BYTES + pad, 'Z');
    extra.write('FB', 0, 'latin1');
    extra.writeUInt16LE(pad, 2);
    const crc = crc32(e.data);
    const local = Buffer.alloc(LOCAL_HEADER_BYTES);
    local.writeUInt32LE(LOCAL_HEADER, 0);
    local.writeUInt16LE(VERSION, 4);
    // flags, method (stored), time, date: 0
    local.writeUInt32LE(crc, 14);
    local.writeUInt32LE(e.data.length, 18);
    local.writeUInt32LE(e.data.length, 22);
    local.writeUInt16LE(name.length, 26);
    local.writeUInt16LE(extra.length, 28);
    const head = Buffer.alloc(CENTRAL_HEADER_BYTES);
    head.writeUInt32LE(CENTRAL_HEADER, 0);
    head.writeUInt16LE(VERSION, 4);
    head.writeUInt16LE(VERSION, 6);
    head.writeUInt32LE(crc, 16);
    head.writeUInt32LE(e.data.length, 20);
    head.writeUInt32LE(e.data.length, 24);
    head.writeUInt16LE(name.length, 28);
    // extra, comment, disk, attributes: 0
    head.writeUInt32LE(cursor, 42);
    central.push(head, name);
    parts.push(local, name, extra, Buffer.from(e.data.buffer, e.data.byteOffset, e.data.byteLength));
    cursor += LOCAL_HEADER_BYTES + name.length + extra.length + e.data.length;
    if (cursor > MAX_ZIP32) throw new RangeError(`zip archive over ${MAX_ZIP32} bytes needs zip64, not written here`);
  }
  const centralBytes = central.reduce((n, b) => n + b.length, 0);
  const end = Buffer.alloc(END_BYTES);
  end.writeUInt32LE(END_OF_CENTRAL_DIRECTORY, 0);
  end.writeUInt16LE(entries.length, 8);
  end.writeUInt16LE(entries.length, 10);
  end.writeUInt32LE(centralBytes, 12);
  end.writeUInt32LE(cursor, 16);
  return Buffer.concat([...parts, ...central, end]);
}
