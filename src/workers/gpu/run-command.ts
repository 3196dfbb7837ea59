import { spawn } from 'node:child_process';
import { createWriteStream, readdirSync, readFileSync } from 'node:fs';

/** How a training command ended. */
export interface CommandExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The command could not be started (ENOENT, EACCES): why. */
  spawnError: string | null;
  /** It was stopped by {@link RunningCommand.stop}. */
  stopped: boolean;
  /** SIGKILL was needed after the grace period. */
  killed: boolean;
}

/** A training command running in its own process group. */
export interface RunningCommand {
  pid: number | undefined;
  /** Resolves when the command has exited and its output is written to the log. */
  exited: Promise<CommandExit>;
  /** SIGTERM to the whole group, then SIGKILL after `graceMs` if anything of it is left. */
  stop(graceMs: number): Promise<void>;
}

export interface RunCommandOptions {
  argv: readonly string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
  /** File the command's stdout and stderr are appended to, as they come. */
  logFile: string;
  /** Called with each output line (split on `\n` and `\r`, so progress bars count), in order. */
  onLine(line: string, stream: 'stdout' | 'stderr'): void;
}

/** Sends a signal to a process group; false when the group no longer exists. */
export function signalGroup(pgid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch (e: unknown) {
    if ((e as NodeJS.ErrnoException).code === 'ESRCH') return false;
    throw e;
  }
}

/**
 * Whether any process of the group is alive. Signal 0 also answers for a killed process whose
 * new parent has not reaped it yet (a zombie; in a container whose first process reaps nothing,
 * never), so on Linux the group's members are read from /proc and zombies do not count.
 */
export function groupAlive(pgid: number): boolean {
  if (!signalGroup(pgid, 0)) return false;
  let names: string[];
  try {
    names = readdirSync('/proc');
  } catch {
    return true;
  }
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue;
    }
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[2]) === pgid && fields[0] !== 'Z') return true;
  }
  return false;
}

/** How long a killed group is waited for: SIGKILL is delivered at once, the exit takes a moment. */
const KILL_WAIT_MS = 5_000;

async function waitGroupGone(pgid: number, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline && groupAlive(pgid)) await new Promise((r) => setTimeout(r, 100));
}

function lineSplitter(onLine: (line: string) => void): { push(chunk: Buffer): void; end(): void } {
  let rest = '';
  return {
    push(chunk) {
      const parts = (rest + chunk.toString('utf8')).split(/\r\n|\n|\r/);
      rest = parts.pop() ?? '';
      for (const p of parts) onLine(p);
    },
    end() {
      if (rest !== '') onLine(rest);
      rest = '';
    },
  };
}

/**
 * Starts `argv` without a shell, as the leader of a new process group (so that stopping it
 * reaches every process it started: torchrun's ranks, dataloader workers), its output appended
 * to `logFile` and split into lines for `onLine`.
 */
export function runCommand(o: RunCommandOptions): RunningCommand {
  const log = createWriteStream(o.logFile, { flags: 'a' });
  const [file, ...args] = o.argv;
  const child = spawn(file ?? '', args, { cwd: o.cwd, env: o.env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let stopped = false;
  let killed = false;
  let spawnError: string | null = null;
  const out = lineSplitter((l) => o.onLine(l, 'stdout'));
  const err = lineSplitter((l) => o.onLine(l, 'stderr'));
  child.stdout.on('data', (b: Buffer) => {
    log.write(b);
    out.push(b);
  });
  child.stderr.on('data', (b: Buffer) => {
    log.write(b);
    err.push(b);
  });
  const exited = new Promise<CommandExit>((resolve) => {
    child.on('error', (e: NodeJS.ErrnoException) => {
      spawnError = `${file ?? ''}: ${e.code === 'ENOENT' ? 'command not found' : e.message}`;
    });
    child.on('close', (code, signal) => {
      out.end();
      err.end();
      if (spawnError !== null) log.write(`tokenmill: ${spawnError}\n`);
      log.end(() => resolve({ code, signal, spawnError, stopped, killed }));
    });
  });
  return {
    pid: child.pid,
    exited,
    async stop(graceMs) {
      const pgid = child.pid;
      if (pgid === undefined) return;
      stopped = true;
      if (!signalGroup(pgid, 'SIGTERM')) return;
      // The leader's exit is not enough: wait for the whole group.
      await waitGroupGone(pgid, graceMs);
      if (groupAlive(pgid)) {
        killed = true;
        signalGroup(pgid, 'SIGKILL');
        // Resolves once the group is gone, not merely signalled (bounded: a process stuck in
        // the kernel may outlive it).
        await waitGroupGone(pgid, KILL_WAIT_MS);
      }
    },
  };
}
