// The merge lock: `<target>.lock`, held while a merge, rollback or repair runs. It names its
// holder by host, PID and, where the OS tells it, the process's start time: a container
// restarted with `init: true` gets the same PID again, so a PID alone would make the lock of the
// process before the restart look held forever. A holder on this host whose PID no longer runs,
// or runs with another start time, is gone and its lock is removed (under a breaker file, so that
// of several processes that found the same stale lock, none removes the lock another has taken
// in the meantime).
import { hostname } from 'node:os';
import { open, readFile, rm, stat } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import path from 'node:path';

import { delay, ensureDir, isErrno, isProcessAlive } from '../../util/index.js';
import { DatasetMergeError, log } from './common.js';

/** What a lock file holds. */
export interface MergeLockHolder {
  pid?: number;
  host?: string;
  since?: string;
  /** The holder's start time (field 22 of /proc/<pid>/stat, clock ticks since boot); Linux only. */
  startTime?: string;
}

/**
 * Takes `<target>.lock` (removing a stale one, see the file header); returns its release.
 * Throws {@link DatasetMergeError} naming the holder when a live process holds it.
 */
export async function acquireLock(target: string): Promise<() => Promise<void>> {
  const lockPath = `${target}.lock`;
  await ensureDir(path.dirname(target));
  const me: MergeLockHolder = { pid: process.pid, host: hostname(), since: new Date().toISOString() };
  const myStart = processStartTime(process.pid);
  if (myStart !== undefined) me.startTime = myStart;
  for (let attempt = 0; attempt < 200; attempt++) {
    try {
      const fh = await open(lockPath, 'wx');
      try {
        await fh.writeFile(JSON.stringify(me));
        await fh.sync();
      } finally {
        await fh.close();
      }
      return async () => {
        await rm(lockPath, { force: true });
      };
    } catch (e: unknown) {
      if (!isErrno(e, 'EEXIST')) throw e;
      let holder: MergeLockHolder = {};
      let text = '';
      try {
        text = await readFile(lockPath, 'utf8');
        holder = JSON.parse(text) as typeof holder;
      } catch (err: unknown) {
        if (isErrno(err, 'ENOENT')) continue; // released meanwhile
        // a lock file cut short by a crash while it was written: treat as stale below
      }
      const gone = holderGone(holder, hostname());
      if (gone !== undefined) {
        log().warn({ lockPath, holder, why: gone }, 'removing a stale lock left by a process that no longer runs');
        if (!(await removeStale(lockPath, text))) await delay(5 + Math.random() * 20);
        continue;
      }
      throw new DatasetMergeError(
        `${target} is locked by process ${String(holder.pid)} on ${String(holder.host)} since ${String(holder.since)}; ` +
          `if no merge or rollback is running, remove ${lockPath}`,
      );
    }
  }
  throw new DatasetMergeError(`cannot take the lock ${lockPath}`);
}

/** A breaker older than this was left by a process that died while clearing a stale lock. */
const BREAKER_STALE_MS = 30_000;

/**
 * Removes the stale lock whose content was `judged`, under `<lock>.break` (taken with
 * O_EXCL): the lock is read again there and removed only if it is still that one. Nothing but
 * a breaker holder removes a lock it does not hold, so no other process can replace it between
 * that read and the removal. Returns false when another process holds the breaker.
 */
async function removeStale(lockPath: string, judged: string): Promise<boolean> {
  const breaker = `${lockPath}.break`;
  try {
    await (await open(breaker, 'wx')).close();
  } catch (e: unknown) {
    if (!isErrno(e, 'EEXIST')) throw e;
    const age = await stat(breaker).then(
      (st) => Date.now() - st.mtimeMs,
      () => 0,
    );
    if (age > BREAKER_STALE_MS) await rm(breaker, { force: true });
    return false;
  }
  try {
    const now = await readFile(lockPath, 'utf8').catch((e: unknown) => {
      if (isErrno(e, 'ENOENT')) return null;
      throw e;
    });
    if (now === judged) await rm(lockPath, { force: true });
    return true;
  } finally {
    await rm(breaker, { force: true });
  }
}

/** Why the holder of a lock no longer runs, or undefined when it may still run. */
function holderGone(holder: MergeLockHolder, host: string): string | undefined {
  if (holder.host !== undefined && holder.host !== host) return undefined; // cannot tell from here
  if (typeof holder.pid !== 'number') return 'the lock file names no process';
  if (!isProcessAlive(holder.pid)) return `process ${holder.pid} no longer runs`;
  if (holder.startTime === undefined) return undefined;
  const now = processStartTime(holder.pid);
  if (now !== undefined && now !== holder.startTime) {
    return `process ${holder.pid} is another process now (started at ${now}, the holder at ${holder.startTime}): the PID was reused`;
  }
  return undefined;
}

/**
 * The start time of process `pid` (field 22 of /proc/<pid>/stat), or undefined where there is
 * no /proc (not Linux) or the process is gone. Two processes that had the same PID have
 * different start times.
 */
export function processStartTime(pid: number): string | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // Field 2 (comm) is in parentheses and may itself hold spaces and ')': fields 3… follow the last ')'.
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const start = fields[22 - 3];
  return start !== undefined && /^\d+$/.test(start) ? start : undefined;
}
