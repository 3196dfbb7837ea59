/** Rows of a parquet source file, read a row group at a time through a file handle. */
import { open, type FileHandle } from 'node:fs/promises';
import { parquetMetadataAsync, parquetReadObjects, type AsyncBuffer, type FileMetaData } from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { errorMessage } from '../../shared/errors.js';
import { SourceError, type RawRow } from './source-raw.js';

/** An AsyncBuffer over an open file: each slice is one positioned read, so only what a row group needs is in memory. */
function fileBuffer(fh: FileHandle, byteLength: number): AsyncBuffer {
  return {
    byteLength,
    async slice(start: number, end?: number): Promise<ArrayBuffer> {
      const stop = Math.min(end ?? byteLength, byteLength);
      const length = Math.max(0, stop - start);
      const out = new ArrayBuffer(length);
      let done = 0;
      while (done < length) {
        const { bytesRead } = await fh.read(new Uint8Array(out, done, length - done), 0, length - done, start + done);
        if (bytesRead === 0) throw new Error(`unexpected end of file at byte ${start + done} (size ${byteLength})`);
        done += bytesRead;
      }
      return out;
    },
  };
}

/**
 * The rows of a parquet file as plain objects (nested lists and structs as arrays and objects,
 * 64-bit integers as bigints), a row group at a time: memory holds one row group's rows, so a
 * file written with huge row groups costs as much. Any codec of hyparquet-compressors is read
 * (snappy, zstd, gzip, brotli, lz4). A file that cannot be read throws a {@link SourceError}
 * naming it.
 */
export async function* readParquetRows(file: string): AsyncGenerator<RawRow> {
  let fh: FileHandle;
  try {
    fh = await open(file, 'r');
  } catch (e: unknown) {
    throw new SourceError(`cannot open ${file}: ${errorMessage(e)}`, { cause: e });
  }
  try {
    const buffer = fileBuffer(fh, (await fh.stat()).size);
    let metadata: FileMetaData;
    try {
      metadata = await parquetMetadataAsync(buffer);
    } catch (e: unknown) {
      throw new SourceError(`${file} is not a readable parquet file: ${errorMessage(e)}`, { cause: e });
    }
    let row = 0;
    for (const [g, group] of metadata.row_groups.entries()) {
      const rows = Number(group.num_rows);
      let objects: Record<string, unknown>[];
      try {
        objects = await parquetReadObjects({ file: buffer, metadata, rowStart: row, rowEnd: row + rows, compressors });
      } catch (e: unknown) {
        throw new SourceError(`cannot read row group ${g} (rows ${row}..${row + rows - 1}) of ${file}: ${errorMessage(e)}`, { cause: e });
      }
      for (const value of objects) {
        yield { ok: true, value, where: { file, row } };
        row += 1;
      }
    }
  } finally {
    await fh.close();
  }
}
