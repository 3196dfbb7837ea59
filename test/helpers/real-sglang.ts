// A real SGLang server (0.5.23 on CPU, a tiny random-weight Qwen3 with the real Qwen3 tokenizer)
// for test/sglang: installed by scripts/setup-sglang.sh into the cache folder below, started with
// its serve.sh in a process group of its own on a free loopback port, waited for with a bound, and
// stopped by killing the whole group.
//
// vitest.sglang.config.ts starts one server for the suite (test/sglang/global-setup.ts) and gives
// its address to the test files (`realSglang()`); where none is installed, every file skips with
// the one-line reason `skipReason()` gives.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { inject } from 'vitest';

/** What the suite's global setup gives the test files. */
export interface RealSglangInfo {
  /** The install folder (serve.sh, venv, tiny-qwen3, tok). */
  dir: string;
  /** `http://127.0.0.1:PORT` of the shared server; empty when skipped. */
  url: string;
  port: number;
  /** Why the suite skips (no server installed); empty when it runs. */
  skip: string;
}

declare module 'vitest' {
  export interface ProvidedContext {
    realSglang: RealSglangInfo;
  }
}

/** Where scripts/setup-sglang.sh installs: $TOKENMILL_REAL_SGLANG_DIR, else the user's cache folder. */
export function realSglangDir(): string {
  const env = process.env['TOKENMILL_REAL_SGLANG_DIR'];
  if (env !== undefined && env !== '') return path.resolve(env);
  const cache = process.env['XDG_CACHE_HOME'] ?? path.join(os.homedir(), '.cache');
  return path.join(cache, 'tokenmill', 'real-sglang');
}

/** Why the real server cannot run here, or undefined when it is installed. */
export function missingReason(dir = realSglangDir()): string | undefined {
  for (const f of ['serve.sh', 'venv/bin/python', 'tiny-qwen3/model.safetensors']) {
    if (!existsSync(path.join(dir, f)))
      return `no real SGLang installed in ${dir} (${f} missing; run bash scripts/setup-sglang.sh)`;
  }
  return undefined;
}

/** The model folder the server serves; it holds the real Qwen3 tokenizer.json and tokenizer_config.json. */
export function modelDir(dir = realSglangDir()): string {
  return path.join(dir, 'tiny-qwen3');
}

/** A free loopback port (bound, then released). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr !== null ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}

export interface RealSglangServer {
  url: string;
  port: number;
  /** Process group id of the server (python and its scheduler / detokenizer children). */
  pgid: number;
  /** The server's log file. */
  log: string;
  /** kill -9 of the whole process group, then waits (bounded) until the port no longer answers. */
  kill(): Promise<void>;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Whether the group (or its leader: right after serve.sh returns, the leader may not have called
 * setsid yet, so the group does not exist for a moment) is alive.
 */
function groupAlive(pgid: number): boolean {
  for (const target of [-pgid, pgid]) {
    try {
      process.kill(target, 0);
      return true;
    } catch {
      // not this one
    }
  }
  return false;
}

/** SIGKILL to the group, and to its leader in case it has not made the group yet. */
function killGroup(pgid: number): void {
  for (const target of [-pgid, pgid]) {
    try {
      process.kill(target, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

async function healthy(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2_000) });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

/** The last lines of a log file, for an error message. */
function tail(file: string, lines = 8): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/**
 * Starts `DIR/serve.sh PORT` (a free port unless given; `args` go to launch_server) and waits
 * until `/health` answers 200, at most `timeoutMs`; throws, naming the log, when the server exits
 * first or never answers (its group is killed then).
 */
export async function startRealSglang(
  options: { dir?: string; port?: number; args?: string[]; timeoutMs?: number } = {},
): Promise<RealSglangServer> {
  const dir = options.dir ?? realSglangDir();
  const missing = missingReason(dir);
  if (missing !== undefined) throw new Error(missing);
  const port = options.port ?? (await freePort());
  const url = `http://127.0.0.1:${port}`;
  const pidFile = path.join(dir, `server-${port}.pid`);
  const log = path.join(dir, `server-${port}.log`);
  rmSync(pidFile, { force: true });
  rmSync(log, { force: true });
  const code = await new Promise<number>((resolve, reject) => {
    const c = spawn('bash', [path.join(dir, 'serve.sh'), String(port), '0', ...(options.args ?? [])], {
      stdio: 'ignore',
    });
    c.once('error', reject);
    c.once('exit', (code) => resolve(code ?? -1));
  });
  if (code !== 0) throw new Error(`${dir}/serve.sh ${port} exited ${code}; see ${log}`);
  const pgid = Number(readFileSync(pidFile, 'utf8').trim());
  if (!Number.isInteger(pgid) || pgid <= 1)
    throw new Error(`${pidFile}: expected a process group id, got ${JSON.stringify(readFileSync(pidFile, 'utf8'))}`);
  const server: RealSglangServer = {
    url,
    port,
    pgid,
    log,
    async kill() {
      killGroup(pgid);
      const deadline = Date.now() + 15_000;
      while ((groupAlive(pgid) || (await healthy(url))) && Date.now() < deadline) await sleep(100);
      rmSync(pidFile, { force: true });
    },
  };
  const timeoutMs = options.timeoutMs ?? 180_000;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await healthy(url)) return server;
    if (!groupAlive(pgid))
      throw new Error(`the real SGLang server on port ${port} exited while starting; ${log} ends:\n${tail(log)}`);
    if (Date.now() > deadline) {
      await server.kill();
      throw new Error(
        `the real SGLang server on port ${port} did not answer ${url}/health within ${timeoutMs / 1000} s; ${log} ends:\n${tail(log)}`,
      );
    }
    await sleep(500);
  }
}

/**
 * kill -9 of the process group named by `DIR/server-PORT.pid` (the server on PORT, whoever started
 * it), then waits until the group is gone and the port no longer answers (at most 15 s).
 */
export async function killServerOnPort(port: number, dir = realSglangDir()): Promise<void> {
  const pidFile = path.join(dir, `server-${port}.pid`);
  const pgid = Number(readFileSync(pidFile, 'utf8').trim());
  if (!Number.isInteger(pgid) || pgid <= 1) throw new Error(`${pidFile}: expected a process group id`);
  killGroup(pgid);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 15_000;
  while ((groupAlive(pgid) || (await healthy(url))) && Date.now() < deadline) await sleep(100);
  if (groupAlive(pgid))
    throw new Error(`the real SGLang server's process group ${pgid} (port ${port}) is still alive 15 s after kill -9`);
}

/** The shared server of the suite, as its global setup gave it. */
export function realSglang(): RealSglangInfo {
  return inject('realSglang');
}

/** The one-line reason the suite skips, or '' when the real server runs. */
export function skipReason(): string {
  try {
    return inject('realSglang').skip;
  } catch {
    return 'not run under vitest.sglang.config.ts (npm run test:sglang)';
  }
}
