import { spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';

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

/** Whether any process of the group is alive (signal 0). */
export function groupAlive(pgid: number): boolean {
  return signalGroup(pgid, 0);
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
      const deadline = Date.now() + graceMs;
      // The leader's exit is not enough: wait for the whole group.
      while (Date.now() < deadline && groupAlive(pgid)) await new Promise((r) => setTimeout(r, 100));
      if (groupAlive(pgid)) {
        killed = true;
        signalGroup(pgid, 'SIGKILL');
      }
    },
  };
}
