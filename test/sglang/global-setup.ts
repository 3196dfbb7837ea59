// Global setup of the real-SGLang suite (vitest.sglang.config.ts): one real server for every test
// file, started before the first and killed (its whole process group) after the last. Without an
// installed server it starts nothing and the files skip, saying why in one line.
import { existsSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { TestProject } from 'vitest/node';
import { missingReason, realSglangDir, startRealSglang } from '../helpers/real-sglang.js';

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = realSglangDir();
  const missing = missingReason(dir);
  if (missing !== undefined) {
    process.stdout.write(`test:sglang skipped: ${missing}\n`);
    project.provide('realSglang', { dir, url: '', port: 0, skip: missing });
    return async () => undefined;
  }
  const running = process.env['TOKENMILL_REAL_SGLANG_URL'];
  if (running !== undefined && running !== '') {
    // A server started by hand (DIR/serve.sh PORT): used as it is, left running after.
    const port = Number(new URL(running).port);
    process.stdout.write(`test:sglang: the real SGLang at ${running} (TOKENMILL_REAL_SGLANG_URL)\n`);
    project.provide('realSglang', { dir, url: running.replace(/\/+$/, ''), port, skip: '' });
    return async () => undefined;
  }
  const started = Date.now();
  const server = await startRealSglang({ dir });
  process.stdout.write(
    `test:sglang: real SGLang on ${server.url} (started in ${((Date.now() - started) / 1000).toFixed(0)} s, log ${server.log})\n`,
  );
  project.provide('realSglang', { dir, url: server.url, port: server.port, skip: '' });
  return async () => {
    // A test may have restarted the server on the same port: kill the group its pid file names now.
    const pidFile = path.join(dir, `server-${server.port}.pid`);
    const pgid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8').trim()) : server.pgid;
    for (const g of new Set([server.pgid, pgid])) {
      try {
        if (Number.isInteger(g) && g > 1) process.kill(-g, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    rmSync(pidFile, { force: true });
  };
}
