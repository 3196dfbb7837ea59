// Validation of the complete merged folder before the swap; its result is the merge report.
import { hostname } from 'node:os';
import { stat } from 'node:fs/promises';
import path from 'node:path';

import { errorMessage } from '../../errors.js';
import type { MergeOptions, MergeReport, MergeSample } from './common.js';
import type { NewPart } from './stage.js';
import { ShardKeyCollector } from './id-index.js';
import { addAnchorHistograms, emptyAnchorHistogram, rowsWithoutAnchor } from '../anchor-positions.js';
import { batchRowReader, readDatasetMeta, scanShard, type ShardScan } from '../reader.js';
import { columnsString, sameColumns, type ColumnSpec } from '../schema.js';
import type { RowRecord } from '../writer.js';

export interface ValidateInput {
  staging: string;
  target: string;
  mergeId: string;
  firstMerge: boolean;
  columns: ColumnSpec[];
  dropped: string[];
  oldShards: string[];
  oldScans: ShardScan[];
  newPart: NewPart;
  /** Filled with each new shard's scan and sample keys (for its index file). */
  newScans?: Map<string, { scan: ShardScan; collector: ShardKeyCollector }>;
  warnings: string[];
  opts: MergeOptions;
  started: number;
}

export async function validateMerged(v: ValidateInput): Promise<MergeReport> {
  const problems: string[] = [];
  const { staging, newPart, oldScans } = v;
  const meta = await readDatasetMeta(staging);
  const expected = [...v.oldShards, ...newPart.files];
  if (meta.shards.join('\n') !== expected.join('\n')) {
    problems.push(
      `state.json lists ${meta.shards.length} shards, expected the ${v.oldShards.length} old ones then ${newPart.files.length} new ones`,
    );
  }

  // Old shards: a hard link is the same file that the index describes (the index checked its
  // size and time), so its counts and columns stand; a copy is read again and must match.
  let oldRows = 0;
  let oldTokens = 0;
  let oldSupervised = 0;
  let oldAnchors = emptyAnchorHistogram();
  for (const [i, s] of v.oldShards.entries()) {
    const before = oldScans[i] as ShardScan;
    oldRows += before.rows;
    oldTokens += before.tokens;
    oldSupervised += before.supervisedTokens;
    oldAnchors = addAnchorHistograms(oldAnchors, before.anchorPositions);
    const [a, b] = await Promise.all([stat(path.join(v.target, s)), stat(path.join(staging, s))]);
    if (a.ino === b.ino && a.dev === b.dev) {
      if (!sameColumns(before.columns, v.columns))
        problems.push(`${s}: schema (${columnsString(before.columns)}) differs from (${columnsString(v.columns)})`);
      continue;
    }
    const again = await scanShard(path.join(staging, s));
    if (
      again.rows !== before.rows ||
      again.tokens !== before.tokens ||
      again.supervisedTokens !== before.supervisedTokens
    ) {
      problems.push(`${s}: the copy in the merged folder differs from the original`);
    }
    if (!sameColumns(again.columns, v.columns))
      problems.push(`${s}: schema (${columnsString(again.columns)}) differs from (${columnsString(v.columns)})`);
  }

  // New shards: read back completely, sample rows captured on the way.
  const wanted = new Map(newPart.samples.map((s) => [s.index, s]));
  const readBack = new Map<number, RowRecord>();
  let newRowsRead = 0;
  let newTokensRead = 0;
  let newSupervisedRead = 0;
  let newAnchors = emptyAnchorHistogram();
  const mask = v.opts.dflashMaskToken;
  const maskRows: number[] = [];
  let maskRowCount = 0;
  for (const f of newPart.files) {
    const base = newRowsRead;
    const collector = new ShardKeyCollector();
    const scan = await scanShard(
      path.join(staging, f),
      (batch, cols, firstRow) => {
        collector.addBatch(batch);
        let read: ((i: number) => RowRecord) | undefined;
        for (let i = 0; i < batch.numRows; i++) {
          const idx = base + firstRow + i;
          if (!wanted.has(idx)) continue;
          read ??= batchRowReader(batch, cols);
          readBack.set(idx, read(i));
        }
      },
      mask === undefined ? {} : { findTokenId: mask.id },
    );
    newAnchors = addAnchorHistograms(newAnchors, scan.anchorPositions);
    if (scan.withToken !== undefined) {
      maskRowCount += scan.withToken.rows;
      for (const r of scan.withToken.first) if (maskRows.length < 5) maskRows.push(oldRows + base + r);
    }
    v.newScans?.set(f, { scan, collector });
    problems.push(...scan.problems);
    if (!sameColumns(scan.columns, v.columns))
      problems.push(`${f}: schema (${columnsString(scan.columns)}) differs from (${columnsString(v.columns)})`);
    newRowsRead += scan.rows;
    newTokensRead += scan.tokens;
    newSupervisedRead += scan.supervisedTokens;
  }

  const rows = oldRows + newRowsRead;
  const tokens = oldTokens + newTokensRead;
  const supervisedTokens = oldSupervised + newSupervisedRead;
  if (newPart.rows === 0) problems.push('no new rows to merge');
  if (rows !== oldRows + newPart.rows)
    problems.push(
      `the merged dataset has ${rows} rows, expected ${oldRows} old + ${newPart.rows} new = ${oldRows + newPart.rows}`,
    );
  if (tokens !== oldTokens + newPart.tokens) {
    problems.push(
      `the merged dataset has ${tokens} tokens, expected ${oldTokens} old + ${newPart.tokens} new = ${oldTokens + newPart.tokens}`,
    );
  }
  if (supervisedTokens !== oldSupervised + newPart.supervisedTokens) {
    problems.push(
      `the merged dataset has ${supervisedTokens} supervised tokens, expected ${oldSupervised + newPart.supervisedTokens}`,
    );
  }
  const lossMaskCoverage = tokens === 0 ? 0 : supervisedTokens / tokens;
  const newLossMaskCoverage = newPart.tokens === 0 ? 0 : newPart.supervisedTokens / newPart.tokens;
  if (!(lossMaskCoverage >= 0 && lossMaskCoverage <= 1))
    problems.push(`loss-mask coverage ${lossMaskCoverage} is outside [0, 1]`);
  if (newPart.rows > 0 && !(newLossMaskCoverage > 0 && newLossMaskCoverage <= 1)) {
    problems.push(`loss-mask coverage of the new rows is ${newLossMaskCoverage}: nothing would be trained on`);
  }

  if (mask !== undefined && maskRowCount > 0) {
    problems.push(
      `postprocess.dflash.maskToken ${JSON.stringify(mask.token)} (id ${mask.id}) is in the data: ${maskRowCount} new ` +
        `${maskRowCount === 1 ? 'row holds' : 'rows hold'} it (row ${maskRows.join(', ')}${maskRowCount > maskRows.length ? ', …' : ''}); ` +
        'DFlash could not tell its mask slots from those tokens: choose a special token the data never holds',
    );
  }

  // Sampled rows: read back equal to what was written; decoded for a human spot check.
  const samples: MergeSample[] = [];
  for (const s of newPart.samples) {
    const got = readBack.get(s.index);
    const index = oldRows + s.index;
    const mismatch = got === undefined ? 'not found' : rowDifference(s.row, got, v.columns);
    if (mismatch !== undefined)
      problems.push(`row ${index}${idOf(s.row)} reads back different from what was written: ${mismatch}`);
    const ids = (s.row['input_ids'] as number[] | undefined) ?? [];
    const mask = (s.row['loss_mask'] as number[] | undefined) ?? [];
    const sample: MergeSample = {
      index,
      id: typeof s.row['id'] === 'string' ? s.row['id'] : undefined,
      tokens: ids.length,
      supervisedTokens: mask.reduce((a, m) => a + m, 0),
      matches: mismatch === undefined,
    };
    if (v.opts.decode !== undefined) {
      try {
        sample.text = (await v.opts.decode(Array.from(ids))).slice(0, 300);
        sample.supervisedText = (await v.opts.decode(Array.from(ids).filter((_, i) => mask[i] === 1))).slice(0, 300);
        if (ids.length > 0 && sample.text.length === 0)
          problems.push(`row ${index}${idOf(s.row)} decodes to empty text`);
      } catch (e: unknown) {
        problems.push(`row ${index}${idOf(s.row)} cannot be decoded: ${errorMessage(e)}`);
      }
    }
    samples.push(sample);
  }

  if (problems.length === 0 && v.opts.verifyMerged !== undefined) {
    try {
      problems.push(...(await v.opts.verifyMerged(staging)));
    } catch (e: unknown) {
      problems.push(`verification of the merged folder failed: ${errorMessage(e)}`);
    }
  }

  return {
    ok: problems.length === 0,
    mergeId: v.mergeId,
    target: v.target,
    createdAt: new Date().toISOString(),
    firstMerge: v.firstMerge,
    oldRows,
    newRows: newPart.rows,
    rows,
    oldTokens,
    newTokens: newPart.tokens,
    tokens,
    oldSupervisedTokens: oldSupervised,
    newSupervisedTokens: newPart.supervisedTokens,
    supervisedTokens,
    lossMaskCoverage,
    newLossMaskCoverage,
    shards: meta.shards.length,
    newShards: newPart.files,
    dflash: {
      rowsWithoutAnchor: rowsWithoutAnchor(oldAnchors) + rowsWithoutAnchor(newAnchors),
      newRowsWithoutAnchor: rowsWithoutAnchor(newAnchors),
      anchorPositions: addAnchorHistograms(oldAnchors, newAnchors),
      newAnchorPositions: newAnchors,
      maskToken: mask ?? null,
    },
    linkedShards: newPart.linked,
    copiedShards: newPart.copied,
    columns: columnsString(v.columns),
    droppedColumns: v.dropped,
    checkedSamples: samples.filter((s) => s.matches).length,
    samples,
    problems,
    warnings: v.warnings,
    environment: {
      node: process.version,
      platform: `${process.platform}-${process.arch}`,
      host: hostname(),
      pid: process.pid,
    },
    durationMs: Date.now() - v.started,
  };
}

export function idOf(row: RowRecord): string {
  return typeof row['id'] === 'string' ? ` (id ${JSON.stringify(row['id'])})` : '';
}

/** Where a written row and the row read back differ, over the merged columns; undefined if equal. */
export function rowDifference(written: RowRecord, read: RowRecord, columns: readonly ColumnSpec[]): string | undefined {
  for (const c of columns) {
    const a = written[c.name];
    const b = read[c.name];
    if (Array.isArray(a) || ArrayBuffer.isView(a)) {
      const xs = a as ArrayLike<number>;
      if (!Array.isArray(b) || b.length !== xs.length)
        return `${c.name} has ${Array.isArray(b) ? b.length : 'no'} values, expected ${xs.length}`;
      for (let i = 0; i < xs.length; i++)
        if (xs[i] !== b[i]) return `${c.name}[${i}] is ${String(b[i])}, expected ${String(xs[i])}`;
    } else if (a !== b) {
      return `${c.name} is ${JSON.stringify(b)}, expected ${JSON.stringify(a)}`;
    }
  }
  return undefined;
}
