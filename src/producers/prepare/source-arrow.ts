/** Rows of a `datasets` `save_to_disk` shard (an Arrow IPC stream), batch by batch. */
import { errorMessage } from '../../shared/index.js';
import { batchRows, readShardBatches } from '../../shared/index.js';
import { columnsOfSchema } from '../../shared/index.js';
import { SourceError, type RawRow } from './source-raw.js';

/**
 * The rows of one Arrow IPC stream shard as plain objects (lists and structs as arrays and
 * objects), a record batch at a time. A shard that cannot be read throws a {@link SourceError}
 * naming it.
 */
export async function* readArrowRows(file: string): AsyncGenerator<RawRow> {
  let row = 0;
  try {
    for await (const batch of readShardBatches(file)) {
      for (const value of batchRows(batch, columnsOfSchema(batch.schema))) {
        yield { ok: true, value, where: { file, row } };
        row += 1;
      }
    }
  } catch (e: unknown) {
    if (e instanceof SourceError) throw e;
    throw new SourceError(`cannot read ${file} (row ${row}): ${errorMessage(e)}`, { cause: e });
  }
}
