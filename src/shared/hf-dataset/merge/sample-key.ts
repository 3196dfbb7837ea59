// Which rows a training dataset already holds is known by their sample key: the `dataset` and
// `id` columns. A target without them (e.g. SpecForge's pre-tokenized `{input_ids, loss_mask}`
// made by Python) cannot be told apart from the new rows: every round would append the same rows
// again, and ids matched across datasets would skip new rows. Such a target is refused, with the
// way out in the message.
import path from 'node:path';

import { exists } from '../../util/index.js';
import { DatasetMergeError } from './common.js';
import { readDatasetMeta, readShardSchema } from '../reader.js';
import { columnsOfSchema, type ColumnSpec } from '../schema.js';

/** The columns that identify a sample in the training dataset. */
export const SAMPLE_KEY_COLUMNS = ['dataset', 'id'] as const;

/**
 * Why rows of a target with `columns` cannot be matched with new rows (names the missing key
 * columns and the fix), or undefined when it has every key column as a string.
 */
export function sampleKeyProblem(target: string, columns: readonly ColumnSpec[]): string | undefined {
  const byName = new Map(columns.map((c) => [c.name, c]));
  const missing = SAMPLE_KEY_COLUMNS.filter((k) => byName.get(k)?.type.kind !== 'string');
  if (missing.length === 0) return undefined;
  const what = missing.map((k) => (byName.has(k) ? `a string column ${k}` : `no column ${k}`)).join(' and ');
  const adds = missing
    .map((k) => `.add_column("${k}", ${k === 'id' ? '[str(i) for i in range(len(ds))]' : '["<name>"] * len(ds)'})`)
    .join('');
  return (
    `cannot merge into ${target}: it has ${what}, so its rows cannot be matched with the new ones ` +
    `(each round would add rows it already holds again, or skip new rows whose id another dataset uses). ` +
    `Give its rows a sample key in Python — ds = datasets.load_from_disk(OLD); ds = ds${adds}; ds.save_to_disk(NEW) — ` +
    `with a <name> no tokenmill dataset uses, then point postprocess.target at NEW; ` +
    `or merge into a new target folder and concatenate the two at training time`
  );
}

/**
 * Throws {@link DatasetMergeError} (see {@link sampleKeyProblem}) when the dataset at `target`
 * lacks a sample-key column. A folder without state.json (no target yet) passes.
 */
export async function assertSampleKeyedTarget(target: string): Promise<void> {
  if (!(await exists(path.join(target, 'state.json')))) return;
  const meta = await readDatasetMeta(target);
  const first = meta.shards[0];
  if (first === undefined) return;
  const problem = sampleKeyProblem(target, columnsOfSchema(await readShardSchema(path.join(target, first))));
  if (problem !== undefined) throw new DatasetMergeError(problem, { problems: [problem] });
}
