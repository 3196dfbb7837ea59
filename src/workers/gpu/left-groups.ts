/**
 * The process groups a dead worker left running (a training command, eval servers), killed by
 * the next worker on the same machine — but only when the recorded pid is still that process.
 *
 * A pid read back from Redis may name another process by now: the kernel reuses pids, and after
 * a container or machine restart the number may be any process group at all. So each group is
 * recorded with its leader's identity ({@link recordedIdentity}): on Linux the leader's start
 * time (field 22 of `/proc/<pid>/stat`, clock ticks since boot), the boot id
 * (`/proc/sys/kernel/random/boot_id`) and the host name. {@link killLeftGroup} sends SIGKILL to
 * the group only when all three match the process that has that pid now; otherwise it kills
 * nothing and says why.
 */
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { groupAlive, signalGroup } from './run-command.js';

/** What tells one process from another that later got the same pid. */
export interface ProcessIdentity {
  /** Field 22 of `/proc/<pid>/stat`: when it started, in clock ticks since boot. */
  startTicks: string;
  /** `/proc/sys/kernel/random/boot_id`: changes at every boot (a container restart keeps the host's). */
  bootId: string;
  host: string;
}

function readBootId(): string | null {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim() || null;
  } catch {
    return null;
  }
}

/** The identity of the process `pid` now; null when it does not exist or the system has no /proc. */
export function processIdentity(pid: number): ProcessIdentity | null {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  // "pid (comm) state ppid …": comm may hold spaces and parentheses; field 3 (state) follows the last ")".
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const startTicks = fields[22 - 3];
  const bootId = readBootId();
  if (startTicks === undefined || !/^\d+$/.test(startTicks) || bootId === null) return null;
  return { startTicks, bootId, host: hostname() };
}

/** `pid <pid> start <ticks> boot <boot id> host <name>`: how a group's leader is recorded. */
export function formatIdentity(pid: number, id: ProcessIdentity): string {
  return `pid ${pid} start ${id.startTicks} boot ${id.bootId} host ${id.host}`;
}

/** The record of the process `pid` as it is now ({@link formatIdentity}); '' when it cannot be read. */
export function recordedIdentity(pid: number | undefined): string {
  if (pid === undefined) return '';
  const id = processIdentity(pid);
  return id === null ? '' : formatIdentity(pid, id);
}

/** Parses a {@link formatIdentity} record; null when it is not one. */
export function parseIdentity(text: string): { pid: number; identity: ProcessIdentity } | null {
  const m = /^pid (\d+) start (\d+) boot (\S+) host (.+)$/.exec(text.trim());
  if (m === null) return null;
  return { pid: Number(m[1]), identity: { startTicks: m[2] ?? '', bootId: m[3] ?? '', host: m[4] ?? '' } };
}

/** What {@link killLeftGroup} did, and why. */
export type LeftGroupOutcome =
  { killed: true; pgid: number; reason: string } | { killed: false; pgid: number; reason: string };

const KILL_WAIT_MS = 5_000;

/**
 * Kills the process group `pgid` that a dead worker recorded as `recorded` ({@link formatIdentity}),
 * when its leader is still that process: same host, same boot, same start time. A group whose
 * pid now belongs to another process, a record from another machine or boot, a leader that is
 * gone, or a record without an identity: nothing is killed, and the reason says which.
 */
export async function killLeftGroup(pgid: number, recorded: string | null | undefined): Promise<LeftGroupOutcome> {
  const skip = (reason: string): LeftGroupOutcome => ({ killed: false, pgid, reason });
  if (!Number.isInteger(pgid) || pgid <= 1) return skip(`pid ${pgid} is not a process group to kill`);
  const rec = recorded === null || recorded === undefined ? null : parseIdentity(recorded);
  if (rec === null || rec.pid !== pgid)
    return skip(`no identity was recorded with pid ${pgid}, so it cannot be told from another process: not killed`);
  const now = processIdentity(pgid);
  const was = rec.identity;
  if (was.host !== hostname()) return skip(`pid ${pgid} was recorded on host ${was.host}, not this one: not killed`);
  if (now === null || !groupAlive(pgid))
    return skip(`the recorded process ${pgid} is gone (its group leader no longer exists): nothing to kill`);
  if (now.bootId !== was.bootId)
    return skip(`the recorded process ${pgid} is gone: the machine has booted since it was recorded; not killed`);
  if (now.startTicks !== was.startTicks)
    return skip(
      `the recorded process ${pgid} is gone: pid ${pgid} now belongs to another process (started at tick ${now.startTicks}, recorded ${was.startTicks}); not killed`,
    );
  signalGroup(pgid, 'SIGKILL');
  const deadline = Date.now() + KILL_WAIT_MS;
  while (Date.now() < deadline && groupAlive(pgid)) await new Promise((r) => setTimeout(r, 100));
  return { killed: true, pgid, reason: `killed process group ${pgid} (its leader's identity matched the record)` };
}
