/**
 * The files of a source's `path`, in the order their rows are read: one file; a file-name
 * pattern (`data/train-*.parquet`); a folder of data files, walked recursively as
 * `huggingface-cli download … --repo-type dataset --local-dir` lays it out, sorted naturally;
 * or a `datasets` `save_to_disk` folder (its shards in state.json order; of a DatasetDict, the
 * `train` split).
 */
import { readFile, readdir, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import { errorMessage } from '../../shared/index.js';
import { isErrno } from '../../shared/index.js';
import { readDatasetMeta } from '../../shared/index.js';
import { SourceError } from './source-raw.js';

/** The kinds of data file a source reads. */
export type SourceFileKind = 'jsonl' | 'json' | 'parquet' | 'arrow';

/** The files of a source, all of one kind, and what was chosen on the way (a split, files skipped). */
export interface SourceFiles {
  kind: SourceFileKind;
  files: string[];
  notes: string[];
}

const KINDS: Readonly<Record<string, SourceFileKind>> = {
  '.jsonl': 'jsonl',
  '.json': 'json',
  '.parquet': 'parquet',
  '.arrow': 'arrow',
};

const SUPPORTED = '.jsonl, .json, .parquet or .arrow';

/** Files of a downloaded dataset that hold no rows. */
const METADATA_FILES = new Set(['dataset_info.json', 'dataset_infos.json', 'dataset_dict.json', 'state.json']);

/** A shard named by the hub's convention: `<split>-00000-of-00003.<ext>`. */
const SHARD_NAME = /^(.+?)-\d+-of-\d+$/;

/** The kind of a file by its extension, or undefined. */
export function kindOf(file: string): SourceFileKind | undefined {
  return KINDS[path.extname(file).toLowerCase()];
}

/** Compares paths with runs of digits as numbers: `shard-2` before `shard-10`. */
export function naturalCompare(a: string, b: string): number {
  const re = /(\d+)|(\D+)/g;
  const pa = a.match(re) ?? [];
  const pb = b.match(re) ?? [];
  for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
    const x = pa[i] as string;
    const y = pb[i] as string;
    if (x === y) continue;
    const dx = /^\d/.test(x);
    const dy = /^\d/.test(y);
    if (dx && dy) {
      const d = Number(x) - Number(y);
      if (d !== 0) return d;
      return x.length - y.length;
    }
    return x < y ? -1 : 1;
  }
  return pa.length - pb.length;
}

/**
 * The files of a source path. Throws a {@link SourceError} for a missing path, an unknown
 * extension, a folder with no data file or with files of several kinds, or several splits
 * without a `train` one.
 */
export async function listSourceFiles(sourcePath: string): Promise<SourceFiles> {
  let st;
  try {
    st = await stat(sourcePath);
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT') || isErrno(e, 'ENOTDIR')) {
      if (/[*?]/.test(path.basename(sourcePath))) return filesOfPattern(sourcePath);
      throw new SourceError(
        `source path ${sourcePath} does not exist: download the dataset there (huggingface-cli download <repo> --repo-type dataset --local-dir <dir>) or fix source.path`,
      );
    }
    throw new SourceError(`cannot read source path ${sourcePath}: ${errorMessage(e)}`, { cause: e });
  }
  if (st.isDirectory()) return filesOfFolder(sourcePath);
  const kind = kindOf(sourcePath);
  if (kind === undefined) throw unknownExtension(sourcePath);
  return { kind, files: [sourcePath], notes: [] };
}

function unknownExtension(file: string): SourceError {
  const ext = path.extname(file) || '(none)';
  const hint = /\.(gz|zst|bz2|xz|zip)$/i.test(file) ? '; decompress it first' : '';
  return new SourceError(
    `${file}: unknown extension ${ext}: a source is a ${SUPPORTED} file, a folder of them, or a datasets save_to_disk folder${hint}`,
  );
}

