// The merge lock: `<target>.lock`, held while a merge, rollback or repair runs.
import { hostname } from 'node:os';
import { open, readFile, rm } from 'node:fs/promises';
import path from 'node:path';

import { ensureDir, isErrno } from './fs.js';
import { DatasetMergeError, log } from './merge-common.js';

export async function acquireLock(target: string): Promise<() => Promise<void>> {
  const lockPath = `${target}.lock`;
  await ensureDir(path.dirname(target));
  const me = { pid: process.pid, host: hostname(), since: new Date().toISOString() };
  for (let attempt = 0; attempt < 2; attempt++) {
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
      let holder: { pid?: number; host?: string; since?: string } = {};
      try {
        holder = JSON.parse(await readFile(lockPath, 'utf8')) as typeof holder;
      } catch {
        // a lock file cut short by a crash while it was written: treat as stale below
      }
      const sameHost = holder.host === undefined || holder.host === me.host;
      if (sameHost && (holder.pid === undefined || !processAlive(holder.pid))) {
        log().warn({ lockPath, holder }, 'removing a stale lock left by a process that no longer runs');
        await rm(lockPath, { force: true });
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

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e: unknown) {
    return !isErrno(e, 'ESRCH');
  }
}
