// Planning the merged schema and writing (or linking) the new shards into the staging folder.
import path from 'node:path';

import type { RecordBatch } from 'apache-arrow';

import { fsyncDir, linkOrCopy } from '../../util/index.js';
import { DatasetMergeError, type MergeOptions } from './common.js';
import {
  batchRowReader,
  readDatasetMeta,
  readHfDataset,
  readShardSchema,
  scanShard,
  type DatasetMeta,
} from '../reader.js';
import {
  REQUIRED_COLUMNS,
  cannotHold,
  columnsOfSchema,
  defaultColumns,
  isRowColumn,
  sameColumns,
  sameType,
  shardName,
  typeString,
  type ColumnSpec,
  type DatasetState,
  type HfRow,
} from '../schema.js';
import { shardSizeBytes, writeShards, type RowRecord, type RowSource, type SampledRow } from '../writer.js';

export interface SourcePlan {
  kind: 'rows' | 'staged';
  columns: ColumnSpec[];
  staged?: DatasetMeta;
}

/**
 * The columns of the merged dataset: the target's, in its order and with its types. Every
 * target column must be filled from the new rows with a type that holds their values (new
 * int32 ids are written as int64 into an int64 target); a target column the new rows lack is
 * refused, as is a missing required column (input_ids, loss_mask), each with a message naming
 * the column and both types. Columns of the new rows the target lacks are left out (`dropped`).
 * `source` is `rows` for {@link HfRow}s (typed as {@link defaultColumns}) or `staged` for a
 * folder, whose values are only converted between columns of the same kind.
 */
export function planMergeColumns(
  targetColumns: readonly ColumnSpec[],
  sourceColumns: readonly ColumnSpec[],
  source: 'rows' | 'staged' = 'rows',
): { columns: ColumnSpec[]; dropped: string[]; problems: string[] } {
  const problems: string[] = [];
  const byName = new Map(sourceColumns.map((c) => [c.name, c]));
  const targetNames = new Set(targetColumns.map((c) => c.name));
  for (const req of REQUIRED_COLUMNS) {
    if (!targetNames.has(req)) problems.push(`cannot merge: the target has no column ${req}`);
  }
  for (const t of targetColumns) {
    const s = byName.get(t.name);
    if (s === undefined) {
      problems.push(`cannot merge: the target has column ${t.name} (${typeString(t.type)}) but the new rows do not`);
      continue;
    }
    let why: string | undefined;
    if (isRowColumn(t.name)) {
      why = cannotHold(t.name, t.type);
      if (why === undefined && source === 'staged' && s.type.kind !== t.type.kind) why = 'different kinds of column';
    } else if (!sameType(t.type, s.type)) {
      why = 'different types';
    }
    if (why !== undefined) {
      problems.push(
        `cannot merge: column ${t.name} is ${typeString(t.type)} in the target but ${typeString(s.type)} in the new rows (${why})`,
      );
    }
  }
  const dropped = sourceColumns.filter((c) => !targetNames.has(c.name)).map((c) => c.name);
  return { columns: targetColumns.map((c) => ({ ...c })), dropped, problems };
}

export interface NewPart {
  files: string[];
  rows: number;
  tokens: number;
  supervisedTokens: number;
  samples: SampledRow[];
  linked: number;
  copied: number;
}

/** state.json keys in the order `datasets` writes them (sorted). */
export function sortStateKeys(s: DatasetState): DatasetState {
  return Object.fromEntries(
    Object.keys(s)
      .sort()
      .map((k) => [k, (s as Record<string, unknown>)[k]]),
  ) as DatasetState;
}

export async function planSource(opts: MergeOptions): Promise<SourcePlan> {
  const src = opts.newRows;
  if (typeof src === 'object' && src !== null && 'stagedDir' in src) {
    const staged = await readDatasetMeta(src.stagedDir);
    const first = staged.shards[0];
    const columns =
      first === undefined
        ? defaultColumns(opts)
        : columnsOfSchema(await readShardSchema(path.join(src.stagedDir, first)));
    return { kind: 'staged', columns, staged };
  }
  return { kind: 'rows', columns: defaultColumns(opts) };
}

/** Writes (or links) the new shards into `staging`, named after their place in the merged dataset. */
export async function stageNewShards(
  staging: string,
  opts: MergeOptions,
  source: SourcePlan,
  columns: ColumnSpec[],
  oldCount: number,
  taken: Set<string>,
  mergeId: string,
): Promise<NewPart> {
  const nameShard = (i: number, n: number): string => {
    const name = shardName(oldCount + i, oldCount + n);
    return taken.has(name) ? name.replace(/\.arrow$/, `-${mergeId}.arrow`) : name;
  };
  const sampleSize = opts.sampleSize ?? 16;
  const random = opts.random ?? Math.random;
  const bytes = shardSizeBytes(opts.shardSizeMiB);
  if (source.kind === 'staged' && source.staged !== undefined) {
    const staged = source.staged;
    const stagedColumns = source.columns;
    if (sameColumns(stagedColumns, columns)) {
      // Same schema: reuse the staged shards as they are (hard links), reading them once for
      // their statistics and a sample to compare after the merge.
      const part: NewPart = { files: [], rows: 0, tokens: 0, supervisedTokens: 0, samples: [], linked: 0, copied: 0 };
      const reservoir = new Reservoir(sampleSize, random);
      for (const [i, s] of staged.shards.entries()) {
        const from = path.join(staged.dir, s);
        const scan = await scanShard(from, (batch, cols, firstRow) =>
          reservoir.offerBatch(batch, cols, part.rows + firstRow),
        );
        if (scan.problems.length > 0)
          throw new DatasetMergeError(`the staged rows are not sound:\n  ${scan.problems.join('\n  ')}`, {
            problems: scan.problems,
          });
        part.rows += scan.rows;
        part.tokens += scan.tokens;
        part.supervisedTokens += scan.supervisedTokens;
        const name = nameShard(i, staged.shards.length);
        if ((await linkOrCopy(from, path.join(staging, name))) === 'link') part.linked++;
        else part.copied++;
        part.files.push(name);
      }
      await fsyncDir(staging);
      part.samples = reservoir.sorted();
      return part;
    }
    const ds = await readHfDataset(staged.dir);
    const written = await writeShards(staging, ds.rows(), {
      columns,
      shardSizeBytes: bytes,
      nameShard,
      sampleSize,
      random,
    });
    return { ...written, linked: 0, copied: 0 };
  }
  const written = await writeShards(staging, opts.newRows as RowSource<HfRow>, {
    columns,
    shardSizeBytes: bytes,
    nameShard,
    sampleSize,
    random,
  });
  return { ...written, linked: 0, copied: 0 };
}

/** Uniform sample of rows over batches, materializing only the rows kept. */
export class Reservoir {
  private readonly kept: SampledRow[] = [];
  private seen = 0;

  constructor(
    private readonly size: number,
    private readonly random: () => number,
  ) {}

  offerBatch(batch: RecordBatch, columns: ColumnSpec[], firstIndex: number): void {
    if (this.size <= 0) return;
    let read: ((i: number) => RowRecord) | undefined;
    for (let i = 0; i < batch.numRows; i++) {
      const k = this.seen++;
      let slot = -1;
      if (k < this.size) slot = k;
      else {
        const j = Math.floor(this.random() * (k + 1));
        if (j < this.size) slot = j;
      }
      if (slot < 0) continue;
      read ??= batchRowReader(batch, columns);
      this.kept[slot] = { index: firstIndex + i, row: read(i) };
    }
  }

  sorted(): SampledRow[] {
    return [...this.kept].sort((a, b) => a.index - b.index);
  }
}
