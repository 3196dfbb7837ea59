/**
 * `torch.save(d, path)` of a `dict[int, int]`, written without Python: the zip archive of
 * PyTorch's format (torch-zip.ts) holding the records `torch.save` writes for an object without
 * tensors, in its order: `data.pkl` (the pickle, torch-pickle.ts), `.format_version` (`1`),
 * `.storage_alignment` (`64`), `byteorder` (`little`), `version` (`3\n`) and
 * `.data/serialization_id`, all under one folder named after the file (`token_freq.pt` →
 * `token_freq/`). `torch.load(path, weights_only=True)` gives the dict back.
 */
import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';
import path from 'node:path';

import { pickleIntDict } from './torch-pickle.js';
import { storedZip, type ZipEntry } from './torch-zip.js';

/** The alignment of stored data that torch writes and records (`.storage_alignment`). */
const STORAGE_ALIGNMENT = 64;
/** The file format version torch 2.x writes (`version` record). */
const FILE_FORMAT_VERSION = '3\n';

/** The folder inside the archive: the file name without its extension, as torch names it. */
export function archiveNameOf(file: string): string {
  const base = path.basename(file);
  const dot = base.lastIndexOf('.');
  const name = dot > 0 ? base.slice(0, dot) : base;
  // Zip entry names are ASCII here; anything else becomes `_` (torch.load reads any prefix).
  return name.replace(/[^\x20-\x7e]|\//g, '_') || 'archive';
}

/**
 * The 40 decimal digits of `.data/serialization_id`. torch derives its own from what it wrote;
 * this one is a digest of the pickle, so the same dict always gives the same file.
 */
function serializationId(pickle: Uint8Array): string {
  const digest = BigInt(`0x${createHash('sha256').update(pickle).digest('hex')}`);
  return (digest % 10n ** 40n).toString().padStart(40, '0');
}

/** The bytes of `torch.save(dict(entries))` to a file whose archive folder is `archiveName`. */
export function torchSaveIntDictBytes(
  entries: Iterable<readonly [number, number]> | ReadonlyMap<number, number>,
  archiveName: string,
): Buffer {
  const pickle = pickleIntDict(entries);
  const text = (s: string): Uint8Array => Buffer.from(s, 'latin1');
  const records: ZipEntry[] = [
    { name: 'data.pkl', data: pickle },
    { name: '.format_version', data: text('1') },
    { name: '.storage_alignment', data: text(String(STORAGE_ALIGNMENT)) },
    { name: 'byteorder', data: text('little') },
    { name: 'version', data: text(FILE_FORMAT_VERSION) },
    { name: '.data/serialization_id', data: text(serializationId(pickle)) },
  ];
  return storedZip(
    records.map((r) => ({ name: `${archiveName}/${r.name}`, data: r.data })),
    STORAGE_ALIGNMENT,
  );
}

/**
 * Writes `torch.save(dict(entries), file)` to `file` (created exclusively, so it never
 * overwrites) and fsyncs it. Keys and values are integers; the dict keeps their order.
 */
export async function torchSaveIntDict(
  file: string,
  entries: Iterable<readonly [number, number]> | ReadonlyMap<number, number>,
): Promise<number> {
  const bytes = torchSaveIntDictBytes(entries, archiveNameOf(file));
  const fh = await open(file, 'wx');
  try {
    await fh.writeFile(bytes);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return bytes.length;
}
