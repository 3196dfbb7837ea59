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
import { createHash, randomBytes } from 'node:crypto';
import { link, mkdir, open, readFile, readdir, rename, rm, stat } from 'node:fs/promises';
import { hostname } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import type { Redis } from 'ioredis';
import {
  AppError,
  PromptFileIndex,
  errorMessage,
  exists,
  fsyncDir,
  isErrno,
  isProcessAlive,
  parsePromptLine,
  readRawLineChunks,
  writeFileAtomic,
  type DatasetConfig,
  type Logger,
  type RunKeys,
} from '../shared/index.js';
import { selectEvalSplit, sortedHash, type ComputedSplit } from './eval-split.js';

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

/** `eval-prompts.json`: how the split was made. */
export interface EvalManifest {
  dataset: string;
  /** The prompt file the split was taken from (absolute). */
  sourceFile: string;
  /** That file when the split was made (or last found to give the same split). */
  source: { bytes: number; mtimeMs: number; prompts: number };
  /** Prompts held out (lines of eval-prompts.jsonl). */
  count: number;
  rule: { evalHoldout: number; count: string; select: string };
  /** SHA-256 of the held-out ids, sorted, one a line. */
  idsSha256: string;
  /** SHA-256 of the SHA-256s of the held-out lines, sorted: a held-out prompt edited changes it. */
  linesSha256: string;
  /** When the split was written (ISO 8601). */
  created: string;
}

/** A dataset's split as generation uses it. */
export interface EvalHoldout {
  /** The eval-prompts.jsonl file. */
  file: string;
  ids: ReadonlySet<string>;
  count: number;
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
  log: Logger;
}

/** Warnings given by this process (one per split file and version of what it was checked against). */
const warned = new Set<string>();

/**
 * The dataset's split: the one written earlier (checked against the config and the prompt file,
 * see the module comment), else made now and written. Undefined when the dataset has no
 * `evalHoldout` and no split was written for it.
 */
export async function resolveEvalHoldout(options: ResolveEvalHoldoutOptions): Promise<EvalHoldout | undefined> {
  const { ds, runDir: dir } = options;
  const file = evalPromptsPath(dir, ds.name);
  await removeAbandonedTemps(file);
  let holdout = (await exists(file)) ? await keepWritten(options, file) : undefined;
  if (holdout === undefined && ds.evalHoldout !== undefined) holdout = await writeSplit(options, file, ds.evalHoldout);
  if (holdout !== undefined && options.run !== undefined)
    await options.run.redis.hset(options.run.keys.stats(ds.name), EVAL_HELD_OUT_FIELD, holdout.count);
  return holdout;
}

/** Reads the ids of an eval-prompts.jsonl with the producer's parser; an unreadable line is an error naming it. */
export async function readEvalSplit(
  file: string,
  turns: DatasetConfig['turns'] = 'last',
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
  const holdout: EvalHoldout = { file, ids: new Set(ids), count: ids.length, written: false };
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
  return { file, ids: new Set(split.ids), count: split.ids.length, written: true };
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

async function readManifest(file: string): Promise<EvalManifest | undefined> {
  try {
    const m = JSON.parse(await readFile(file, 'utf8')) as EvalManifest;
    return typeof m.rule?.evalHoldout === 'number' && typeof m.source?.bytes === 'number' ? m : undefined;
  } catch {
    return undefined; // missing or not ours: the split is checked against the prompt file instead
  }
}

async function writeManifest(file: string, manifest: EvalManifest): Promise<void> {
  await writeFileAtomic(file, `${JSON.stringify(manifest, null, 2)}\n`);
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

/**
 * Puts `tmp` in place as `file` unless `file` exists: false when another process published
 * first. A hard link, which fails rather than replace; a rename where links are not supported.
 */
async function publish(tmp: string, file: string): Promise<boolean> {
  try {
    await link(tmp, file);
  } catch (e: unknown) {
    if (isErrno(e, 'EEXIST')) return false;
    if (!isErrno(e, 'EPERM') && !isErrno(e, 'ENOTSUP') && !isErrno(e, 'EXDEV')) throw e;
    if (await exists(file)) return false;
    await rename(tmp, file);
  }
  await fsyncDir(dirname(file));
  return true;
}

function warnOnce(log: Logger, key: string, fields: Record<string, unknown>, message: string): void {
  if (warned.has(key)) return;
  warned.add(key);
  log.warn(fields, message);
}

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

const HOST = sha256(hostname()).slice(0, 8);

/** `.<name>.<host>.<pid>.<random>.tmp` beside `file`: whose it is, so that what a killed process left is removed. */
function tempNameFor(file: string): string {
  return join(dirname(file), `.${basename(file)}.${HOST}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`);
}

async function removeAbandonedTemps(file: string): Promise<void> {
  const prefix = `.${basename(file)}.${HOST}.`;
  let names: string[];
  try {
    names = await readdir(dirname(file));
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return;
    throw new AppError(`cannot read ${dirname(file)}: ${errorMessage(e)}`, { cause: e });
  }
  for (const name of names) {
    const m = name.startsWith(prefix) ? /^(\d+)\.[0-9a-f]+\.tmp$/.exec(name.slice(prefix.length)) : null;
    if (m !== null && !isProcessAlive(Number(m[1]))) await rm(join(dirname(file), name), { force: true });
  }
}