/** Files of the folder whose names match the `*`/`?` pattern of the path's last part. */
async function filesOfPattern(pattern: string): Promise<SourceFiles> {
  const dir = path.dirname(pattern);
  const base = path.basename(pattern);
  const re = new RegExp(
    `^${base
      .replace(/[.+^${}()|[\]\\]/g, '\\$&')
      .replace(/\*/g, '.*')
      .replace(/\?/g, '.')}$`,
  );
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) throw new SourceError(`source path ${pattern}: the folder ${dir} does not exist`);
    throw new SourceError(`cannot read the folder ${dir}: ${errorMessage(e)}`, { cause: e });
  }
  const files = names
    .filter((n) => re.test(n))
    .sort(naturalCompare)
    .map((n) => path.join(dir, n));
  if (files.length === 0) throw new SourceError(`source path ${pattern}: no file in ${dir} matches ${base}`);
  return oneKind(files, pattern, []);
}

async function filesOfFolder(dir: string): Promise<SourceFiles> {
  const dictPath = path.join(dir, 'dataset_dict.json');
  const dict = await readJsonIfPresent(dictPath);
  if (dict !== undefined) return filesOfDatasetDict(dir, dict, dictPath);
  if (await isFile(path.join(dir, 'state.json'))) return filesOfSavedDataset(dir, []);
  const found: string[] = [];
  const other: string[] = [];
  await walk(dir, dir, found, other, new Set());
  if (found.length === 0) {
    const seen =
      other.length === 0
        ? 'it is empty'
        : `it has: ${other.slice(0, 8).join(', ')}${other.length > 8 ? `, … (${other.length})` : ''}`;
    throw new SourceError(`source folder ${dir} holds no ${SUPPORTED} file (${seen})`);
  }
  found.sort((a, b) => naturalCompare(path.relative(dir, a), path.relative(dir, b)));
  return oneSplit(found, dir);
}

async function walk(root: string, dir: string, found: string[], other: string[], seen: Set<string>): Promise<void> {
  const real = await realpath(dir);
  if (seen.has(real)) return;
  seen.add(real);
  const entries = await readdir(dir, { withFileTypes: true });
  for (const e of entries) {
    if (e.name.startsWith('.')) continue;
    const full = path.join(dir, e.name);
    // Older hub downloads link big files into the cache: follow links.
    const isDir = e.isSymbolicLink()
      ? await stat(full).then(
          (s) => s.isDirectory(),
          () => false,
        )
      : e.isDirectory();
    if (isDir) await walk(root, full, found, other, seen);
    else if (kindOf(e.name) !== undefined && !METADATA_FILES.has(e.name)) found.push(full);
    else if (!/^readme/i.test(e.name) && !METADATA_FILES.has(e.name)) other.push(path.relative(root, full));
  }
}

/** All files of one kind, or a refusal naming the kinds. */
function oneKind(files: string[], where: string, notes: string[]): SourceFiles {
  const byKind = new Map<SourceFileKind, string[]>();
  for (const f of files) {
    const k = kindOf(f);
    if (k === undefined) throw unknownExtension(f);
    byKind.set(k, [...(byKind.get(k) ?? []), f]);
  }
  if (byKind.size > 1) {
    const list = [...byKind]
      .map(([k, fs]) => `${fs.length} .${k} (${path.relative(where, fs[0] as string) || (fs[0] as string)}…)`)
      .join(', ');
    throw new SourceError(
      `source ${where} mixes file kinds: ${list}; point source.path at the files of one kind (a folder, one file or a pattern such as data/*.parquet)`,
    );
  }
  const [kind] = byKind.keys();
  return { kind: kind as SourceFileKind, files, notes };
}

/** Names a file or folder takes to say which split it holds. */
const SPLIT_NAME = /^(train|test|validation|valid|val|dev|eval)$/i;

/**
 * The split a file belongs to and the `source.path` that selects it: by the hub's shard name
 * (`<split>-00000-of-00002.<ext>`), else a file or folder named after a split (`train.jsonl`,
 * `train/part-0.parquet`).
 */
