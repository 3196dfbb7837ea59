/**
 * The evaluation split of a dataset (`datasets[].evalHoldout`): prompts held out of generation,
 * written beside the dataset's other files before generation starts, for a later evaluation of
 * the trained drafter on prompts training never saw.
 *
 * - Which prompts: the K prompts of the file whose key — the first 16 hex digits of
 *   SHA-256 of `<dataset>\n<id>` — is smallest (ties by id), K = min(N, prompts) for
 *   `evalHoldout: N`, K = max(1, round(x × prompts)) for a fraction x (round half up). "Prompts"
 *   are the file's valid records with distinct ids (the first valid line of an id, as the producer
 *   reads them; with `turns: all` whole conversations). The key depends on the id alone, not on
 *   the line or any random draw: the same file gives the same split on every machine.
 * - What is written: `<run dir>/<dataset>/eval-prompts.jsonl`, the held-out lines verbatim in
 *   file order (read back with the producer's prompt-line parser), and `eval-prompts.json`
 *   ({@link EvalManifest}). Each goes to a temp file first; the split is published with a hard
 *   link that never replaces a split another process published first.
 * - Fixed once written: a resumed run reads the file and never recomputes it. When the rule or
 *   the prompt file changed so that a recomputed split would differ, it says so once and keeps
 *   the split; `tokenmill run --fresh` (which deletes the run's files) splits again.
 *
 * Memory: the held-out ids (the producer holds them as a set), and while computing a heap of
 * at most K candidates.
 */
