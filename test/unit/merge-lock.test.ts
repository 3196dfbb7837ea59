// The merge lock when several processes find the same stale lock at once: exactly one of them
// takes it; the others see it held, never a second holder.
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { acquireLock } from '../../src/shared/hf-dataset/merge/lock.js';
import { useTempDir } from '../helpers/temp.js';

/** The PID of a process that has exited. */
function deadPid(): number {
  const child = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))'], { encoding: 'utf8' });
  return Number(child.stdout);
}

describe('merge lock', () => {
  it('many takers of one stale lock: exactly one holds it, the others are told who does', async () => {
    for (let round = 0; round < 20; round++) {
      const dir = useTempDir('tm-lock-');
      const target = path.join(dir, 'train-dataset');
      writeFileSync(
        `${target}.lock`,
        JSON.stringify({ pid: deadPid(), host: hostname(), since: '2020-01-01T00:00:00Z' }),
      );
      // Staggered by a few event-loop turns, so that one taker reads the stale lock while another
      // has already replaced it.
      const takers = await Promise.allSettled(
        Array.from({ length: 6 }, async (_, i) => {
          for (let k = 0; k < i * (round % 4); k++) await new Promise((r) => setImmediate(r));
          return acquireLock(target);
        }),
      );
      const held = takers.filter((t) => t.status === 'fulfilled');
      expect(held).toHaveLength(1);
      for (const t of takers) {
        if (t.status === 'rejected')
          expect(String(t.reason)).toMatch(new RegExp(`is locked by process ${process.pid} on `));
      }
      expect(JSON.parse(readFileSync(`${target}.lock`, 'utf8'))).toMatchObject({ pid: process.pid });
    }
  });

  it('a lock whose holder runs is not taken', async () => {
    const dir = useTempDir('tm-lock-');
    const target = path.join(dir, 't');
    const release = await acquireLock(target);
    await expect(acquireLock(target)).rejects.toThrow(/is locked by process/);
    await release();
    await (
      await acquireLock(target)
    )();
  });
});
