// The demo's config file (`<run dir>/tokenmill.yaml`): written to disk, it reads back through
// loadConfig as the same config the demo built in memory, from its own folder (absolute paths),
// with its header and its note on the simulator's endpoint; and the commands printed on it.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { demoConfig } from '../../src/cli/commands/demo.js';
import {
  DEMO_EVAL_HOLDOUT,
  DEMO_RESUME_STEPS,
  withDemoEval,
  withDemoTraining,
} from '../../src/cli/commands/demo-train.js';
import {
  demoConfigPath,
  demoNextCommands,
  formatDemoNext,
  shellWord,
  writeDemoConfig,
} from '../../src/cli/commands/demo-config.js';
import { loadConfig, runDir, type Config } from '../../src/shared/index.js';

const repoRoot = fileURLToPath(new URL('../../', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'tokenmill-demo-config-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** A config with where it was loaded from left out. */
function comparable(config: Config): Config {
  return { ...config, source: { baseDir: '' } };
}

describe('the demo config file', () => {
  it('round-trips through loadConfig from its own folder, with the trainer section', async () => {
    const outDir = join(tmp, 'out');
    const input = withDemoEval(
      withDemoTraining(demoConfig('http://127.0.0.1:41234', outDir), '/opt/venv/bin/python', repoRoot),
      { timeScale: 25, ports: [41301, 41302], cli: ['/usr/bin/node', '/opt/tokenmill/bin/tokenmill.js'] },
    );
    const dir = join(outDir, 'demo');
    const file = demoConfigPath(dir);
    await writeDemoConfig(file, input, dir);

    // Written atomically: the file and no temporary file beside it.
    expect(readdirSync(dir)).toEqual(['tokenmill.yaml']);
    const fromFile = loadConfig({ path: file });
    // In memory the demo's config is resolved against another folder: the same config either way.
    const inMemory = loadConfig({ object: input, baseDir: tmp });
    expect(comparable(fromFile)).toEqual(comparable(inMemory));
    expect(fromFile.source.file).toBe(file);
    expect(runDir(fromFile)).toBe(dir);

    // Absolute paths to the package's files, which exist.
    for (const d of fromFile.datasets) {
      const p = d.source?.path ?? d.prompts;
      expect(p, d.name).toBe(resolve(p ?? ''));
      expect(existsSync(p ?? ''), `${d.name}: ${p}`).toBe(true);
    }
    expect(existsSync(fromFile.tokenizer.path)).toBe(true);
    expect(fromFile.redis.url).toBeUndefined();
    expect(fromFile.train?.command?.[1]).toBe(join(repoRoot, 'trainers', 'tiny_drafter.py'));
    expect(fromFile.train?.resumeArgs).toEqual(['--resume', '{checkpoint}', '--steps', String(DEMO_RESUME_STEPS)]);
    // The eval step: held-out prompts per dataset, two simulators of this CLI started for each attempt.
    expect(fromFile.datasets.every((d) => d.evalHoldout === DEMO_EVAL_HOLDOUT)).toBe(true);
    const server = fromFile.eval?.server;
    expect(server?.command.slice(0, 5)).toEqual([
      '/usr/bin/node',
      '/opt/tokenmill/bin/tokenmill.js',
      'sim',
      '--port',
      '{port}',
    ]);
    expect(server?.command).toEqual(expect.arrayContaining(['--speculative-draft-model-path', '{checkpoint}']));
    expect(server?.baselineCommand).not.toContain('--speculative-algorithm');
    expect([server?.port, server?.baselinePort, server?.gpus]).toEqual([41301, 41302, 0]);

    const text = readFileSync(file, 'utf8');
    expect(text.startsWith('# The config `tokenmill demo` ran with')).toBe(true);
    expect(text).toContain(`#   tokenmill eval -c ${file}`);
    expect(text).toContain(
      '# After each training, the eval step (and `tokenmill eval` on this file) starts two simulators',
    );
    expect(text).toContain(`#   tokenmill status -c ${file}\n`);
    expect(text).toContain(`#   tokenmill train -c ${file} --resume`);
    expect(text).toContain("# http://127.0.0.1:41234 was the demo's built-in SGLang simulator");
    expect(text).toContain('#   tokenmill sim --port 41234 ');
  });

  it('without the trainer environment has no train section and no train command', async () => {
    const outDir = join(tmp, 'no-train');
    const input = withDemoTraining(demoConfig('http://127.0.0.1:41235', outDir), null, repoRoot);
    const dir = join(outDir, 'demo');
    const file = demoConfigPath(dir);
    await writeDemoConfig(file, input, dir);
    const config = loadConfig({ path: file });
    expect(config.train).toBeUndefined();
    expect(readFileSync(file, 'utf8')).not.toContain('tokenmill train');
    expect(demoNextCommands(file, dir, { trains: false }).train).toBeNull();
  });

  it('prints paths under the working folder relative to it, others absolute, quoted where a shell needs it', () => {
    const cwd = join(tmp, 'here');
    const dir = join(cwd, 'out', 'demo');
    const next = demoNextCommands(demoConfigPath(dir), dir, { trains: true, cwd });
    expect(next.status).toBe('tokenmill status -c out/demo/tokenmill.yaml');
    expect(next.export.jsonl).toBe(
      'tokenmill export -c out/demo/tokenmill.yaml --format jsonl --out out/demo/export/rows.jsonl',
    );
    expect(next.export.speculators).toBe(
      'tokenmill export -c out/demo/tokenmill.yaml --format speculators --out out/demo/export/speculators',
    );
    expect(next.train).toBe('tokenmill train -c out/demo/tokenmill.yaml --resume');
    const text = formatDemoNext(demoConfigPath(dir), next);
    expect(text.split('\n').slice(1)).toEqual([
      `  ${next.status}`,
      `  ${next.export.jsonl}`,
      `  ${next.export.specforge}`,
      `  ${next.export.speculators}`,
      `  ${next.train ?? ''}`,
      `  ${next.eval ?? ''}`,
    ]);
    expect(next.eval).toBe('tokenmill eval -c out/demo/tokenmill.yaml');

    const elsewhere = demoNextCommands('/data/my runs/demo/tokenmill.yaml', '/data/my runs/demo', {
      trains: false,
      cwd,
    });
    expect(elsewhere.status).toBe("tokenmill status -c '/data/my runs/demo/tokenmill.yaml'");
    expect(shellWord("it's")).toBe("'it'\\''s'");
  });
});
