// Temp folders for tests, in one place. Each one is removed when its test (or file, or describe
// block) is over, and any still there when the test process exits (a test that timed out, a file
// whose tests were all filtered out) is removed then.
//
//   const dir = useTempDir('tm-tokenizer-');   // at file or describe level: removed after its tests
//   it('…', () => { const dir = useTempDir(); … })   // in a test: removed when the test ends
//
// `useHarness({ tmp: true })` (fixture.ts) gives one started and removed with the rest of a harness.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, onTestFinished } from 'vitest';

const live = new Set<string>();
process.once('exit', () => {
  for (const dir of live) rmSync(dir, { recursive: true, force: true });
});

/** A temp folder (under the OS's), removed by the returned cleanup, or at the latest when the process exits. */
export function tempDir(prefix = 'tm-test-'): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), prefix));
  live.add(dir);
  return {
    dir,
    cleanup: () => {
      live.delete(dir);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A temp folder removed when the current test finishes (called in a test) or after the tests of
 * the file or describe block it is called in (called outside a test).
 */
export function useTempDir(prefix = 'tm-test-'): string {
  const { dir, cleanup } = tempDir(prefix);
  try {
    onTestFinished(cleanup);
  } catch {
    // Not in a test: the file or describe block owns it.
    afterAll(cleanup);
  }
  return dir;
}
