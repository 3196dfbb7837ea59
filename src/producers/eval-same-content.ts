/**
 * The eval split held out by content as well as by id (docs/eval.md, "Held out by content"): a
 * prompt of any dataset of the run whose content ({@link promptContentKey}: its user turns,
 * normalized) is a held-out prompt's is held out too — the same question in another dataset
 * (`prepare.dedupeAcross` is off by default), or under a second id in the same one. Otherwise the
 * drafter is trained on the prompts it is then measured on, and the acceptance length "on prompts
 * training never saw" is inflated.
 *
 * Resolved for the whole run at once, before the producer sends anything: every dataset's split
 * first (so that a split another dataset's producer has not written yet counts), then each
 * dataset's prompt (or conversation) file read once. The ids found are
 * - given to the producer with the split's own ids (never enqueued),
 * - written to `<run dir>/<dataset>/eval-held-out-ids.json`, which the tokenize step reads, so
 *   that rows generated before the split existed are not trained on either,
 * - counted in the dataset's stats (`evalHeldOutSameContent`, for `status`) and logged.
 *
 * Cost: nothing without a split in the run; else one read of each dataset's file whenever one of
 * the files changed (a process keeps the last answer per run folder).
 */
import { mkdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import {
  HELD_OUT_IDS_FILE,
  parsePromptLine,
  promptContentKey,
  readRawLineChunks,
  writeFileAtomic,
  type DatasetConfig,
  type HeldOutIdsFile,
  type Logger,
  type RunKeys,
} from '../shared/index.js';

/** The stats-hash field with the number of prompts held out for sharing a held-out prompt's content. */
export const EVAL_SAME_CONTENT_FIELD = 'evalHeldOutSameContent';
/** Ids named one by one in the log per dataset; the rest are counted. */
const NAMED = 5;

/** A dataset's prompts held out by content: id → the held-out prompt it matches (`<dataset>/<id>`). */
export type SameContent = ReadonlyMap<string, string>;

export interface SameContentOptions {
  /** Every dataset of the run. */
  datasets: readonly DatasetConfig[];
  runDir: string;
  run?: { redis: Redis; keys: RunKeys };
  log: Logger;
  /** Makes (or reads back) a dataset's own split (eval-holdout.ts), before the contents are compared. */
  resolveSplit(ds: DatasetConfig): Promise<unknown>;
}

interface RunResult {
  fingerprint: string;
  byDataset: Map<string, SameContent>;
}

/** Per run folder: the last answer, and the resolution under way (one at a time). */
const last = new Map<string, Promise<RunResult | undefined>>();

/**
 * The prompts of dataset `dataset` held out because their content is a held-out prompt's (of any
 * dataset of the run); empty when there is none or no split in the run. See the module comment.
 */
export async function heldOutBySameContent(dataset: string, o: SameContentOptions): Promise<SameContent> {
  const before = last.get(o.runDir) ?? Promise.resolve(undefined);
  const next = before
    .catch(() => undefined)
    .then(async (prev) => {
      const fingerprint = await fingerprintOf(o.datasets, o.runDir);
      return prev !== undefined && prev.fingerprint === fingerprint ? prev : resolveRun(o);
    });
  last.set(o.runDir, next);
  return (await next)?.byDataset.get(dataset) ?? new Map<string, string>();
}

function sourceOf(ds: DatasetConfig): { file: string; turns: 'last' | 'all' } | undefined {
  if (ds.prompts !== undefined) return { file: ds.prompts, turns: ds.turns };
  if (ds.conversations !== undefined) return { file: ds.conversations, turns: 'all' };
  return undefined;
}

const splitFileOf = (runDir: string, name: string): string => join(runDir, name, 'eval-prompts.jsonl');

/** What the answer depends on: every dataset's file and split file, by size and modification time. */
async function fingerprintOf(datasets: readonly DatasetConfig[], runDir: string): Promise<string> {
  const parts: string[] = [];
  for (const ds of datasets) {
    for (const file of [sourceOf(ds)?.file, splitFileOf(runDir, ds.name)]) {
      if (file === undefined) continue;
      const st = await stat(file).catch(() => undefined);
      parts.push(`${file}:${st === undefined ? '-' : `${st.size}:${st.mtimeMs}`}`);
    }
    parts.push(`${ds.name}:${ds.evalHoldout ?? '-'}:${ds.turns}`);
  }
  return parts.join('\n');
}

async function resolveRun(o: SameContentOptions): Promise<RunResult> {
  const { datasets, runDir, log } = o;
  // 1. Every split of the run, made now where the config asks for one and none is written yet.
  for (const ds of datasets) {
    if (ds.prompts === undefined || ds.evalHoldout === undefined) continue;
    try {
      await o.resolveSplit(ds);
    } catch (e: unknown) {
      // Its own producer reports it (a run that generated without a split); it holds nothing out meanwhile.
      log.debug({ err: e, dataset: ds.name }, 'eval split of another dataset not resolved');
    }
  }
  // 2. The held-out prompts' contents.
  const held = new Map<string, string>();
  const splitIds = new Map<string, Set<string>>();
  for (const ds of datasets) {
    const file = splitFileOf(runDir, ds.name);
    const ids = new Set<string>();
    await eachContent(file, ds.prompts !== undefined ? ds.turns : 'all', (id, key) => {
      ids.add(id);
      if (!held.has(key)) held.set(key, `${ds.name}/${id}`);
    });
    splitIds.set(ds.name, ids);
  }
  const byDataset = new Map<string, SameContent>();
  if (held.size > 0) {
    // 3. Each dataset's prompts with one of those contents, under an id not held out already.
    for (const ds of datasets) {
      const source = sourceOf(ds);
      if (source === undefined) continue;
      const own = splitIds.get(ds.name) ?? new Set<string>();
      const same = new Map<string, string>();
      await eachContent(source.file, source.turns, (id, key) => {
        const as = held.get(key);
        if (as !== undefined && !own.has(id) && !same.has(id)) same.set(id, as);
      });
      byDataset.set(ds.name, same);
      await record(o, ds, [...own], same);
    }
  }
  return { fingerprint: await fingerprintOf(datasets, runDir), byDataset };
}

/**
 * Calls `each` with the id and content key of each valid line of a prompt file, streaming (a file
 * of any size takes constant memory). A missing file has none: its own producer reports it.
 */
async function eachContent(
  file: string,
  turns: 'last' | 'all',
  each: (id: string, key: string) => void,
): Promise<void> {
  if ((await stat(file).catch(() => undefined)) === undefined) return;
  for await (const chunk of readRawLineChunks(file)) {
    for (const { line, text } of chunk) {
      if (text === undefined) continue;
      const parsed = parsePromptLine(text, file, line, { turns });
      if (parsed.ok) each(parsed.record.id, promptContentKey(parsed.record.messages));
    }
  }
}

/** Writes the dataset's eval-held-out-ids.json (when it changed), its stats field, and a log line. */
async function record(o: SameContentOptions, ds: DatasetConfig, byId: string[], same: SameContent): Promise<void> {
  const dir = join(o.runDir, ds.name);
  const file = join(dir, HELD_OUT_IDS_FILE);
  const content = {
    dataset: ds.name,
    byId: byId.sort(),
    sameContent: [...same].map(([id, as]) => ({ id, as })).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)),
  };
  const before = await readFile(file, 'utf8')
    .then((t) => JSON.parse(t) as Partial<HeldOutIdsFile>)
    .catch(() => undefined);
  if (JSON.stringify({ ...before, written: undefined }) !== JSON.stringify({ ...content, written: undefined })) {
    await mkdir(dir, { recursive: true });
    const written: HeldOutIdsFile = { ...content, written: new Date().toISOString() };
    await writeFileAtomic(file, `${JSON.stringify(written, null, 2)}\n`);
  }
  if (o.run !== undefined) await o.run.redis.hset(o.run.keys.stats(ds.name), EVAL_SAME_CONTENT_FIELD, same.size);
  if (same.size === 0) return;
  const named = content.sameContent
    .slice(0, NAMED)
    .map((s) => `${s.id} (as ${s.as})`)
    .join(', ');
  o.log.info(
    { dataset: ds.name, byId: byId.length, sameContent: same.size, file },
    `dataset "${ds.name}": held out for eval: ${byId.length} by id, ${same.size} same content as a held-out prompt: ` +
      `${named}${same.size > NAMED ? `, and ${same.size - NAMED} more` : ''}; never generated nor trained on`,
  );
}
