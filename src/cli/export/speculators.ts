/**
 * `export --format speculators`: the training dataset (`postprocess.target`) as the folder that
 * vLLM speculators' `prepare-data` writes and `speculators train --data-path DIR` reads as it
 * is: a `datasets` folder of the columns `input_ids` (list<int64>), `loss_mask` (list<int64>)
 * and `seq_len` (int64) in torch format (state.json `_format_type: "torch"`, as prepare-data
 * saves it after `set_format("torch")`), and `token_freq.pt`, the `dict[token id → count]` of
 * the supervised tokens that speculators' `save_token_frequency_distribution` computes, from
 * which `speculators train --draft-vocab-size N` builds the draft vocabulary (d2t/t2d).
 *
 * Rows keep the training dataset's order. Rows without a supervised token are left out, as
 * prepare-data leaves them out. Nothing else goes in the folder: speculators globs it. Read
 * shard by shard and written through a staging folder beside the output, renamed into place
 * when complete (speculators-dir.ts).
 */
import { existsSync } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';

import {
  BUNDLED_TOKENIZER_MODEL,
  PayloadError,
  bundledTokenizerPath,
  formatInt,
  fsyncDir,
  jsonText,
  newDatasetInfo,
  newFingerprint,
  newState,
  readHfDataset,
  shardName,
  shardSizeBytes,
  writeFileAtomic,
  writeShards,
  type ColumnSpec,
  type DatasetState,
} from '../../shared/index.js';
import { formatDflashExport, type DflashExportStats, type DflashRows } from './dflash-rows.js';
import { cleanLeftovers, inspectOut, stagingDirOf, swapIntoPlace } from './speculators-dir.js';
import { torchSaveIntDict } from './torch-save.js';

/** The columns of prepare-data's output, in its order and types. */
export const SPECULATORS_COLUMNS: readonly ColumnSpec[] = [
  { name: 'input_ids', type: { kind: 'list', large: false, item: 'int64' } },
  { name: 'loss_mask', type: { kind: 'list', large: false, item: 'int64' } },
  { name: 'seq_len', type: { kind: 'int', int: 'int64' } },
];

/** The token-frequency file speculators train looks for in `--data-path`. */
export const TOKEN_FREQ_FILE = 'token_freq.pt';

/** Token ids above this are refused: the counts are an array indexed by id. */
const MAX_TOKEN_ID = 2 ** 26;

/** Options of {@link exportSpeculators}. */
export interface SpeculatorsExportOptions {
  /** The training dataset folder. */
  target: string;
  /** The folder to write (replaced when it holds an earlier export). */
  out: string;
  /** Only rows of these datasets (the `dataset` column); all when absent or empty. */
  datasets?: readonly string[] | undefined;
  /** Largest shard size (MiB). */
  shardSizeMiB: number;
  /** `--drafter dflash`: only the rows a DFlash trainer can use (dflash-rows.ts). */
  dflash?: DflashRows | undefined;
}

/** What the speculators export wrote. */
export interface SpeculatorsExportStats {
  out: string;
  target: string;
  /** Rows read from the training dataset. */
  rows: number;
  /** Rows written. */
  exported: number;
  /** Rows left out because no token of theirs is supervised (prepare-data drops them too). */
  unsupervised: number;
  /** Rows left out by `--dataset`. */
  otherDatasets: number;
  /** Rows written per dataset (`""` when the target has no `dataset` column). */
  byDataset: Record<string, number>;
  tokens: number;
  supervisedTokens: number;
  /** Distinct token ids among the supervised tokens: the keys of token_freq.pt. */
  distinctSupervisedIds: number;
  /** The longest row written: what `--total-seq-len` must be at least to train on whole rows. */
  longest: { tokens: number; id: string; dataset: string } | null;
  shards: string[];
  bytes: number;
  /** Whether an earlier export was replaced, and the speculators caches dropped with it. */
  replaced: boolean;
  droppedCaches: string[];
  /** With `--drafter dflash`: the rows left out for it, the anchor positions per row, the mask token checked. */
  dflash?: DflashExportStats;
}

/**
 * Supervised-token counts in the order speculators' `save_token_frequency_distribution` builds
 * its dict: row by row, each row's new ids in ascending order (it adds `unique()` of the row).
 */
class TokenCounts {
  #counts = new Float64Array(1 << 17);
  #order: number[] = [];
  #rowNew: number[] = [];

