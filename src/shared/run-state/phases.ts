/**
 * The numbers behind each phase of the pipeline checklist: prompts read for prepare, records
 * and tokens for generate, rows and tokens of the last post-process round for tokenize and
 * merge (from its merge job's result).
 */
import { Job, Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Config } from '../config/index.js';
import { MERGE_QUEUE, type MergeJobResult, type MergeReportSummary } from '../queues/index.js';
import type { RunKeys } from '../queues/index.js';
import { formatInt } from '../util/index.js';
import { trainPhaseDetail, type TrainStatus } from './train-status.js';

/** What {@link readPhaseDetails} needs of each generation dataset's status. */
interface GenerationCounts {
  name: string;
  records: number;
  outputTokens: number;
  tokenBudget: number | null;
  failed: number;
  skipped: number;
}

/**
 * Fields of a dataset's stats hash that `tokenmill prepare` writes: the rows of its source read,
 * kept and dropped (duplicates within and across datasets, too long, empty, malformed), and
 * the SHA-256 of the prompt file a run started from.
 */
export const PREPARE_STATS_FIELDS = {
  rows: 'prepareRows',
  kept: 'prepareKept',
  duplicates: 'prepareDuplicates',
  tooLong: 'prepareTooLong',
  empty: 'prepareEmpty',
  malformed: 'prepareMalformed',
  promptsSha256: 'promptsSha256',
} as const;

/** A dataset's prepare numbers as `status --json` shows them. */
export interface PreparedCounts {
  rows: number;
  kept: number;
  duplicates: number;
  tooLong: number;
  empty: number;
  malformed: number;
}

/** The prepare numbers in a dataset's stats hash (read with HGETALL), or null before any `prepare`. */
export function preparedCounts(stats: Record<string, string>): PreparedCounts | null {
  const f = PREPARE_STATS_FIELDS;
  if (stats[f.rows] === undefined) return null;
  const num = (k: string): number => Number(stats[k] ?? 0);
  return {
    rows: num(f.rows),
    kept: num(f.kept),
    duplicates: num(f.duplicates),
    tooLong: num(f.tooLong),
    empty: num(f.empty),
    malformed: num(f.malformed),
  };
}

/** One line of numbers per phase; '' where there is nothing yet. */
export interface PhaseDetails {
  prepare: string;
  generate: string;
  tokenize: string;
  merge: string;
}

/** Reads the numbers of each phase (a few round trips; the merge job only once a round ran). */
export async function readPhaseDetails(
  redis: Redis,
  keys: RunKeys,
  config: Pick<Config, 'datasets'>,
  generation: readonly GenerationCounts[],
): Promise<PhaseDetails> {
  let prompts = 0;
  let rejected = 0;
  let counted = 0;
  for (const ds of config.datasets.filter((d) => d.prompts !== undefined)) {
    const [p, r] = await redis.hmget(keys.stats(ds.name), 'prompts', 'rejected');
    if (p !== null) counted += 1;
    prompts += Number(p ?? 0);
    rejected += Number(r ?? 0);
  }
  const read = counted === 0 ? '' : `${formatInt(prompts)} prompts read, ${formatInt(rejected)} rejected`;
  const prepare = [await preparedSources(redis, keys, config), read].filter((x) => x !== '').join('; ');

  const records = generation.reduce((a, d) => a + d.records, 0);
  const tokens = generation.reduce((a, d) => a + d.outputTokens, 0);
  const budget = generation.every((d) => d.tokenBudget !== null)
    ? generation.reduce((a, d) => a + (d.tokenBudget ?? 0), 0)
    : null;
  const failed = generation.reduce((a, d) => a + d.failed, 0);
  const skipped = generation.reduce((a, d) => a + d.skipped, 0);
  const generate =
    generation.length === 0
      ? 'no dataset with prompts'
      : `${formatInt(records)} records, ${formatInt(tokens)}${budget === null ? '' : ` / ${formatInt(budget)}`} output tokens, ${formatInt(failed)} failed, ${formatInt(skipped)} skipped`;

  const round = await redis.hgetall(keys.postprocess());
  let tokenize = '';
  let merge = '';
  if (round.flowId !== undefined && round.flowId !== '') {
    const result = await mergeResult(redis, keys, round.flowId);
    const label = `round ${round.round ?? '?'}`;
    if (result === undefined) {
      tokenize = `${label} ${round.status ?? 'in_progress'}${round.reason ? `: ${round.reason}` : ''}`;
      merge = tokenize;
    } else {
      const rows = result.datasets.reduce((a, d) => a + d.rows, 0);
      const tok = result.datasets.reduce((a, d) => a + d.tokens, 0);
      const dropped = result.datasets.reduce(
        (a, d) => a + d.droppedTruncated + d.droppedAborted + d.droppedEmpty + d.droppedUnsupervised + d.invalid,
        0,
      );
      tokenize = `${label}: ${formatInt(rows)} rows, ${formatInt(tok)} tokens from ${result.datasets.length} datasets, ${formatInt(dropped)} dropped`;
      merge =
        result.report === null
          ? `${label}: ${result.status}`
          : `${label}: ${formatInt(result.report.rows)} rows, ${formatInt(result.report.tokens)} tokens in ${formatInt(result.report.shards)} shards (${formatInt(result.report.newRows)} new)${dflashNote(result.report)}`;
    }
  }
  return { prepare, generate, tokenize, merge };
}

