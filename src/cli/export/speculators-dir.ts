/**
 * The output folder of `export --format speculators`: what may be replaced, the staging folder
 * beside it, and the swap that puts a finished export in its place.
 *
 * speculators reads the folder as `prepare-data` leaves it and writes its own caches there
 * (`d2t-<size>.npy`, `t2d-<size>.npy` from `token_freq.pt`; hidden states under
 * `hidden_states/` by default). An earlier export is replaced whole, its vocabulary caches with
 * it (they were computed from the old `token_freq.pt`, and speculators would reuse them);
 * anything else in the folder makes the export refuse, naming it.
 */
import { readFile, readdir, rename, rm } from 'node:fs/promises';
import path from 'node:path';

import {
  EnvironmentError,
  PayloadError,
  errorMessage,
  exists,
  fsyncDir,
  isErrno,
  isProcessAlive,
} from '../../shared/index.js';

/** The files of an export, as speculators' `prepare-data` writes them (shards aside). */
const EXPORT_FILES = new Set(['state.json', 'dataset_info.json', 'token_freq.pt']);
/** The vocabulary mappings `speculators train` caches beside the data: derived, dropped on replace. */
const VOCAB_CACHE = /^(d2t|t2d)-\d+\.npy$/;
/** Names of the staging and old folders beside `out`, with the pid of the process that made them. */
const SIDE = /^\.(.+)\.(staging|old)-(\d+)$/;
/** How many unexpected entries a refusal names. */
const NAMED = 8;

/** What is at the output path before an export. */
export type OutState =
  | { kind: 'absent' }
  | { kind: 'empty' }
  /** An earlier export (or a `prepare-data` output of the same shape); `caches` go with it. */
  | { kind: 'export'; caches: string[] };

/** The staging folder of this process for `out`: beside it, so that the final rename stays on one filesystem. */
export function stagingDirOf(out: string): string {
  return path.join(path.dirname(out), `.${path.basename(out)}.staging-${process.pid}`);
}

function oldDirOf(out: string): string {
  return path.join(path.dirname(out), `.${path.basename(out)}.old-${process.pid}`);
}

/**
 * Removes staging folders left beside `out` by exports that died (their process is gone, or is
 * this one); an old folder left between the two renames of a swap is put back when `out` is
 * missing, else removed.
 */
export async function cleanLeftovers(out: string): Promise<void> {
  const parent = path.dirname(out);
  let names: string[];
  try {
    names = await readdir(parent);
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return;
    throw e;
  }
  for (const name of names) {
    const m = SIDE.exec(name);
    if (m === null || m[1] !== path.basename(out)) continue;
    const pid = Number(m[3]);
    if (pid !== process.pid && isProcessAlive(pid)) continue;
    const side = path.join(parent, name);
    if (m[2] === 'old' && !(await exists(out))) await rename(side, out);
    else await rm(side, { recursive: true, force: true });
  }
}

/** Why an entry of a non-empty `out` is not part of an export, for the refusal. */
function whatIs(name: string, isDir: boolean): string {
  if (name === 'hidden_states' && isDir)
    return 'hidden_states/ (hidden states cached for the earlier rows, by row position: move or delete them first)';
  if (name === '.tokenmill') return '.tokenmill/ (tokenmill control files: this looks like a training dataset)';
  return isDir ? `${name}/` : name;
}

/**
 * Looks at `out` and says whether an export may be written there: absent, an empty folder, or
 * an earlier export (state.json naming the columns input_ids, loss_mask, seq_len; its shards;
 * dataset_info.json; token_freq.pt; speculators' d2t/t2d caches). Anything else is refused with
 * a {@link PayloadError} that names what is in it.
 */
export async function inspectOut(out: string): Promise<OutState> {
  let entries;
  try {
    entries = await readdir(out, { withFileTypes: true });
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return { kind: 'absent' };
    if (isErrno(e, 'ENOTDIR'))
      throw new PayloadError(`--out ${out} is a file, not a folder: the export writes a folder`);
    throw e;
  }
  if (entries.length === 0) return { kind: 'empty' };
  const refuse = (why: string, names: string[]): never => {
    const shown = names.slice(0, NAMED).join(', ');
    const more = names.length > NAMED ? ` and ${names.length - NAMED} more` : '';
    throw new PayloadError(
      `--out ${out} is not empty and is not an earlier speculators export (${why}): it holds ${shown}${more}; choose another folder or empty it`,
    );
  };
  const shards = await exportShards(out);
  if (shards === undefined) {
    return refuse(
      'no state.json of the columns input_ids, loss_mask, seq_len',
      entries.map((e) => whatIs(e.name, e.isDirectory())),
    );
  }
  const caches: string[] = [];
  const unexpected: string[] = [];
  for (const e of entries) {
    if (e.isFile() && (EXPORT_FILES.has(e.name) || shards.has(e.name))) continue;
    if (e.isFile() && VOCAB_CACHE.test(e.name)) caches.push(e.name);
    else unexpected.push(whatIs(e.name, e.isDirectory()));
  }
  if (unexpected.length > 0) return refuse('it holds more than an export', unexpected);
  return { kind: 'export', caches: caches.sort() };
}

/** The shard names of an export's state.json, or undefined when `dir` holds no export's state.json. */
async function exportShards(dir: string): Promise<Set<string> | undefined> {
  let state: unknown;
  try {
    state = JSON.parse(await readFile(path.join(dir, 'state.json'), 'utf8'));
  } catch {
    return undefined;
  }
  const s = state as { _data_files?: unknown; _format_columns?: unknown };
  const columns = Array.isArray(s._format_columns) ? (s._format_columns as unknown[]) : [];
  if (!['input_ids', 'loss_mask', 'seq_len'].every((c) => columns.includes(c))) return undefined;
  if (!Array.isArray(s._data_files)) return undefined;
  const names = new Set<string>();
  for (const f of s._data_files as unknown[]) {
    const name = (f as { filename?: unknown }).filename;
    if (typeof name === 'string' && !name.includes('/')) names.add(name);
  }
  return names;
}

/**
 * Puts the finished `staging` folder at `out`: renamed over an absent or empty `out`; an
 * earlier export is first renamed aside, then removed once the new one is in place (put back
 * if the second rename fails). The parent folder is fsynced after the renames.
 */
export async function swapIntoPlace(staging: string, out: string, state: OutState): Promise<void> {
  const parent = path.dirname(out);
  if (state.kind !== 'export') {
    await rename(staging, out);
    await fsyncDir(parent);
    return;
  }
  const old = oldDirOf(out);
  await rename(out, old);
  try {
    await rename(staging, out);
  } catch (e: unknown) {
    await rename(old, out).catch(() => undefined);
    throw new EnvironmentError(`cannot move the export from ${staging} to ${out}: ${errorMessage(e)}`, { cause: e });
  }
  await fsyncDir(parent);
  await rm(old, { recursive: true, force: true });
}