  /** Adds one row's supervised ids; returns how many there were. */
  addRow(ids: readonly number[], mask: readonly number[], where: () => string): number {
    let supervised = 0;
    for (let i = 0; i < ids.length; i++) {
      if (mask[i] !== 1) continue;
      const id = ids[i] as number;
      if (!Number.isInteger(id) || id < 0 || id > MAX_TOKEN_ID)
        throw new PayloadError(`${where()}: input_ids[${i}] is ${String(id)}, not a token id in 0..${MAX_TOKEN_ID}`);
      if (id >= this.#counts.length) this.#grow(id);
      if (this.#counts[id] === 0) this.#rowNew.push(id);
      this.#counts[id] = (this.#counts[id] as number) + 1;
      supervised++;
    }
    if (this.#rowNew.length > 0) {
      this.#rowNew.sort((a, b) => a - b);
      for (const id of this.#rowNew) this.#order.push(id);
      this.#rowNew.length = 0;
    }
    return supervised;
  }

  #grow(id: number): void {
    let cap = this.#counts.length;
    while (cap <= id) cap *= 2;
    const next = new Float64Array(cap);
    next.set(this.#counts);
    this.#counts = next;
  }

  get distinct(): number {
    return this.#order.length;
  }

  *entries(): Generator<[number, number]> {
    for (const id of this.#order) yield [id, this.#counts[id] as number];
  }
}

/** state.json as prepare-data's `save_to_disk` leaves it: torch format over the three columns. */
function speculatorsState(files: readonly string[]): DatasetState {
  return {
    ...newState(files, newFingerprint()),
    _format_columns: SPECULATORS_COLUMNS.map((c) => c.name),
    _format_type: 'torch',
  };
}

/** Writes the speculators training folder at `opts.out` from the training dataset `opts.target`. */
export async function exportSpeculators(opts: SpeculatorsExportOptions): Promise<SpeculatorsExportStats> {
  const out = path.resolve(opts.out);
  const target = path.resolve(opts.target);
  const rel = path.relative(target, out);
  if (rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel))) {
    throw new PayloadError(`--out ${out} is the training dataset (${target}) or inside it; choose another folder`);
  }
  const ds = await readHfDataset(target);
  const columns = ds.columns.map((c) => c.name);
  for (const need of ['input_ids', 'loss_mask']) {
    const col = ds.columns.find((c) => c.name === need);
    if (col?.type.kind !== 'list') {
      throw new PayloadError(
        `${target} has no list column "${need}" (columns: ${columns.join(', ')}): not a training dataset`,
      );
    }
  }
  const wanted = opts.datasets === undefined || opts.datasets.length === 0 ? undefined : new Set(opts.datasets);
  if (wanted !== undefined && !columns.includes('dataset')) {
    throw new PayloadError(
      `${target} has no "dataset" column (columns: ${columns.join(', ')}): --dataset cannot choose rows of it`,
    );
  }

  await cleanLeftovers(out);
  // Refused before any row is read when the folder holds something else.
  await inspectOut(out);
  const staging = stagingDirOf(out);
  await rm(staging, { recursive: true, force: true });
  await mkdir(staging, { recursive: true });

  const counts = new TokenCounts();
  const stats: SpeculatorsExportStats = {
    out,
    target,
    rows: 0,
    exported: 0,
    unsupervised: 0,
    otherDatasets: 0,
    byDataset: {},
    tokens: 0,
    supervisedTokens: 0,
    distinctSupervisedIds: 0,
    longest: null,
    shards: [],
    bytes: 0,
    replaced: false,
    droppedCaches: [],
  };
  async function* rows(): AsyncGenerator<Record<string, unknown>> {
    for await (const row of ds.rows()) {
      const index = stats.rows++;
      const dataset = typeof row['dataset'] === 'string' ? row['dataset'] : '';
      if (wanted !== undefined && !wanted.has(dataset)) {
        stats.otherDatasets++;
        continue;
      }
      const id = typeof row['id'] === 'string' ? row['id'] : '';
      const where = (): string => `${target}: row ${index}${id === '' ? '' : ` (id ${JSON.stringify(id)})`}`;
      const ids = row['input_ids'];
      const mask = row['loss_mask'];
      if (!Array.isArray(ids) || !Array.isArray(mask))
        throw new PayloadError(`${where()}: input_ids or loss_mask is null`);
      if (ids.length !== mask.length)
        throw new PayloadError(`${where()}: loss_mask has ${mask.length} values but input_ids has ${ids.length}`);
      const rowName = (): string => `row ${index}${id === '' ? '' : ` (id ${JSON.stringify(id)})`}`;
      if (opts.dflash !== undefined && !opts.dflash.admit(ids as number[], mask as number[], rowName)) continue;
      const supervised = counts.addRow(ids as number[], mask as number[], where);
      if (supervised === 0) {
        stats.unsupervised++;
        continue;
      }
      stats.exported++;
      stats.byDataset[dataset] = (stats.byDataset[dataset] ?? 0) + 1;
      stats.tokens += ids.length;
      stats.supervisedTokens += supervised;
      if (stats.longest === null || ids.length > stats.longest.tokens)
        stats.longest = { tokens: ids.length, id, dataset };
      yield { input_ids: ids, loss_mask: mask, seq_len: ids.length };
    }
  }

  try {
    const written = await writeShards(staging, rows(), {
      columns: SPECULATORS_COLUMNS,
      shardSizeBytes: shardSizeBytes(opts.shardSizeMiB),
      nameShard: shardName,
      emptyShard: true,
    });
    if (stats.exported === 0) {
      const leftOut = opts.dflash?.leftOut ?? 0;
      const why = [
        `${stats.rows} rows read`,
        ...(stats.unsupervised > 0 ? [`${stats.unsupervised} without a supervised token`] : []),
        ...(leftOut > 0 ? [`${leftOut} with fewer than 2 adjacent supervised tokens (--drafter dflash)`] : []),
        ...(wanted === undefined ? [] : [`${stats.otherDatasets} of other datasets than --dataset`]),
      ];
      throw new PayloadError(`nothing to export from ${target}: ${why.join(', ')}`);
    }
    if (opts.dflash !== undefined) stats.dflash = opts.dflash.finish(target);
    stats.shards = written.files;
    stats.distinctSupervisedIds = counts.distinct;
    stats.bytes = written.bytes;
    await writeFileAtomic(path.join(staging, 'dataset_info.json'), jsonText(newDatasetInfo(SPECULATORS_COLUMNS)));
    await writeFileAtomic(path.join(staging, 'state.json'), jsonText(speculatorsState(written.files)));
    stats.bytes += await torchSaveIntDict(path.join(staging, TOKEN_FREQ_FILE), counts.entries());
    await fsyncDir(staging);
    // Looked at again: the folder may have changed while the rows were written.
    const now = await inspectOut(out);
    await swapIntoPlace(staging, out, now);
    stats.replaced = now.kind === 'export';
    stats.droppedCaches = now.kind === 'export' ? now.caches : [];
  } catch (e: unknown) {
    await rm(staging, { recursive: true, force: true });
    throw e;
  }
  return stats;
}

/** The model `--verifier-name-or-path` names: the bundled tokenizer's model, a model folder, or a placeholder. */
export function verifierOf(tokenizerPath: string): string {
  if (path.resolve(tokenizerPath) === path.resolve(bundledTokenizerPath())) return BUNDLED_TOKENIZER_MODEL;
  return existsSync(path.join(tokenizerPath, 'config.json')) ? tokenizerPath : '<target model: HF id or folder>';
}

/** The draft vocabulary the suggested command asks for: 32000 (speculators' usual), or fewer ids when fewer were seen. */
const DRAFT_VOCAB = 32_000;

/** The `speculators train` command line for an export. */
export function speculatorsTrainCommand(stats: SpeculatorsExportStats, verifier: string): string {
  const quote = (s: string): string => (/^[\w./:@=+-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`);
  return [
    'speculators train',
    `--verifier-name-or-path ${quote(verifier)}`,
    `--data-path ${quote(stats.out)}`,
    `--total-seq-len ${stats.longest?.tokens ?? 0}`,
    `--draft-vocab-size ${Math.min(DRAFT_VOCAB, stats.distinctSupervisedIds)}`,
  ].join(' ');
}

/** The export's summary for people. */
export function formatSpeculatorsExport(stats: SpeculatorsExportStats, train: string): string {
  const lines = [
    `exported ${formatInt(stats.exported)} of ${formatInt(stats.rows)} rows of ${stats.target} to ${stats.out} (speculators training folder)`,
    `tokens: ${formatInt(stats.tokens)}, supervised ${formatInt(stats.supervisedTokens)}, ${formatInt(stats.distinctSupervisedIds)} distinct supervised token ids (${TOKEN_FREQ_FILE})`,
  ];
  if (stats.longest !== null) {
    const name = stats.longest.dataset === '' ? stats.longest.id : `${stats.longest.dataset}/${stats.longest.id}`;
    lines.push(
      `longest row: ${formatInt(stats.longest.tokens)} tokens (${name}); --total-seq-len below that cuts rows`,
    );
  }
  if (stats.unsupervised > 0)
    lines.push(
      `left out: ${formatInt(stats.unsupervised)} rows without a supervised token (prepare-data drops them too)`,
    );
  if (stats.otherDatasets > 0) lines.push(`left out: ${formatInt(stats.otherDatasets)} rows of other datasets`);
  if (stats.dflash !== undefined) lines.push(...formatDflashExport(stats.dflash));
  if (stats.replaced) {
    const caches =
      stats.droppedCaches.length === 0 ? '' : ` and its vocabulary caches (${stats.droppedCaches.join(', ')})`;
    lines.push(`replaced the earlier export${caches}`);
  }
  lines.push(`train: ${train}`);
  return lines.join('\n');
}
