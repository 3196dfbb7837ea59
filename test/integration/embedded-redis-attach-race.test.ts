// docs/reliability.md, "a command attaching while the owner stops": a process that attaches to
// the embedded redis-server at the moment its owner stops it must not be left with a server
// that is gone. The test hook `beforeStopForTest` opens the window deterministically: the
// owner has decided to stop (no client connected) and starts a real child process that attaches
// right then, before the owner signals the server.
import { spawn } from 'node:child_process';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { EmbeddedRedis } from '../../src/shared/index.js';
import { repoRoot } from '../helpers/pipeline.js';
import { quietLogger } from '../helpers/redis.js';
import { useTempDir } from '../helpers/temp.js';

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('attaching to the embedded redis while its owner stops it', () => {
  it('the newcomer never hangs on a server that is gone: it is kept, or it starts its own on the same AOF', async () => {
    const dataDir = useTempDir('tokenmill-attach-race-');
    let output = '';
    let exited: Promise<number | null> | undefined;
    const owner = new EmbeddedRedis({
      dataDir,
      keepWhileInUse: true,
      logger: quietLogger(),
      beforeStopForTest: async () => {
        const child = spawn(
          process.execPath,
          ['--import', 'tsx', path.join(repoRoot, 'test/helpers/embedded-attach-child.ts'), dataDir],
          {
            cwd: repoRoot,
            stdio: ['ignore', 'pipe', 'pipe'],
          },
        );
        child.stdout.on('data', (d: Buffer) => (output += d.toString()));
        child.stderr.on('data', (d: Buffer) => (output += d.toString()));
        exited = new Promise((resolve) => child.on('exit', (c) => resolve(c)));
        // Give the child the time to attach (a child process starts in about a second).
        const deadline = Date.now() + 6_000;
        while (!output.includes('attached') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
      },
    });
    await owner.start();
    const ownerPid = owner.pid ?? -1;
    await owner.stop();
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('still running'), 30_000))]);
    expect(output).toMatch(/^ok$/m);
    expect(code, output).toBe(0);
    expect(isAlive(ownerPid)).toBe(false);
    // Nothing left behind: the child stopped the server it used.
    expect(await fs.readdir(dataDir)).not.toContain('redis.pid');
  }, 60_000);
});
