/** Rows of a parquet source file, read a row group at a time through a file handle. */
import { open, type FileHandle } from 'node:fs/promises';
import {
  parquetMetadataAsync,
  parquetReadObjects,
  parquetSchema,
  type AsyncBuffer,
  type FileMetaData,
} from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { errorMessage } from '../../shared/index.js';
import { SourceError, type RawReadOptions, type RawRow } from './source-raw.js';

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
 * 64-bit integers as bigints), of the wanted columns when the file has them, a row group at a
 * time: memory holds one row group's rows, so a file written with huge row groups costs as
 * much. Any codec of hyparquet-compressors is read
 * (snappy, zstd, gzip, brotli, lz4). A file that cannot be read throws a {@link SourceError}
 * naming it.
 */
export async function* readParquetRows(file: string, options: RawReadOptions = {}): AsyncGenerator<RawRow> {
  const maxRows = options.maxRows ?? Infinity;
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
    const columns = projection(metadata, options.columns);
    let row = 0;
    for (const [g, group] of metadata.row_groups.entries()) {
      if (row >= maxRows) break;
      const rows = Math.min(Number(group.num_rows), maxRows - row);
      let objects: Record<string, unknown>[];
      try {
        objects = await parquetReadObjects({
          file: buffer,
          metadata,
          rowStart: row,
          rowEnd: row + rows,
          compressors,
          ...(columns === undefined ? {} : { columns }),
        });
      } catch (e: unknown) {
        throw new SourceError(
          `cannot read row group ${g} (rows ${row}..${row + rows - 1}) of ${file}: ${errorMessage(e)}`,
          { cause: e },
        );
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

/** The top-level columns to read: the wanted ones the file has, or undefined (all) when it lacks a required one. */
function projection(metadata: FileMetaData, wanted: RawReadOptions['columns']): string[] | undefined {
  if (wanted === undefined) return undefined;
  const names = parquetSchema(metadata).children.map((c) => c.element.name);
  if (!wanted.required.every((c) => names.includes(c))) return undefined;
  const keep = new Set([...wanted.required, ...wanted.optional]);
  return names.filter((n) => keep.has(n));
}

/**
 * Row groups above this many bytes (uncompressed) are worth a note: each is held whole while its
 * rows are read, as JS objects about ten times its size (127 MiB took 1.27 GiB of RSS).
 */
export const LARGE_ROW_GROUP_BYTES = 64 * 2 ** 20;

/**
 * A note for each parquet file whose largest row group is above {@link LARGE_ROW_GROUP_BYTES}
 * (from the footers only): the memory a read of it takes, and how to write smaller ones.
 */
export async function largeRowGroupNotes(
  files: readonly string[],
  thresholdBytes = LARGE_ROW_GROUP_BYTES,
): Promise<string[]> {
  const notes: string[] = [];
  for (const file of files) {
    const fh = await open(file, 'r');
    try {
      const metadata = await parquetMetadataAsync(fileBuffer(fh, (await fh.stat()).size));
      const largest = metadata.row_groups.reduce((m, g) => Math.max(m, Number(g.total_byte_size)), 0);
      const rows = metadata.row_groups.reduce((m, g) => Math.max(m, Number(g.num_rows)), 0);
      if (largest > thresholdBytes) {
        notes.push(
          `${file}: row groups of up to ${rows} rows and ${(largest / 2 ** 20).toFixed(0)} MiB uncompressed; each is read whole, taking about ten times that in memory (rewrite it with smaller row groups, e.g. pyarrow.parquet.write_table(..., row_group_size=1000), to read it in less)`,
        );
      }
    } catch (e: unknown) {
      throw new SourceError(`${file} is not a readable parquet file: ${errorMessage(e)}`, { cause: e });
    } finally {
      await fh.close();
    }
  }
  return notes;
}
