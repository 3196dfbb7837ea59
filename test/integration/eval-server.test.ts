// eval.server with real child processes: `tokenmill sim` started, waited for on /health_generate
// and stopped (SIGTERM to its process group, SIGKILL after the grace period); a command that exits
// at once, one that is never healthy, one that is not there and a port already taken end in one
// bounded error naming the command and the end of its log; when one of the two servers fails the
// other is stopped; `tokenmill eval -c F` on a config with eval.server starts, measures and stops.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { freePort } from '../../src/cli/commands/demo-train.js';
import { loadConfig, type ConfigInput } from '../../src/shared/index.js';
import {
  launchEvalServers,
  portFree,
  startServer,
  type EvalConfigured,
  type ServerSpec,
} from '../../src/workers/index.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { alive } from '../helpers/train.js';
import { simCommand } from '../helpers/sim-command.js';

const { tmp } = useHarness({ tmp: 'tm-eval-server-', cli: true });

function spec(argv: string[], port: number, extra: Partial<ServerSpec> = {}): ServerSpec {
  return {
    role: 'drafter',
    argv,
    cwd: tmp.dir,
    env: { ...process.env },
    port,
    portKey: 'eval.server.port',
    logFile: path.join(tmp.dir, `server-${port}.log`),
    healthTimeoutMs: 60_000,
    stopGraceMs: 2_000,
    ...extra,
  };
}

/** The error message of `p`; fails the test when it resolves. */
async function failure(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e: unknown) {
    return e instanceof Error ? e.message : String(e);
  }
  throw new Error('expected the server start to fail');
}

describe('eval.server: one server', () => {
  it('starts tokenmill sim, waits until it is healthy, and stops it', async () => {
    const port = await freePort();
    const server = await startServer(spec(simCommand('--port', String(port)), port));
    expect(server.url).toBe(`http://127.0.0.1:${port}`);
    expect((await fetch(`${server.url}/health_generate`)).status).toBe(200);
    const pid = server.pid ?? 0;
    expect(alive(pid)).toBe(true);
    await server.stop();
    expect(alive(pid)).toBe(false);
    expect(await portFree(port)).toBe(true);
  }, 60_000);

  it('a command that exits at once: the error names it, its exit code and its last lines', async () => {
    const port = await freePort();
    const argv = [
      process.execPath,
      '-e',
      'console.error("RuntimeError: CUDA error: no CUDA GPUs are available"); process.exit(2)',
    ];
    const message = await failure(startServer(spec(argv, port)));
    expect(message).toBe(
      `eval: the drafter server (eval.server.command: ${argv.join(' ')}) exited (exit code 2) before it answered GET /health_generate; ` +
        `log ${path.join(tmp.dir, `server-${port}.log`)}: RuntimeError: CUDA error: no CUDA GPUs are available`,
    );
  });

  it('a command that is not there', async () => {
    const port = await freePort();
    const message = await failure(startServer(spec(['/nonexistent/sglang', '--port', String(port)], port)));
    expect(message).toContain(
      'exited (/nonexistent/sglang: command not found) before it answered GET /health_generate',
    );
  });

  it('a server never healthy is stopped after healthTimeoutMs, the error saying so with its log', async () => {
    const port = await freePort();
    const started = Date.now();
    const message = await failure(
      startServer(spec(simCommand('--port', String(port), '--unhealthy'), port, { healthTimeoutMs: 8_000 })),
    );
    expect(Date.now() - started).toBeLessThan(8_000 + 2_000 + 5_000);
    expect(message).toMatch(
      new RegExp(
        `^eval: the drafter server \\(eval\\.server\\.command: .* sim --port ${port} --unhealthy\\) did not answer GET http://127\\.0\\.0\\.1:${port}/health_generate with 200 within 8 s \\(eval\\.server\\.healthTimeoutMs\\); stopped it; log .*: .*SGLang simulator listening on http://127\\.0\\.0\\.1:${port}`,
      ),
    );
    expect(await portFree(port)).toBe(true);
  }, 60_000);

  it('a port already taken is refused before anything starts', async () => {
    const blocker = createServer();
    const port = await new Promise<number>((resolve) =>
      blocker.listen(0, '127.0.0.1', () => resolve((blocker.address() as { port: number }).port)),
    );
    try {
      const message = await failure(startServer(spec(simCommand('--port', String(port)), port)));
      expect(message).toContain(`cannot start: port ${port} of 127.0.0.1 is in use already (eval.server.port)`);
    } finally {
      blocker.close();
    }
  });

  it('a server that ignores SIGTERM is killed after stopGraceMs, its whole process group', async () => {
    const port = await freePort();
    const pids = path.join(tmp.dir, 'stubborn.pids');
    const script = `
      process.on('SIGTERM', () => {});
      const { spawn } = require('node:child_process');
      const child = spawn(process.execPath, ['-e', 'process.on("SIGTERM", () => {}); setInterval(() => {}, 1000)'], { stdio: 'ignore' });
      require('node:fs').writeFileSync(${JSON.stringify(pids)}, process.pid + ' ' + child.pid);
      require('node:http').createServer((q, r) => r.end('ok')).listen(${port}, '127.0.0.1');`;
    const server = await startServer(spec([process.execPath, '-e', script], port, { stopGraceMs: 1_500 }));
    const [leader, grandchild] = readFileSync(pids, 'utf8').split(' ').map(Number);
    const t0 = Date.now();
    await server.stop();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_400);
    expect(alive(leader ?? 0)).toBe(false);
    expect(alive(grandchild ?? 0)).toBe(false);
  }, 30_000);
});

