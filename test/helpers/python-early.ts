// A test/python script started before its input is ready: it imports transformers (seconds) and
// does what its arguments ask (e.g. loads tokenizers) while the test builds the input, then reads
// that input as JSON on stdin and prints JSON.
import { spawn } from 'node:child_process';
import path from 'node:path';

import { ensurePythonEnv, PYTHON_ENV, REPO_ROOT } from './python.js';

/** A started script: `send` writes its input, closes stdin, and resolves to its parsed output. */
export interface StartedPython {
  send<T>(stdinJson: unknown): Promise<T>;
  /** Kills it if it still runs (a test that failed before `send`). */
  stop(): void;
}

/** Starts `script` (in test/python) with the main environment's python; killed after `timeoutMs`. */
export async function startPythonJson(
  script: string,
  args: readonly string[],
  opts: { timeoutMs: number },
): Promise<StartedPython> {
  const python = await ensurePythonEnv();
  const child = spawn(python, [path.join(REPO_ROOT, 'test', 'python', script), ...args], {
    cwd: REPO_ROOT,
    env: PYTHON_ENV,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on('data', (b: Buffer) => out.push(b));
  child.stderr.on('data', (b: Buffer) => err.push(b));
  child.stdin.on('error', () => undefined);
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs);
  timer.unref();
  const done = new Promise<string>((resolve, reject) => {
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const stdout = Buffer.concat(out).toString('utf8');
      if (code === 0) resolve(stdout);
      else {
        const how = signal === null ? String(code) : `${String(code)} (${signal})`;
        reject(new Error(`python ${script} exited ${how}:\n${Buffer.concat(err).toString('utf8').slice(-10_000)}`));
      }
    });
  });
  // Until `send`, a failure is only kept; `send` reports it.
  done.catch(() => undefined);
  return {
    async send<T>(stdinJson: unknown): Promise<T> {
      child.stdin.end(JSON.stringify(stdinJson));
      const stdout = await done;
      try {
        return JSON.parse(stdout) as T;
      } catch (e: unknown) {
        throw new Error(`python ${script} did not print JSON: ${stdout.slice(0, 2000)}`, { cause: e });
      }
    },
    stop(): void {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}
