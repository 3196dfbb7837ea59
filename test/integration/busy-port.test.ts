/**
 * `tokenmill sim` and `tokenmill dashboard` on a port something else holds: one line naming
 * the address and the option that changes it, exit 1 — not `EADDRINUSE` and a stack trace.
 */
import { createServer, type Server } from 'node:net';
import path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli } from '../helpers/pipeline.js';

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-busy-port-', cli: true });

let holder: Server;
let port: number;

beforeAll(async () => {
  holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
  port = (holder.address() as { port: number }).port;
});
afterAll(async () => {
  await new Promise<void>((resolve) => holder.close(() => resolve()));
});

function expectOneClearLine(output: string, what: string, option: RegExp): void {
  const lines = output
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('tokenmill'));
  expect(lines, output).toHaveLength(1);
  expect(lines[0]).toContain(`${what} cannot listen on 127.0.0.1:${port}: the port is already in use (EADDRINUSE)`);
  expect(lines[0]).toMatch(option);
  expect(output).not.toMatch(/^\s+at /m);
  expect(output).not.toContain('unexpected error');
}

describe('a busy port', () => {
  it('tokenmill sim --port <busy>: one line naming the port and --port, exit 1', async () => {
    const p = spawnCli(['sim', '--port', String(port), '--host', '127.0.0.1']);
    expect(await p.exited).toBe(1);
    expectOneClearLine(p.output(), 'the simulator', /--port \(0 picks a free one\)/);
  }, 60_000);

  it('tokenmill dashboard --port <busy>: one line naming the port, --port and dashboard.port, exit 1', async () => {
    const cfg = writeTestConfig(path.join(tmp.dir), {
      run: 'busy',
      redis,
      datasets: [{ name: 'd', prompts: 'd.jsonl', tokenBudget: 100 }],
    });
    const p = spawnCli(['dashboard', '-c', cfg, '--port', String(port)]);
    expect(await p.exited).toBe(1);
    expectOneClearLine(p.output(), 'the dashboard', /--port .*dashboard\.port/);
  }, 60_000);
});
