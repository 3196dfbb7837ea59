/**
 * One SGLang server started by the eval step (`eval.server`): its command run without a shell in
 * its own process group, its output in a log file, waited for on `GET /health_generate` with a
 * bound, and stopped (SIGTERM to the group, then SIGKILL) whatever happens. A server that exits
 * before it is healthy, or is not healthy in time, ends in one error naming the command and the
 * end of its log.
 */
import { createServer } from 'node:net';
import { CancelledError, errorMessage } from '../../shared/index.js';
import { runCommand, type RunningCommand } from '../gpu/index.js';
import { EvalError } from './servers.js';

/** Which of the two servers. */
export type ServerRole = 'drafter' | 'baseline';

/** What to start. */
export interface ServerSpec {
  role: ServerRole;
  argv: string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
  /** The port it listens on, on 127.0.0.1 (its `{port}`). */
  port: number;
  /** The config key of the port, for messages (`eval.server.port`). */
  portKey: string;
  logFile: string;
  healthTimeoutMs: number;
  stopGraceMs: number;
}

/** A server that answered `/health_generate`. */
export interface StartedServer {
  role: ServerRole;
  url: string;
  pid: number | undefined;
  argv: string[];
  logFile: string;
  /** SIGTERM to its process group, SIGKILL after the grace period; resolves once it exited. */
  stop(): Promise<void>;
}

/** Lines of a server's output kept for error messages. */
const TAIL_LINES = 8;

/** Whether nothing listens on `port` of 127.0.0.1 (we can bind it). */
export async function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen({ port, host: '127.0.0.1', exclusive: true }, () => probe.close(() => resolve(true)));
  });
}

/** The command as one line for messages, long ones cut. */
export function commandLine(argv: readonly string[]): string {
  const line = argv.join(' ');
  return line.length <= 240 ? line : `${line.slice(0, 237)}…`;
}

async function healthy(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/health_generate`, { signal: AbortSignal.timeout(10_000) });
    await res.arrayBuffer().catch(() => undefined);
    return res.status === 200;
  } catch {
    return false;
  }
}

/**
 * Starts the server of `spec` and waits until `GET /health_generate` answers 200, polling every
 * `pollMs`; throws an EvalError (the server stopped first) when it exits before, is not healthy
 * within `spec.healthTimeoutMs`, or its port is taken; a CancelledError when `signal` aborts.
 */
export async function startServer(
  spec: ServerSpec,
  options: { signal?: AbortSignal; onLine?: (line: string) => void; pollMs?: number } = {},
): Promise<StartedServer> {
  const what = `the ${spec.role} server (eval.server.${spec.role === 'drafter' ? 'command' : 'baselineCommand'}: ${commandLine(spec.argv)})`;
  if (!(await portFree(spec.port)))
    throw new EvalError(
      `eval: ${what} cannot start: port ${spec.port} of 127.0.0.1 is in use already (${spec.portKey}); another server still running?`,
    );
  const tail: string[] = [];
  let running: RunningCommand;
  try {
    running = runCommand({
      argv: spec.argv,
      cwd: spec.cwd,
      env: spec.env,
      logFile: spec.logFile,
      onLine(line) {
        if (line.trim() !== '') tail.push(line.trim());
        if (tail.length > TAIL_LINES) tail.shift();
        options.onLine?.(line);
      },
    });
  } catch (e: unknown) {
    throw new EvalError(`eval: ${what} could not be started: ${errorMessage(e)}`, { cause: e });
  }
  let exit: Awaited<RunningCommand['exited']> | undefined;
  void running.exited.then((x) => (exit = x));
  const url = `http://127.0.0.1:${spec.port}`;
  const stop = async (): Promise<void> => {
    await running.stop(spec.stopGraceMs);
    await running.exited;
  };
  const logged = (): string =>
    `; log ${spec.logFile}${tail.length === 0 ? ' (empty)' : `: ${tail.slice(-4).join(' | ')}`}`;
  const started = Date.now();
  const pollMs = options.pollMs ?? 500;
  for (;;) {
    if (exit !== undefined) {
      const how =
        exit.spawnError ?? (exit.signal !== null ? `killed by ${exit.signal}` : `exit code ${exit.code ?? '?'}`);
      throw new EvalError(`eval: ${what} exited (${how}) before it answered GET /health_generate${logged()}`);
    }
    if (options.signal?.aborted === true) {
      await stop();
      throw new CancelledError(`stopped while starting ${what}`);
    }
    if (await healthy(url)) break;
    if (Date.now() - started > spec.healthTimeoutMs) {
      await stop();
      throw new EvalError(
        `eval: ${what} did not answer GET ${url}/health_generate with 200 within ${(spec.healthTimeoutMs / 1000).toFixed(0)} s (eval.server.healthTimeoutMs); stopped it${logged()}`,
      );
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
  return { role: spec.role, url, pid: running.pid, argv: spec.argv, logFile: spec.logFile, stop };
}
