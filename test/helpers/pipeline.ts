// Helpers for generation tests: prompt files, configs, CLI child processes, and reading back
// what a run wrote.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import type { ConfigInput } from '../../src/shared/index.js';

export const repoRoot = fileURLToPath(new URL('../../', import.meta.url));

export { tempDir, useTempDir } from './temp.js';

/** Writes `n` prompt records (`{"id":"<prefix><i>","prompt":…}`) and returns the file path. */
export function writePrompts(dir: string, name: string, n: number, make?: (i: number) => object): string {
  const file = path.join(dir, `${name}.jsonl`);
  const lines: string[] = [];
  for (let i = 0; i < n; i += 1) {
    lines.push(
      JSON.stringify(
        make?.(i) ?? {
          id: `${name}-${i}`,
          prompt: `Prompt ${i} of ${name}: explain the idea numbered ${i * 13} in a few sentences.`,
        },
      ),
    );
  }
  writeFileSync(file, `${lines.join('\n')}\n`);
  return file;
}

/** Writes a YAML config and returns its path. */
export function writeConfig(dir: string, config: ConfigInput, name = 'tokenmill.yaml'): string {
  const file = path.join(dir, name);
  writeFileSync(file, stringify(config));
  return file;
}

export interface CliProcess {
  child: ChildProcess;
  /** stdout and stderr, interleaved as they came. */
  output(): string;
  /** stdout alone (e.g. a `--json` result). */
  stdout(): string;
  /** Resolves with the exit code (or the signal name). */
  exited: Promise<number | string>;
}

// Children still running when the test process exits (a timed-out test) are killed with it.
const liveChildren = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of liveChildren) c.kill('SIGKILL');
});

/** Kills every CLI child still running; call it in afterAll. */
export async function killCliChildren(): Promise<void> {
  await Promise.all(
    [...liveChildren].map(
      (c) =>
        new Promise<void>((resolve) => {
          c.once('exit', () => resolve());
          c.kill('SIGKILL');
        }),
    ),
  );
}

/** Runs the CLI from source (`node --import tsx src/cli/main.ts …`) as a real child process. */
export function spawnCli(args: string[], options: { cwd?: string } = {}): CliProcess {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      path.join(repoRoot, 'src/cli/main.ts'),
      '--log-level',
      process.env['TOKENMILL_TEST_LOG_LEVEL'] ?? 'warn',
      ...args,
    ],
    {
      cwd: options.cwd ?? repoRoot,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env },
    },
  );
  liveChildren.add(child);
  child.once('exit', () => liveChildren.delete(child));
  let out = '';
  let stdout = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
    stdout += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | string>((resolve) =>
    child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)),
  );
  return { child, output: () => out, stdout: () => stdout, exited };
}

/** Polls `cond` until it is truthy or the deadline passes (then throws with `what`). */
export async function waitFor<T>(
  cond: () => Promise<T> | T,
  what: string,
  timeoutMs = 30_000,
  intervalMs = 50,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** Whether a process of that pid is running (signal 0 reaches it). */
export function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export interface GenerationRecord {
  id: string;
  dataset: string;
  prompt_ids: number[];
  output_ids: number[];
  prompt_tokens: number;
  completion_tokens: number;
  finish_reason: { type: string; matched?: number | string; length?: number };
  endpoint: string;
  worker: string;
  attempt: number;
  ts: string;
}

/** Every line of `<runDir>/<dataset>/generations/*.jsonl`, parsed, in file order. */
export function readGenerations(runDir: string, dataset: string): GenerationRecord[] {
  const dir = path.join(runDir, dataset, 'generations');
  if (!existsSync(dir)) return [];
  const out: GenerationRecord[] = [];
  for (const f of readdirSync(dir)
    .filter((x) => x.endsWith('.jsonl'))
    .sort()) {
    for (const line of readFileSync(path.join(dir, f), 'utf8').split('\n')) {
      if (line.trim() !== '') out.push(JSON.parse(line) as GenerationRecord);
    }
  }
  return out;
}

/** Ids that occur more than once. */
export function duplicates(ids: readonly string[]): string[] {
  const seen = new Set<string>();
  const dup = new Set<string>();
  for (const id of ids) (seen.has(id) ? dup : seen).add(id);
  return [...dup];
}

/** The sample id inside an rid (`<dataset>/<id>#<nonce>`). */
export function sampleIdOfRid(rid: string): string {
  return rid.slice(rid.indexOf('/') + 1, rid.lastIndexOf('#'));
}
