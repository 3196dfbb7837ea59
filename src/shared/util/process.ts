/**
 * Other processes: running a short helper program (Python probes, nvidia-smi) and collecting its
 * output with a deadline, and asking whether a process of this machine still runs.
 */
import { spawn } from 'node:child_process';

import { isErrno } from './errno.js';

/**
 * Whether process `pid` of this machine runs (signal 0 reaches it, or it exists but belongs to
 * another user: EPERM). False once it is gone (ESRCH) or when `pid` is no pid at all.
 */
export function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e: unknown) {
    return isErrno(e, 'EPERM');
  }
}

/** How a {@link runCaptured} program ended, with its whole output. */
export interface CapturedRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs `command args` without a shell, fed `stdin` (else an empty stdin), and resolves when it exits; it is killed
 * (SIGKILL) after `timeoutMs`. Rejects with the spawn error (e.g. `ENOENT`) when it cannot start.
 */
export function runCaptured(
  command: string,
  args: readonly string[],
  opts: { timeoutMs: number; cwd?: string; env?: NodeJS.ProcessEnv; stdin?: string },
): Promise<CapturedRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, [...args], {
      stdio: ['pipe', 'pipe', 'pipe'],
      ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }),
      ...(opts.env === undefined ? {} : { env: opts.env }),
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({
        code,
        signal,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      });
    });
    // A child that exits before reading all of stdin must not fail the caller with EPIPE.
    child.stdin.on('error', () => undefined);
    child.stdin.end(opts.stdin ?? '');
  });
}
