/**
 * `openSource`: a dataset's `source` opened for `tokenmill prepare`: its files listed, its
 * format resolved (detected from the first rows for `auto`), its rows streamed as chat turns.
 */
import { isRecord, type PromptSource } from '../../shared/index.js';
import { readArrowRows } from './source-arrow.js';
import { SAMPLE_ROWS, resolveLayout, type SampleRow } from './source-detect.js';
import { listSourceFiles, type SourceFileKind } from './source-files.js';
import { convertRow, wantedColumns, type SourceLayout } from './source-formats.js';
import { readJsonRows } from './source-json.js';
import { readJsonlRows } from './source-jsonl.js';
import { largeRowGroupNotes, readParquetRows } from './source-parquet.js';
import { SourceError, describeWhere, type RawRow, type RawRowReader } from './source-raw.js';
import type { OpenedSource, SourceRow } from './source-types.js';

export { SourceError } from './source-raw.js';

const READERS: Readonly<Record<SourceFileKind, RawRowReader>> = {
  jsonl: readJsonlRows,
  json: readJsonRows,
  parquet: readParquetRows,
  arrow: readArrowRows,
};

/**
 * Opens a source: lists its files, reads its first rows to resolve the format and returns the
 * rows, streamed. Throws a {@link SourceError} when the source cannot be read or its format
 * cannot be detected (naming the path, the columns seen and what to set); a row that does not
 * fit the format is a malformed row, never an error.
 */
export async function openSource(source: PromptSource): Promise<OpenedSource> {
  const listed = await listSourceFiles(source.path);
  const read = READERS[listed.kind];
  const describe = `source ${source.path}`;
  const samples = await sampleRows(listed.files, read);
  if (source.format === 'auto' && samples.ok.length === 0 && samples.bad !== undefined) {
    throw new SourceError(
      `${describe}: cannot detect the format: no readable row in the first ${SAMPLE_ROWS} (${describeWhere(samples.bad.where)}: ${samples.bad.reason})`,
    );
  }
  const { layout, detectedFrom } = resolveLayout(source, samples.ok, describe);
  const files = listed.files;
  const opened: OpenedSource = {
    files,
    format: layout.format,
    rows: () => convertedRows(files, read, layout),
  };
  if (detectedFrom !== undefined) opened.detectedFrom = detectedFrom;
  const notes = [...listed.notes, ...(listed.kind === 'parquet' ? await largeRowGroupNotes(files) : [])];
  if (notes.length > 0) opened.notes = notes;
  return opened;
}

/** The object rows among the first {@link SAMPLE_ROWS} of the files, and the first row that could not be read. */
async function sampleRows(
  files: readonly string[],
  read: RawRowReader,
): Promise<{ ok: SampleRow[]; bad?: Extract<RawRow, { ok: false }> }> {
  const ok: SampleRow[] = [];
  let bad: Extract<RawRow, { ok: false }> | undefined;
  let seen = 0;
  for (const file of files) {
    for await (const r of read(file, { maxRows: SAMPLE_ROWS - seen })) {
      if (r.ok && isRecord(r.value)) ok.push({ value: r.value, where: r.where });
      else if (!r.ok) bad ??= r;
      if (++seen >= SAMPLE_ROWS) break;
    }
    if (seen >= SAMPLE_ROWS) break;
  }
  return bad === undefined ? { ok } : { ok, bad };
}

async function* convertedRows(
  files: readonly string[],
  read: RawRowReader,
  layout: SourceLayout,
): AsyncGenerator<SourceRow> {
  const columns = wantedColumns(layout);
  for (const file of files) {
    for await (const r of read(file, { columns })) {
      if (!r.ok) {
        yield r;
        continue;
      }
      const c = convertRow(r.value, layout);
      if (c.ok) {
        const { ok, ...row } = c;
        yield { ok, ...row, where: r.where };
      } else
        yield c.excerpt === undefined
          ? { ok: false, reason: c.reason, where: r.where }
          : { ok: false, reason: c.reason, where: r.where, excerpt: c.excerpt };
    }
  }
}