import { mkdir, open, rm, stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { Redis } from 'ioredis';
import {
  AppError,
  PromptFileIndex,
  exists,
  parsePromptLine,
  readRawLineChunks,
  type DatasetConfig,
  type Logger,
  type RunKeys,
  removeAbandonedTempFiles,
  tempNameFor,
} from '../shared/index.js';
import { selectEvalSplit, sortedHash, type ComputedSplit } from './eval-split.js';
import { publish, readManifest, sha256, warnOnce, writeManifest, type EvalManifest } from './eval-split-files.js';
import { heldOutBySameContent } from './eval-same-content.js';

export type { EvalManifest } from './eval-split-files.js';
export { evalHoldoutCount, evalHoldoutKey, selectEvalSplit, type ComputedSplit } from './eval-split.js';

/** File names of the split in `<run dir>/<dataset>/`. */
export const EVAL_PROMPTS_FILE = 'eval-prompts.jsonl';
export const EVAL_MANIFEST_FILE = 'eval-prompts.json';
/** The stats-hash field with the number of held-out prompts (for `status`). */
export const EVAL_HELD_OUT_FIELD = 'evalHeldOut';

/** `<run dir>/<dataset>/eval-prompts.jsonl`: what the evaluation step reads. */
export function evalPromptsPath(runDirectory: string, dataset: string): string {
  return join(runDirectory, dataset, EVAL_PROMPTS_FILE);
}

/** A dataset's split as generation uses it. */
export interface EvalHoldout {
  /** The eval-prompts.jsonl file. */
  file: string;
  /** Ids never generated: the split's, and with `datasets` those of the same content as a held-out prompt. */
  ids: ReadonlySet<string>;
  /** Prompts of the split (lines of eval-prompts.jsonl). */
  count: number;
  /** With `datasets`: prompts held out for their content (in `ids`, not in `count`); see eval-same-content.ts. */
  sameContent: number;
  /** Written by this call (else read back from an earlier one). */
  written: boolean;
}

export interface ResolveEvalHoldoutOptions {
  ds: Pick<DatasetConfig, 'name' | 'evalHoldout' | 'turns'>;
  /** The dataset's prompt file. */
  promptsFile: string;
  /** `<output.dir>/<run>`. */
  runDir: string;
  /** The prompt file's duplicate index when built already (else built here when needed). */
  index?: PromptFileIndex;
  /** The run: a split is not made for a dataset the run already generated from, and `status` gets the count. */
  run?: { redis: Redis; keys: RunKeys };
  /**
   * Every dataset of the run: given, a prompt of this dataset whose content is a held-out
   * prompt's (of any of them) is held out too, and every dataset's split is resolved first
   * (eval-same-content.ts).
   */
  datasets?: readonly DatasetConfig[];
  log: Logger;
}

/**
 * The dataset's split: the one written earlier (checked against the config and the prompt file,
 * see the module comment), else made now and written. Undefined when the dataset has no
 * `evalHoldout` and no split was written for it.
 */
export async function resolveEvalHoldout(options: ResolveEvalHoldoutOptions): Promise<EvalHoldout | undefined> {
  const { ds, runDir: dir } = options;
  const file = evalPromptsPath(dir, ds.name);
  await removeAbandonedTempFiles(file);
  let holdout = (await exists(file)) ? await keepWritten(options, file) : undefined;
  if (holdout === undefined && ds.evalHoldout !== undefined) holdout = await writeSplit(options, file, ds.evalHoldout);
  if (holdout !== undefined && options.run !== undefined)
    await options.run.redis.hset(options.run.keys.stats(ds.name), EVAL_HELD_OUT_FIELD, holdout.count);
  if (options.datasets === undefined) return holdout;
  const { datasets, run, log } = options;
  const same = await heldOutBySameContent(ds.name, {
    datasets,
    runDir: dir,
    log,
    ...(run === undefined ? {} : { run }),
    resolveSplit: (other) =>
      resolveEvalHoldout({
        ds: other,
        promptsFile: other.prompts ?? '',
        runDir: dir,
        log,
        ...(run === undefined ? {} : { run }),
      }),
  });
  if (same.size === 0) return holdout;
  const ids = new Set([...(holdout?.ids ?? []), ...same.keys()]);
  return { file, count: 0, written: false, ...holdout, ids, sameContent: same.size };
}

/** Reads the ids of an eval-prompts.jsonl with the producer's parser; an unreadable line is an error naming it. */
export async function readEvalSplit(
  file: string,
  turns: DatasetConfig['turns'],
): Promise<{ ids: string[]; lineHashes: string[] }> {
  const ids: string[] = [];
  const lineHashes: string[] = [];
  for await (const chunk of readRawLineChunks(file)) {
    for (const { line, text, unreadable } of chunk) {
      const parsed = text === undefined ? undefined : parsePromptLine(text, file, line, { turns });
      if (text === undefined || parsed === undefined || !parsed.ok) {
        const why = unreadable ?? (parsed !== undefined && !parsed.ok ? parsed.reject.reason : 'unreadable');
        throw new AppError(
          `${file}:${line}: not a prompt of the eval split (${why}); put the file back as it was written, or start the run over with \`tokenmill run --fresh\``,
        );
      }
      ids.push(parsed.record.id);
      lineHashes.push(sha256(text));
    }
  }
  return { ids, lineHashes };
}

/** An earlier split, kept; checked against the config and the prompt file when either changed. */
async function keepWritten(options: ResolveEvalHoldoutOptions, file: string): Promise<EvalHoldout> {
  const { ds, log } = options;
  const { ids, lineHashes } = await readEvalSplit(file, ds.turns);
  const holdout: EvalHoldout = { file, ids: new Set(ids), count: ids.length, sameContent: 0, written: false };
  const manifestFile = join(dirname(file), EVAL_MANIFEST_FILE);
  const manifest = await readManifest(manifestFile);
  const source = resolve(options.promptsFile);
  if (ds.evalHoldout === undefined) {
    warnOnce(
      log,
      `${file}|unset`,
      { dataset: ds.name, file },
      `${file}: dataset "${ds.name}" has no datasets[].evalHoldout now, but this split of ${ids.length} prompts was written for it earlier: ` +
        'they stay out of generation. To generate them too, start the run over with `tokenmill run --fresh`',
    );
    return holdout;
  }
  const st = await stat(source);
  if (
    manifest !== undefined &&
    manifest.rule.evalHoldout === ds.evalHoldout &&
    manifest.sourceFile === source &&
    manifest.source.bytes === st.size &&
    manifest.source.mtimeMs === st.mtimeMs
  )
    return holdout;
  // The config or the prompt file changed (or the manifest is missing): would the split differ?
  const now = await selectEvalSplit({
    dataset: ds.name,
    file: source,
    rule: ds.evalHoldout,
    index: await indexOf(options, source),
  });
  const idsSha256 = sortedHash(ids);
  const linesSha256 = sortedHash(lineHashes);
  if (now.idsSha256 === idsSha256 && now.linesSha256 === linesSha256) {
    // The same split: the manifest now names this version of the file.
    await writeManifest(manifestFile, {
      ...manifestOf(ds.name, source, st, now, ds.evalHoldout),
      created: manifest?.created ?? new Date().toISOString(),
    });
    return holdout;
  }
  const before = manifest?.rule.evalHoldout;
  const why = [
    ...(before !== undefined && before !== ds.evalHoldout
      ? [`datasets[].evalHoldout changed from ${before} to ${ds.evalHoldout}`]
      : []),
    ...(manifest === undefined || manifest.sourceFile !== source || manifest.source.bytes !== st.size
      ? [`the prompt file ${source} changed`]
      : manifest.source.mtimeMs !== st.mtimeMs
        ? [`the prompt file ${source} was written again`]
        : []),
  ];
  const kept = new Set(ids);
  const moved = now.ids.filter((id) => !kept.has(id)).length;
  warnOnce(
    log,
    `${file}|${ds.evalHoldout}|${st.size}|${st.mtimeMs}`,
    { dataset: ds.name, file, prompts: source },
    `${file}: the eval split of dataset "${ds.name}" is kept as it was written (${ids.length} prompts)` +
      `${why.length > 0 ? `, though ${why.join(' and ')}` : ''}: split again now it would hold ${now.ids.length} prompts` +
      `${moved > 0 ? `, ${moved} of them not in it` : ', some of them edited since'}. ` +
      'No prompt moves between generation and the eval split once it is written; to split again, start the run over with `tokenmill run --fresh`',
  );
  return holdout;
}

/** Makes the split and writes it; when another process published one meanwhile, that one is kept. */
async function writeSplit(options: ResolveEvalHoldoutOptions, file: string, rule: number): Promise<EvalHoldout> {
  const { ds, log, run } = options;
  if (run !== undefined && (await hasGenerated(run.redis, run.keys, ds.name))) {
    throw new AppError(
      `dataset "${ds.name}" (datasets[].evalHoldout): the run has generated from its prompts already without an eval split, ` +
        'so a split made now could hold out prompts that training data was made of. Start the run over with `tokenmill run --fresh`, ' +
        'or use a new run name (`run:` in the config) for the split',
    );
  }
  const source = resolve(options.promptsFile);
  const st = await stat(source);
  const split = await selectEvalSplit({ dataset: ds.name, file: source, rule, index: await indexOf(options, source) });
  await mkdir(dirname(file), { recursive: true });
  const tmp = tempNameFor(file);
  const fh = await open(tmp, 'wx');
  try {
    try {
      let pending: string[] = [];
      let bytes = 0;
      const wanted = new Set(split.lines);
      for await (const chunk of readRawLineChunks(source)) {
        for (const { line, text } of chunk) {
          if (text === undefined || !wanted.has(line)) continue;
          pending.push(`${text}\n`);
          bytes += text.length;
          if (bytes >= 1 << 20) {
            await fh.write(pending.join(''));
            pending = [];
            bytes = 0;
          }
        }
      }
      if (pending.length > 0) await fh.write(pending.join(''));
      await fh.sync();
    } finally {
      await fh.close();
    }
    if (!(await publish(tmp, file))) {
      log.info({ dataset: ds.name, file }, 'eval split written by another process meanwhile; using it');
      return keepWritten(options, file);
    }
  } finally {
    await rm(tmp, { force: true });
  }
  await writeManifest(join(dirname(file), EVAL_MANIFEST_FILE), {
    ...manifestOf(ds.name, source, st, split, rule),
    created: new Date().toISOString(),
  });
  log.info(
    { dataset: ds.name, file, heldOut: split.ids.length, prompts: split.prompts },
    `eval split written: ${split.ids.length} of ${split.prompts} prompts held out of generation`,
  );
  if (split.ids.length > 0 && split.ids.length === split.prompts) {
    log.warn({ dataset: ds.name, file }, `dataset "${ds.name}": evalHoldout ${rule} holds out every prompt`);
  }
  return { file, ids: new Set(split.ids), count: split.ids.length, sameContent: 0, written: true };
}

function manifestOf(
  dataset: string,
  sourceFile: string,
  st: { size: number; mtimeMs: number },
  split: ComputedSplit,
  rule: number,
): Omit<EvalManifest, 'created'> {
  return {
    dataset,
    sourceFile,
    source: { bytes: st.size, mtimeMs: st.mtimeMs, prompts: split.prompts },
    count: split.ids.length,
    rule: {
      evalHoldout: rule,
      count: Number.isInteger(rule) ? `min(${rule}, prompts)` : `max(1, round(${rule} × prompts))`,
      select: 'the prompts with the smallest sha256("<dataset>\\n<id>") (its first 16 hex digits; ties by id)',
    },
    idsSha256: split.idsSha256,
    linesSha256: split.linesSha256,
  };
}

async function indexOf(options: ResolveEvalHoldoutOptions, source: string): Promise<PromptFileIndex> {
  const given = options.index;
  if (given !== undefined && resolve(given.file) === source && (await given.isCurrent())) return given;
  return PromptFileIndex.build(source, { turns: options.ds.turns });
}

/** Whether the run enqueued, committed, failed or skipped any prompt of the dataset. */
async function hasGenerated(redis: Redis, keys: RunKeys, dataset: string): Promise<boolean> {
  const [records, found] = await Promise.all([
    redis.hget(keys.stats(dataset), 'records'),
    redis.exists(
      keys.producer(dataset),
      keys.done(dataset),
      keys.failed(dataset),
      keys.skipped(dataset),
      keys.promptDigests(dataset),
      keys.conversations(dataset),
    ),
  ]);
  return Number(records ?? 0) > 0 || found > 0;
}
