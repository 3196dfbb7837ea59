// What a DFlash trainer can draw from a training row. DFlash samples its anchors among the
// supervised positions and predicts the block after each one, so an anchor needs a supervised
// token after it: the positions it can use in a row are the supervised positions whose next
// position is supervised too (a run of k adjacent supervised tokens gives k - 1). A row with fewer
// than 2 adjacent supervised tokens has none; SpecForge's and speculators' DFlash trainers need at
// least one per sample. See docs/training-data.md (DFlash).

/** Buckets of anchor positions per row, in order: `0`, `1`, `2-15`, `16-63`, `64-255`, `256-1023`, `1024+`. */
export const ANCHOR_BUCKETS = ['0', '1', '2-15', '16-63', '64-255', '256-1023', '1024+'] as const;
export type AnchorBucket = (typeof ANCHOR_BUCKETS)[number];

/** Rows per bucket of anchor positions (every bucket present, 0 when empty). */
export type AnchorHistogram = Record<AnchorBucket, number>;

/** Smallest anchor-position count of each bucket, in {@link ANCHOR_BUCKETS} order. */
const BUCKET_STARTS = [0, 1, 2, 16, 64, 256, 1024] as const;

/** A histogram with every bucket at 0. */
export function emptyAnchorHistogram(): AnchorHistogram {
  return { '0': 0, '1': 0, '2-15': 0, '16-63': 0, '64-255': 0, '256-1023': 0, '1024+': 0 };
}

/** The bucket of a row with `positions` anchor positions. */
export function anchorBucketOf(positions: number): AnchorBucket {
  let b = 0;
  while (b + 1 < BUCKET_STARTS.length && positions >= (BUCKET_STARTS[b + 1] as number)) b++;
  return ANCHOR_BUCKETS[b] as AnchorBucket;
}

/** Adds one row with `positions` anchor positions to `h`. */
export function addAnchorRow(h: AnchorHistogram, positions: number): void {
  h[anchorBucketOf(positions)] += 1;
}

/** `a` + `b`, bucket by bucket (a missing histogram counts as empty). */
export function addAnchorHistograms(a: AnchorHistogram, b: AnchorHistogram | undefined): AnchorHistogram {
  const out = { ...a };
  if (b === undefined) return out;
  for (const k of ANCHOR_BUCKETS) out[k] += b[k] ?? 0;
  return out;
}

/** Rows of `h` without an anchor position: fewer than 2 adjacent supervised tokens. */
export function rowsWithoutAnchor(h: AnchorHistogram): number {
  return h['0'];
}

/** Whether `value` is a histogram with every bucket a count (an index file written by an earlier version has none). */
export function isAnchorHistogram(value: unknown): value is AnchorHistogram {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Record<string, unknown>;
  return ANCHOR_BUCKETS.every((k) => typeof v[k] === 'number' && Number.isInteger(v[k]) && (v[k] as number) >= 0);
}

/** Anchor positions of a row's loss mask: positions `i` with `mask[i]` and `mask[i + 1]` both 1. */
export function anchorPositions(mask: ArrayLike<number>): number {
  let n = 0;
  for (let i = 0; i + 1 < mask.length; i++) if (mask[i] === 1 && mask[i + 1] === 1) n++;
  return n;
}

/** The histogram line for people: `0: 3, 1: 1, 2-15: 40, …` (empty buckets left out; `none` when there is no row). */
export function formatAnchorHistogram(h: AnchorHistogram, formatCount: (n: number) => string = String): string {
  const parts = ANCHOR_BUCKETS.filter((k) => h[k] > 0).map((k) => `${k}: ${formatCount(h[k])}`);
  return parts.length === 0 ? 'none' : parts.join(', ');
}