/** The merge's DFlash count for its status line: rows a DFlash export leaves out ('' before there is one). */
function dflashNote(report: MergeReportSummary): string {
  const n = report.dflash?.rowsWithoutAnchor;
  if (n === undefined || n === 0) return '';
  return `, ${formatInt(n)} with fewer than 2 adjacent supervised tokens (left out by a DFlash export)`;
}

/** Rows of the datasets' sources summed ("3 sources: 1,000 rows read, 950 kept, …"); '' before any `prepare`. */
async function preparedSources(redis: Redis, keys: RunKeys, config: Pick<Config, 'datasets'>): Promise<string> {
  const f = PREPARE_STATS_FIELDS;
  const sums = [0, 0, 0, 0, 0, 0];
  let sources = 0;
  for (const ds of config.datasets.filter((d) => d.source !== undefined)) {
    const values = await redis.hmget(
      keys.stats(ds.name),
      f.rows,
      f.kept,
      f.duplicates,
      f.tooLong,
      f.empty,
      f.malformed,
    );
    if (values[0] === null) continue;
    sources += 1;
    values.forEach((v, i) => (sums[i] = (sums[i] ?? 0) + Number(v ?? 0)));
  }
  if (sources === 0) return '';
  const [rows, kept, duplicates, tooLong, empty, malformed] = sums.map((x) => formatInt(x));
  return `${sources} source${sources === 1 ? '' : 's'}: ${rows} rows read, ${kept} kept, ${duplicates} duplicates, ${tooLong} too long, ${empty} empty, ${malformed} malformed`;
}

/**
 * The train phase of the checklist: its state (`state`, as train jobs record it), and configured
 * when the config has a train section or a train job ran; "not configured" only when neither.
 */
export function trainPhase<S extends string>(
  state: S,
  configured: boolean,
  train: TrainStatus | null,
): { name: 'train'; status: S; configured: boolean; detail: string } {
  const detail = train !== null ? trainPhaseDetail(train) : configured ? '' : 'not configured';
  return { name: 'train', status: state, configured: configured || train !== null, detail };
}

/** The merge job's result of round `flowId`, once it completed. */
async function mergeResult(redis: Redis, keys: RunKeys, flowId: string): Promise<MergeJobResult | undefined> {
  const queue = new Queue(MERGE_QUEUE, { connection: redis, prefix: keys.bullPrefix });
  try {
    const job = await Job.fromId<unknown, MergeJobResult>(queue, flowId);
    const r = job?.returnvalue as MergeJobResult | null | undefined;
    return r !== null && r !== undefined && Array.isArray(r.datasets) ? r : undefined;
  } finally {
    await queue.close();
  }
}
