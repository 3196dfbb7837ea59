// The demo's config file (`<run dir>/tokenmill.yaml`): written to disk, it reads back through
// loadConfig as the same config the demo built in memory, from its own folder (absolute paths),
// with its header and its note on the simulator's endpoint; and the commands printed on it.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
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
import {
  bundledTokenizerPath,
  loadConfig,
  loadTokenizer,
  runDir,
  type ChatMessage,
  type Config,
} from '../../src/shared/index.js';
import { agentPlan, DEFAULT_TOOL_CALL_RATES, readToolPrompt } from '../../src/sim/index.js';
import { useTempDir } from '../helpers/temp.js';

const repoRoot = fileURLToPath(new URL('../../', import.meta.url));
const tmp = useTempDir('tokenmill-demo-config-');

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

describe("the demo's agentic dataset, B8_sweagent", () => {
  interface Record_ {
    id: string;
    tools: { type: string; function: { name: string } }[];
    messages: {
      role: string;
      content: string;
      tool_call_id?: string;
      tool_calls?: { id: string; function: { name: string; arguments: string } }[];
    }[];
  }
  const b8 = demoConfig('http://127.0.0.1:41234', join(tmp, 'b8')).datasets?.find((d) => d.name === 'B8_sweagent');
  const records = (): Record_[] =>
    readFileSync(b8?.prompts ?? '', 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as Record_);

  it('is regenerated turn by turn; its records carry tools, and trajectories of calls, results and a final answer', () => {
    expect(b8?.turns).toBe('all');
    const all = records();
    expect(all).toHaveLength(40);
    let parallel = 0;
    for (const r of all) {
      const names = r.tools.map((t) => t.function.name);
      expect(names).toEqual(['run_shell', 'read_file', 'edit_file', 'submit']);
      const answers = r.messages.filter((m) => m.role === 'assistant');
      expect(answers.length, r.id).toBeGreaterThanOrEqual(3);
      expect(answers.length, r.id).toBeLessThanOrEqual(8);
      expect(r.messages.map((m) => m.role).slice(0, 2)).toEqual(['system', 'user']);
      // Every assistant turn but the last calls tools; each call is answered, in order, by a tool message.
      for (const [i, m] of r.messages.entries()) {
        if (m.role !== 'assistant') continue;
        const calls = m.tool_calls ?? [];
        if (m === answers.at(-1)) {
          expect(calls, r.id).toEqual([]);
          expect(m.content.length).toBeGreaterThan(0);
          continue;
        }
        expect(calls.length, r.id).toBeGreaterThanOrEqual(1);
        if (calls.length > 1) parallel += 1;
        const results = r.messages.slice(i + 1, i + 1 + calls.length);
        expect(results.map((t) => [t.role, t.tool_call_id])).toEqual(calls.map((c) => ['tool', c.id]));
        for (const c of calls) {
          expect(names).toContain(c.function.name);
          expect(JSON.parse(c.function.arguments)).toBeTypeOf('object');
        }
      }
    }
    expect(parallel).toBeGreaterThan(5);
  });

  it("calls, turn by turn, what the simulator's plan reads in each turn's Qwen3 prompt", async () => {
    const tok = await loadTokenizer(bundledTokenizerPath());
    for (const r of records().slice(0, 12)) {
      const turns = r.messages.flatMap((m, i) => (m.role === 'assistant' ? [i] : []));
      for (const at of turns) {
        const text = tok.decode(tok.encodePrompt(r.messages.slice(0, at) as ChatMessage[], { tools: r.tools }));
        const read = readToolPrompt(text, 'hermes');
        expect(read?.request, r.id).toBe(r.messages[1]?.content.trim());
        const plan = agentPlan(
          read?.request ?? '',
          read?.tools.map((t) => t.name) ?? [],
          DEFAULT_TOOL_CALL_RATES.parallel,
        );
        const source = (r.messages[at]?.tool_calls ?? []).map((c) => c.function.name);
        expect(plan[read?.rounds ?? -1] ?? [], `${r.id} at ${at}`).toEqual(source);
      }
    }
  });
});