function splitOf(file: string, dir: string): { split: string; path: string } | undefined {
  const ext = path.extname(file);
  const base = path.basename(file, ext);
  const shard = SHARD_NAME.exec(base)?.[1];
  if (shard !== undefined) return { split: shard, path: path.join(path.dirname(file), `${shard}-*${ext}`) };
  if (SPLIT_NAME.test(base)) return { split: base, path: file };
  const parts = path.relative(dir, path.dirname(file)).split(path.sep);
  for (let i = parts.length - 1; i >= 0; i--) {
    const part = parts[i] as string;
    if (SPLIT_NAME.test(part)) return { split: part, path: path.join(dir, ...parts.slice(0, i + 1)) };
  }
  return undefined;
}

/**
 * The files of one split: when every file names its split (see {@link splitOf}) and they
 * belong to several, those of `train` (said in a note), else a refusal naming the splits.
 */
function oneSplit(files: string[], dir: string): SourceFiles {
  const of = files.map((f) => splitOf(f, dir));
  if (of.some((s) => s === undefined)) return oneKind(files, dir, []);
  const bySplit = new Map<string, { path: string; files: string[] }>();
  for (const [i, s] of (of as { split: string; path: string }[]).entries()) {
    const entry = bySplit.get(s.split) ?? { path: s.path, files: [] };
    entry.files.push(files[i] as string);
    bySplit.set(s.split, entry);
  }
  if (bySplit.size < 2) return oneKind(files, dir, []);
  const names = [...bySplit.keys()];
  const train = bySplit.get('train');
  if (train === undefined) {
    const first = bySplit.get(names[0] as string) as { path: string; files: string[] };
    throw new SourceError(
      `source folder ${dir} holds the splits ${names.join(', ')} (by file name, e.g. ${path.relative(dir, first.files[0] as string)}); set source.path to one of them, e.g. ${first.path}`,
    );
  }
  const other = bySplit.get(names.find((n) => n !== 'train') as string) as { path: string };
  const count = `${train.files.length} file${train.files.length === 1 ? '' : 's'}`;
  const note = `${dir} holds the splits ${names.join(', ')}: reading train (${count}); set source.path to ${other.path} or the like for another`;
  return oneKind(train.files, dir, [note]);
}

async function filesOfDatasetDict(dir: string, dict: unknown, dictPath: string): Promise<SourceFiles> {
  const splits = (dict as { splits?: unknown } | null)?.splits;
  if (!Array.isArray(splits) || !splits.every((s): s is string => typeof s === 'string') || splits.length === 0) {
    throw new SourceError(`${dictPath} is not a datasets dataset_dict.json: expected {"splits": [names]}`);
  }
  const split = splits.includes('train') ? 'train' : splits.length === 1 ? (splits[0] as string) : undefined;
  if (split === undefined) {
    throw new SourceError(
      `${dir} is a DatasetDict with the splits ${splits.join(', ')} and no train: set source.path to one of them, e.g. ${path.join(dir, splits[0] as string)}`,
    );
  }
  const note =
    splits.length === 1
      ? `${dir} is a DatasetDict: reading its only split, ${split}`
      : `${dir} is a DatasetDict with the splits ${splits.join(', ')}: reading ${split}; set source.path to ${path.join(dir, '<split>')} for another`;
  return filesOfSavedDataset(path.join(dir, split), [note]);
}

async function filesOfSavedDataset(dir: string, notes: string[]): Promise<SourceFiles> {
  let shards: string[];
  try {
    shards = (await readDatasetMeta(dir)).shards;
  } catch (e: unknown) {
    throw new SourceError(`${dir}: cannot read the save_to_disk folder: ${errorMessage(e)}`, { cause: e });
  }
  if (shards.length === 0) throw new SourceError(`${dir}: the save_to_disk folder lists no shard in state.json`);
  return { kind: 'arrow', files: shards.map((s) => path.join(dir, s)), notes };
}

async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return false;
    throw e;
  }
}

async function readJsonIfPresent(p: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(p, 'utf8');
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return undefined;
    throw new SourceError(`cannot read ${p}: ${errorMessage(e)}`, { cause: e });
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (e: unknown) {
    throw new SourceError(`${p} is not valid JSON: ${errorMessage(e)}`, { cause: e });
  }
}
