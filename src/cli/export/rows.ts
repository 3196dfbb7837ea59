/**
 * `export --format jsonl`: the token rows of the training dataset (`postprocess.target`), one
 * JSON object a line with the dataset's columns (`{id, dataset, input_ids, loss_mask,
 * num_tokens, finish_reason}` for a dataset tokenmill made), read shard by shard and batch by
 * batch, so memory holds one record batch whatever the dataset's size.
 */
import { PayloadError, readHfDataset } from '../../shared/index.js';
import type { DflashExportStats, DflashRows } from './dflash-rows.js';
import type { AtomicJsonlWriter } from './file.js';

/** What the rows export wrote. */
export interface RowsExportStats {
  /** Rows read from the training dataset. */
  rows: number;
  /** Rows written (all, or those of the chosen datasets). */
  exported: number;
  /** Rows written per dataset (the `dataset` column; `""` when the target has none). */
  byDataset: Record<string, number>;
  tokens: number;
  columns: string[];
  /** With `--drafter dflash`: the rows left out for it, the anchor positions per row, the mask token checked. */
  dflash?: DflashExportStats;
}

/**
 * Writes the rows of the dataset folder `target` to `writer`; with `datasets`, only the rows
 * whose `dataset` column is one of them (a target without that column is then refused); with
 * `dflash`, only the rows a DFlash trainer can use (dflash-rows.ts).
 */
export async function exportRows(
  target: string,
  writer: AtomicJsonlWriter,
  datasets?: readonly string[],
  dflash?: DflashRows,
): Promise<RowsExportStats> {
  const ds = await readHfDataset(target);
  const columns = ds.columns.map((c) => c.name);
  const wanted = datasets === undefined || datasets.length === 0 ? undefined : new Set(datasets);
  if (wanted !== undefined && !columns.includes('dataset')) {
    throw new PayloadError(
      `${target} has no "dataset" column (columns: ${columns.join(', ')}): --dataset cannot choose rows of it`,
    );
  }
  const stats: RowsExportStats = { rows: 0, exported: 0, byDataset: {}, tokens: 0, columns };
  for await (const row of ds.rows()) {
    stats.rows += 1;
    const name = typeof row['dataset'] === 'string' ? row['dataset'] : '';
    if (wanted !== undefined && !wanted.has(name)) continue;
    if (dflash !== undefined) {
      const ids = row['input_ids'];
      const mask = row['loss_mask'];
      if (!Array.isArray(ids) || !Array.isArray(mask))
        throw new PayloadError(`${target}: row ${stats.rows - 1} has no input_ids or loss_mask list`);
      const id = typeof row['id'] === 'string' ? row['id'] : '';
      const index = stats.rows - 1;
      const rowName = (): string => `row ${index}${id === '' ? '' : ` (id ${JSON.stringify(id)})`}`;
      if (!dflash.admit(ids as number[], mask as number[], rowName)) continue;
    }
    await writer.write(row);
    stats.exported += 1;
    stats.byDataset[name] = (stats.byDataset[name] ?? 0) + 1;
    const ids = row['input_ids'];
    if (Array.isArray(ids)) stats.tokens += ids.length;
  }
  if (stats.exported === 0) {
    // Never "exit 0, wrote nothing": say why there is nothing.
    const why =
      stats.rows === 0
        ? 'it has no rows (were all generations left out, e.g. truncated without postprocess.keepTruncated?)'
        : dflash !== undefined && dflash.leftOut > 0
          ? `${dflash.leftOut} of its rows have fewer than 2 adjacent supervised tokens (--drafter dflash leaves them out) and no other row${wanted === undefined ? '' : ` of ${[...wanted].join(', ')}`} is left`
          : `none of its ${stats.rows} rows is of ${[...(wanted ?? [])].join(', ')}`;
    throw new PayloadError(`nothing to export from ${target}: ${why}`);
  }
  if (dflash !== undefined) stats.dflash = dflash.finish(target);
  return stats;
}
