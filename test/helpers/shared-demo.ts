// One `tokenmill demo` run shared by the test files that only read its output (the trainers'
// loader tests): the demo is the realistic run a user makes first, and at about a minute or more
// on a loaded machine it is the largest cost of those files. The first file to ask runs it (the
// CLI from source, a real child process) into a folder keyed by the code it runs; the others wait
// for it, with a bound, and read the same folder. A file that changes the demo's run (postprocess,
// train --resume) must run its own demo instead.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { repoRoot, spawnCli } from './pipeline.js';

/** The shared demo run: its `--out` folder, the config it leaves, and its `--json` output. */
export interface SharedDemo {
  /** The demo's `--out` folder; the run is `<out>/demo`. */
  out: string;
  /** `<out>/demo/tokenmill.yaml`, the config the demo leaves for the commands that follow it. */
  config: string;
  /** The run folder, `<out>/demo`. */
  runDir: string;
  /** The demo's last `--json` line, parsed. */
  json: unknown;
}

const RUN_TIMEOUT_MS = 15 * 60_000;
const POLL_MS = 1_000;

/**
 * What the demo runs: the checkout (its config names files inside it, such as the bundled
 * tokenizer), the commit, and any change to it in the folders the demo reads.
 */
function codeKey(): string {
  const git = (args: string[]): string =>
    spawnSync('git', args, { cwd: repoRoot, encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 }).stdout ?? '';
  const folders = ['src', 'data', 'trainers', 'bin', 'package-lock.json'];
  const untracked = git(['ls-files', '--others', '--exclude-standard', '--', ...folders])
    .split('\n')
    .filter((f) => f !== '')
    .map(
      (f) => `${f}\0${existsSync(path.join(repoRoot, f)) ? readFileSync(path.join(repoRoot, f)).toString('hex') : ''}`,
    )
    .join('\n');
  return createHash('sha256')
    .update(`${repoRoot}\0`)
    .update(git(['rev-parse', 'HEAD']))
    .update(git(['diff', 'HEAD', '--', ...folders]))
    .update(untracked)
    .digest('hex')
    .slice(0, 16);
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function runDemo(out: string): Promise<unknown> {
  // Slower than the demo's default speed (25), so that a loaded test machine's lag adds little to
  // the budgets' overshoot, which test/integration/demo.test.ts bounds.
  const p = spawnCli(['demo', '--out', out, '--fresh', '--json', '--time-scale', '10']);
  const timer = setTimeout(() => p.child.kill('SIGKILL'), RUN_TIMEOUT_MS);
  const code = await p.exited;
  clearTimeout(timer);
  if (code !== 0) throw new Error(`tokenmill demo exited ${String(code)}:\n${p.output().slice(-4_000)}`);
  return JSON.parse(p.stdout().trim().split('\n').at(-1) ?? '');
}

let shared: Promise<SharedDemo> | undefined;

/**
 * The shared demo run, running it when no test process has yet. Waits at most 15 minutes for
 * another process's run; a run whose process died is taken over.
 */
export function sharedDemo(): Promise<SharedDemo> {
  shared ??= (async () => {
    const base = path.join(os.tmpdir(), `tokenmill-shared-demo-${codeKey()}`);
    const out = path.join(base, 'out');
    const done = path.join(base, 'done.json');
    const lock = path.join(base, 'lock');
    const result = (json: unknown): SharedDemo => ({
      out,
      config: path.join(out, 'demo', 'tokenmill.yaml'),
      runDir: path.join(out, 'demo'),
      json,
    });
    mkdirSync(base, { recursive: true });
    const deadline = Date.now() + RUN_TIMEOUT_MS;
    for (;;) {
      if (existsSync(done)) return result(JSON.parse(readFileSync(done, 'utf8')) as unknown);
      let mine = false;
      try {
        writeFileSync(lock, String(process.pid), { flag: 'wx' });
        mine = true;
      } catch {
        const holder = Number(readFileSync(lock, 'utf8'));
        if (Number.isInteger(holder) && holder > 0 && !pidAlive(holder)) rmSync(lock, { force: true });
      }
      if (mine) {
        try {
          const json = await runDemo(out);
          writeFileSync(`${done}.tmp`, JSON.stringify(json));
          renameSync(`${done}.tmp`, done);
          return result(json);
        } finally {
          rmSync(lock, { force: true });
        }
      }
      if (Date.now() > deadline) throw new Error(`the shared demo run in ${base} did not finish within 15 minutes`);
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  })();
  return shared;
}
