import type { DatasetConfig, Sample } from '../shared/index.js';

/**
 * A batch's id, from the lines (and, with `samplesPerPrompt`, the sample numbers) of its first
 * and last samples: the same batch always gets the same id, and two batches of one epoch never
 * do — the samples of one prompt may fill several batches (`samplesPerPrompt` ≥ 2 × `batchSize`).
 * The producer adds each batch under this id (`:` made `_`), so a batch added twice (a producer
 * restarted before saving its cursor) is one job.
 */
export function batchIdOf(
  ds: Pick<DatasetConfig, 'name' | 'samplesPerPrompt'>,
  epoch: number,
  first: Pick<Sample, 'id' | 'line'>,
  last: Pick<Sample, 'id' | 'line'>,
): string {
  const at = (s: Pick<Sample, 'id' | 'line'>): string => {
    if (ds.samplesPerPrompt <= 1) return String(s.line);
    const m = /#s(\d+)$/.exec(s.id);
    return m === null ? String(s.line) : `${s.line}.s${m[1]}`;
  };
  return `${ds.name}:e${epoch}:${at(first)}-${at(last)}`;
}