describe('eval.server: both servers', () => {
  it('when the baseline server fails, the drafter server is stopped too', async () => {
    const [p1, p2] = [await freePort(), await freePort()];
    const config = loadConfig({
      object: {
        run: 'r',
        datasets: [{ name: 'ds', prompts: 'p.jsonl', tokenBudget: 1_000 }],
        output: { dir: 'out' },
        eval: {
          server: {
            command: simCommand('--port', '{port}'),
            baselineCommand: [process.execPath, '-e', 'console.error("no model at /models/Qwen3-8B"); process.exit(1)'],
            port: p1,
            baselinePort: p2,
            gpus: 0,
          },
        },
      },
      baseDir: tmp.dir,
    }) as EvalConfigured;
    const message = await failure(
      launchEvalServers(
        config,
        { path: '/drafts/d1', attemptDir: null },
        { probeGpus: () => Promise.resolve({ gpus: [], problem: null }), logDir: tmp.dir },
      ),
    );
    expect(message).toMatch(/^eval: the baseline server \(eval\.server\.baselineCommand: .*\) exited \(exit code 1\)/);
    expect(message).toContain('no model at /models/Qwen3-8B');
    expect(await portFree(p1)).toBe(true);
  }, 60_000);
});

describe('tokenmill eval -c F with eval.server', () => {
  const configFile = (name: string, server: NonNullable<NonNullable<ConfigInput['eval']>['server']>): string => {
    const runDir = path.join(tmp.dir, 'out', 'r');
    const drafter = path.join(runDir, 'train', '0001', 'checkpoints', 'step-20');
    mkdirSync(drafter, { recursive: true });
    writeFileSync(path.join(drafter, 'config.json'), '{}\n');
    mkdirSync(path.join(runDir, 'ds'), { recursive: true });
    writePrompts(path.join(runDir, 'ds'), 'eval-prompts', 4);
    writePrompts(tmp.dir, 'prompts', 2);
    return writeConfig(
      tmp.dir,
      {
        run: 'r',
        datasets: [{ name: 'ds', prompts: 'prompts.jsonl', tokenBudget: 1_000_000 }],
        output: { dir: 'out' },
        eval: { server, concurrency: 4, maxNewTokens: 64 },
      },
      `${name}.yaml`,
    );
  };

  it('starts the servers with the attempt’s drafter, measures, writes eval.json and stops them', async () => {
    const [p1, p2] = [await freePort(), await freePort()];
    const sim = ['--port', '{port}', '--time-scale', '20', '--seed', '7'];
    const file = configFile('served', {
      command: simCommand(
        ...sim,
        '--speculative-algorithm',
        'EAGLE3',
        '--speculative-draft-model-path',
        '{checkpoint}',
      ),
      baselineCommand: simCommand(...sim),
      port: p1,
      baselinePort: p2,
      gpus: 0,
    });
    const cli = spawnCli(['eval', '-c', file]);
    expect(await cli.exited, cli.output()).toBe(0);
    expect(cli.output()).toMatch(
      new RegExp(`drafter server healthy at http://127\\.0\\.0\\.1:${p1} \\(pid \\d+, no GPU, log `),
    );
    expect(cli.stdout()).toMatch(/^ds\s+4\s+\d\.\d\d\s+/m);
    expect(cli.output()).toContain('tokenmill: eval: servers stopped');
    const report = JSON.parse(readFileSync(path.join(tmp.dir, 'out', 'r', 'train', '0001', 'eval.json'), 'utf8')) as {
      endpoints: { url: string; draftModelPath: string }[];
    };
    expect(report.endpoints[0]).toMatchObject({
      url: `http://127.0.0.1:${p1}`,
      draftModelPath: path.join(tmp.dir, 'out', 'r', 'train', '0001', 'checkpoints', 'step-20'),
    });
    expect(await portFree(p1)).toBe(true);
    expect(await portFree(p2)).toBe(true);
  }, 90_000);

  it('a server that exits at once: exit code 1 and one line naming the command and its log', async () => {
    const port = await freePort();
    const file = configFile('broken', {
      command: [
        process.execPath,
        '-e',
        'console.error("ValueError: --speculative-draft-model-path is not a folder"); process.exit(1)',
      ],
      port,
      gpus: 0,
    });
    const cli = spawnCli(['eval', '-c', file]);
    expect(await cli.exited).toBe(1);
    expect(cli.output()).toMatch(
      /tokenmill: eval: the drafter server \(eval\.server\.command: .*\) exited \(exit code 1\) before it answered GET \/health_generate; log .*eval-server-drafter\.log: ValueError: --speculative-draft-model-path is not a folder\n$/,
    );
  }, 60_000);
});
