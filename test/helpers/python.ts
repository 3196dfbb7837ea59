// The Python reference environments, built by scripts/setup-python.sh at the repository root:
// - `main`: .venv from scripts/requirements.txt (transformers, the current `datasets`), for the
//   parity tests;
// - `datasets3`: .venv-datasets3 from scripts/requirements-datasets3.txt (`datasets` 3.6), for
//   the tests that older training stacks can load what tokenmill writes.
// - `trainers`: .venv-trainers from scripts/requirements-trainers.txt (+ `.nodeps.txt`): the
//   trainers' own data code (SpecForge 0.2.0, speculators 0.9.0) on CPU torch, for the tests that
//   those trainers load tokenmill's output as it is.
// A fresh clone has none; the first test that needs one builds it (a minute or two each), and
// setup-python.sh serializes concurrent builds on a lock file. If it cannot be built, the test
// fails with pip's output.
import { runCaptured, type CapturedRun } from '../../src/shared/util/process.js';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = path.resolve(fileURLToPath(new URL('../..', import.meta.url)));
const SETUP_SCRIPT = path.join(REPO_ROOT, 'scripts', 'setup-python.sh');
const PYTHON_SCRIPTS = path.join(REPO_ROOT, 'test', 'python');

/** The Python environments setup-python.sh builds. */
export type PythonEnvName = 'main' | 'datasets3' | 'trainers';

const ENVS: Record<PythonEnvName, { venv: string; requirements: string }> = {
  main: { venv: '.venv', requirements: 'requirements.txt' },
  datasets3: { venv: '.venv-datasets3', requirements: 'requirements-datasets3.txt' },
  trainers: { venv: '.venv-trainers', requirements: 'requirements-trainers.txt' },
};

function pythonOf(env: PythonEnvName): string {
  return path.join(REPO_ROOT, ENVS[env].venv, 'bin', 'python');
}

export const VENV_PYTHON = pythonOf('main');

const SETUP_TIMEOUT_MS = 15 * 60_000;

/** Environment for every Python child: no hub access, quiet transformers, UTF-8 I/O. */
export const PYTHON_ENV: NodeJS.ProcessEnv = {
  ...process.env,
  HF_HUB_OFFLINE: '1',
  TRANSFORMERS_OFFLINE: '1',
  HF_DATASETS_OFFLINE: '1',
  TRANSFORMERS_VERBOSITY: 'error',
  PYTHONIOENCODING: 'utf-8',
  PYTHONUTF8: '1',
  PYTHONDONTWRITEBYTECODE: '1',
};

export type ProcessResult = CapturedRun;

/** Runs a program to completion, feeding `stdin`, killing it after `timeoutMs`. */
export function runProcess(
  command: string,
  args: readonly string[],
  opts: { stdin?: string; timeoutMs: number; env?: NodeJS.ProcessEnv; cwd?: string },
): Promise<ProcessResult> {
  return runCaptured(command, args, {
    timeoutMs: opts.timeoutMs,
    cwd: opts.cwd ?? REPO_ROOT,
    env: opts.env ?? PYTHON_ENV,
    stdin: opts.stdin ?? '',
  });
}

function envIsCurrent(env: PythonEnvName): boolean {
  const python = pythonOf(env);
  const stamp = path.join(REPO_ROOT, ENVS[env].venv, '.requirements.sha256');
  if (!existsSync(python) || !existsSync(stamp)) return false;
  const requirements = path.join(REPO_ROOT, 'scripts', ENVS[env].requirements);
  // setup-python.sh installs `<name>.nodeps.txt` after the requirements file; its stamp covers both.
  const noDeps = requirements.replace(/\.txt$/, '.nodeps.txt');
  const hash = createHash('sha256').update(readFileSync(requirements));
  if (existsSync(noDeps)) hash.update(readFileSync(noDeps));
  const want = hash.digest('hex');
  return readFileSync(stamp, 'utf8').trim() === want;
}

const envPromises = new Map<PythonEnvName, Promise<string>>();

async function setUp(env: PythonEnvName): Promise<string> {
  if (envIsCurrent(env)) return pythonOf(env);
  const r = await runProcess('bash', [SETUP_SCRIPT, env], { timeoutMs: SETUP_TIMEOUT_MS, env: process.env });
  if (r.code !== 0 || !envIsCurrent(env)) {
    const output = `${r.stdout}\n${r.stderr}`
      .split('\n')
      // pip's notes about extra local indexes that do not hold a package are noise here.
      .filter((line) => !line.includes('is ignored: it is neither a file nor a directory'))
      .join('\n')
      .slice(-20_000);
    throw new Error(
      `scripts/setup-python.sh ${env} failed (exit ${String(r.code)}${r.signal === null ? '' : `, ${r.signal}`}); ` +
        `the Python environment is required for this test:\n${output}`,
    );
  }
  return pythonOf(env);
}

/**
 * The python of environment `env` (default `main`), building it first when it is missing or
 * stale. Built once per test process; a failed build fails every later caller in that process
 * too, without retrying pip.
 */
export function ensurePythonEnv(env: PythonEnvName = 'main'): Promise<string> {
  let p = envPromises.get(env);
  if (p === undefined) {
    p = setUp(env);
    envPromises.set(env, p);
  }
  return p;
}

/**
 * Runs a script from test/python (or an absolute path) with the python of `opts.env` (default
 * `main`), `stdinJson` serialized on its stdin. Resolves to stdout; rejects with stderr when it exits non-zero.
 */
export async function runPython(
  script: string,
  args: readonly string[] = [],
  stdinJson?: unknown,
  opts: { timeoutMs?: number; env?: PythonEnvName } = {},
): Promise<string> {
  const python = await ensurePythonEnv(opts.env);
  const scriptPath = path.isAbsolute(script) ? script : path.join(PYTHON_SCRIPTS, script);
  const r = await runProcess(python, [scriptPath, ...args], {
    stdin: stdinJson === undefined ? '' : JSON.stringify(stdinJson),
    timeoutMs: opts.timeoutMs ?? 120_000,
  });
  if (r.code !== 0) {
    throw new Error(
      `python ${path.relative(REPO_ROOT, scriptPath)} exited ${String(r.code)}${r.signal === null ? '' : ` (${r.signal})`}:\n${r.stderr.slice(-10_000)}`,
    );
  }
  return r.stdout;
}

/** {@link runPython}, with stdout parsed as JSON. */
export async function runPythonJson<T>(
  script: string,
  args: readonly string[] = [],
  stdinJson?: unknown,
  opts: { timeoutMs?: number; env?: PythonEnvName } = {},
): Promise<T> {
  const stdout = await runPython(script, args, stdinJson, opts);
  try {
    return JSON.parse(stdout) as T;
  } catch (e: unknown) {
    throw new Error(`python ${script} did not print JSON: ${stdout.slice(0, 2000)}`, { cause: e });
  }
}
