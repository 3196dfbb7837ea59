// Durable filesystem steps shared by the writer and the merge: fsync of files and folders,
// atomic replacement of small files, hard links with a logged copy fallback.
import { createHash, randomBytes } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { copyFile, link, mkdir, open, readdir, rename, rm, stat } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';

import { logger } from '../logger.js';
import { isErrno } from './errno.js';
import { isProcessAlive } from './process.js';

/** Flushes a folder's entries (new names, renames, removals) to disk. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, fsConstants.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Flushes a file's content to disk. */
export async function fsyncFile(file: string): Promise<void> {
  const fh = await open(file, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/**
 * Writes `data` (text as UTF-8, or bytes) to `file` so that readers see either the old content
 * or the new one, never a part: `file`'s folder is created if missing, a temporary sibling of
 * this process alone (created exclusively, with a random part, so that writers of the same file
 * in one or several processes never share one) is written and fsynced, renamed over `file`, then
 * the folder is fsynced. A write that fails removes its temporary file; the temporary name starts
 * with `.tmp-`, which {@link removeTempFiles} cleans up after a killed process.
 */
export async function writeFileAtomic(file: string, data: string | Uint8Array): Promise<void> {
  const dir = path.dirname(file);
  await mkdir(dir, { recursive: true });
  const tmp = path.join(dir, `.tmp-${path.basename(file)}-${process.pid}-${randomBytes(4).toString('hex')}`);
  const fh = await open(tmp, 'wx');
  try {
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, file);
  } catch (e: unknown) {
    await rm(tmp, { force: true });
    throw e;
  }
  await fsyncDir(dir);
}

/** JSON as `datasets` writes its metadata files: two-space indent. */
export function jsonText(value: unknown): string {
  return `${JSON.stringify(value, null, 2)}\n`;
}

/** Removes the `.tmp-*` leftovers of interrupted {@link writeFileAtomic} calls in `dir`. */
export async function removeTempFiles(dir: string): Promise<string[]> {
  const removed: string[] = [];
  for (const name of await readdirOrEmpty(dir)) {
    if (name.startsWith('.tmp-')) {
      await rm(path.join(dir, name), { force: true, recursive: true });
      removed.push(name);
    }
  }
  return removed;
}

/** `readdir`, or `[]` when the folder does not exist. */
export async function readdirOrEmpty(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return [];
    throw e;
  }
}

/** Whether `p` exists (without following a final symlink's target being absent). */
export async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch (e: unknown) {
    if (isErrno(e, 'ENOENT')) return false;
    throw e;
  }
}

export async function ensureDir(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
}

/** How a file reached its new name. */
export type LinkMethod = 'link' | 'copy';

/**
 * Hard-links `from` to `to` (no data is copied; both names share one inode). Falls back to a
 * copy only when the two paths are on different filesystems (EXDEV) or the filesystem has no
 * hard links (EPERM/ENOTSUP), and logs it, because a copy of a large shard costs time and space.
 */
export async function linkOrCopy(from: string, to: string): Promise<LinkMethod> {
  try {
    await link(from, to);
    return 'link';
  } catch (e: unknown) {
    if (!isErrno(e, 'EXDEV') && !isErrno(e, 'EPERM') && !isErrno(e, 'ENOTSUP') && !isErrno(e, 'EMLINK')) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    logger('hf-dataset').warn({ from, to, code }, 'hard link failed; copying the shard instead');
    await copyFile(from, to, fsConstants.COPYFILE_EXCL);
    await fsyncFile(to);
    return 'copy';
  }
}

const HOST = createHash('sha256').update(hostname()).digest('hex').slice(0, 8);

/**
 * A temp file beside `file`, `.<name>.<host>.<pid>.<random>.<suffix>`: its name says whose it is,
 * so that what a killed process left is found and removed ({@link removeAbandonedTempFiles}).
 */
export function tempNameFor(file: string, suffix = 'tmp'): string {
  const dir = path.dirname(file);
  return path.join(dir, `.${path.basename(file)}.${HOST}.${process.pid}.${randomBytes(4).toString('hex')}.${suffix}`);
}

/** Removes the temp files of `file` ({@link tempNameFor}) that a process of this host, no longer running, left; returns their names. */
export async function removeAbandonedTempFiles(file: string): Promise<string[]> {
  const prefix = `.${path.basename(file)}.${HOST}.`;
  const removed: string[] = [];
  for (const name of await readdirOrEmpty(path.dirname(file))) {
    if (!name.startsWith(prefix)) continue;
    const m = /^(\d+)\.[0-9a-f]+\.[a-z]+$/.exec(name.slice(prefix.length));
    if (m === null || isProcessAlive(Number(m[1]))) continue;
    await rm(path.join(path.dirname(file), name), { force: true });
    removed.push(name);
  }
  return removed;
}

/** Newlines in the bytes `[from, to)` of a file (its whole length by default), read in 1 MiB chunks. */
export async function countNewlines(file: string, from = 0, to = Infinity): Promise<number> {
  const fh = await open(file, 'r');
  try {
    const end = Math.min(to, (await fh.stat()).size);
    const chunk = Buffer.alloc(Math.min(1 << 20, Math.max(1, end - from)));
    let n = 0;
    for (let pos = from; pos < end;) {
      const { bytesRead } = await fh.read(chunk, 0, Math.min(chunk.length, end - pos), pos);
      if (bytesRead === 0) break;
      for (let i = chunk.indexOf(0x0a); i !== -1 && i < bytesRead; i = chunk.indexOf(0x0a, i + 1)) n += 1;
      pos += bytesRead;
    }
    return n;
  } finally {
    await fh.close();
  }
}

/** Lines of a file: its newlines, plus one for a last line without a newline. */
export async function countLines(file: string): Promise<number> {
  const n = await countNewlines(file);
  const size = (await stat(file)).size;
  if (size === 0) return 0;
  const fh = await open(file, 'r');
  try {
    const last = Buffer.alloc(1);
    await fh.read(last, 0, 1, size - 1);
    return last[0] === 0x0a ? n : n + 1;
  } finally {
    await fh.close();
  }
}
