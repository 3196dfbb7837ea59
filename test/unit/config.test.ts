import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { describe, expect, it, vi } from 'vitest';
import type { z } from 'zod';
import { registerConfigCommand } from '../../src/cli/commands/config.js';
import {
  bundledTokenizerPath,
  ConfigError,
  ConfigSchema,
  configJsonSchema,
  configReferenceMarkdown,
  formatConfigPath,
  loadConfig,
  runDir,
  type ConfigIssue,
} from '../../src/shared/index.js';
import { useTempDir } from '../helpers/temp.js';

const fixtures = resolve(dirname(fileURLToPath(import.meta.url)), '../fixtures/config');
const tmp = useTempDir('tokenmill-config-');

/** 1-based line of the `nth` (1-based) line of `text` containing `needle`. */
function lineOf(text: string, needle: string, nth = 1): number {
  let seen = 0;
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i]?.includes(needle) === true && ++seen === nth) return i + 1;
  }
  throw new Error(`"${needle}" (occurrence ${nth}) not in text`);
}

/** The ConfigError thrown by `fn`; fails the test when nothing (or something else) is thrown. */
function configError(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (e: unknown) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error('expected a ConfigError, but the config was accepted');
}

function issueAt(err: ConfigError, path: string): ConfigIssue {
  const found = err.issues.find((i) => i.path === path);
  if (found === undefined) throw new Error(`no issue at ${path}; issues: ${JSON.stringify(err.issues)}`);
  return found;
}

const yamlError = (text: string): ConfigError =>
  configError(() => loadConfig({ text, baseDir: tmp, file: 'tokenmill.yaml' }));

const minimalDataset = 'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: 10\n';

describe('loadConfig: valid configs', () => {
  it("parses a full config, keeps every value and resolves paths against the file's folder", () => {
    const file = join(fixtures, 'full.yaml');
    const c = loadConfig({ path: file });
    expect(c.source).toEqual({ file, baseDir: fixtures });
    expect(c.run).toBe('full-run.1');
    expect(c.redis).toEqual({ url: 'redis://:s3cret@127.0.0.1:6390/2', prefix: 'tm:{full}' });
    expect(c.sglang).toEqual({
      endpoints: ['http://127.0.0.1:30000', 'https://gpu-2.example:30001'],
      concurrency: 96,
      api: 'chat',
      requestTimeoutMs: 600000,
      healthCheckIntervalMs: 500,
      maxAttempts: 5,
    });
    expect(c.tokenizer.path).toBe(join(fixtures, 'models/qwen3'));
    expect(c.datasets).toEqual([
      {
        name: 'B1_glaive',
        prompts: join(fixtures, 'data/B1_glaive.jsonl'),
        tokenBudget: 10_000_000,
        maxNewTokens: 4096,
        // Keys SGLang knows but the schema does not list pass through unchanged.
        sampling: {
          temperature: 0.7,
          top_p: 0.8,
          top_k: 20,
          min_p: 0,
          stop_token_ids: [151645],
          repetition_penalty: 1.05,
        },
        batchSize: 32,
        budget: 'reserve',
        budgetMarginSd: 2,
        turns: 'last',
        minNewTokens: 16,
        samplesPerPrompt: 1,
      },
      {
        name: 'A1_deepswekimi',
        conversations: '/abs/data/A1.jsonl',
        maxNewTokens: 10240,
        sampling: { temperature: 0.6, top_p: 0.95 },
        batchSize: 64,
        budget: 'reserve',
        budgetMarginSd: 2,
        turns: 'last',
        minNewTokens: 16,
        samplesPerPrompt: 1,
      },
    ]);
    expect(c.output.dir).toBe(resolve(fixtures, '../out'));
    expect(c.postprocess).toEqual({
      target: join(fixtures, 'train-dataset'),
      keepTruncated: true,
      rows: 'conversation',
      shardSizeMiB: 0.5,
      verifyWithPython: false,
    });
    expect(c.train).toEqual({
      command: ['python', 'trainers/tiny_drafter.py', '--data', '{dataset}'],
      gpus: 0,
      minFreeGpuMemMiB: 1024,
      mode: 'resume',
      resumeArgs: ['--resume', '{checkpoint}'],
      allowEnvChange: false,
      autoResume: false,
      cancelGraceMs: 30_000,
      preflightPollMs: 30_000,
    });
    expect(runDir(c)).toBe(join(resolve(fixtures, '../out'), 'full-run.1'));
  });

  it('applies every default to a minimal config', () => {
    const c = loadConfig({ path: join(fixtures, 'minimal.yaml') });
    expect(c.run).toBe('demo');
    expect(c.redis).toEqual({ prefix: 'tm' });
    expect(c.redis.url).toBeUndefined();
    expect(c.sglang).toEqual({
      endpoints: ['http://127.0.0.1:30000'],
      concurrency: 150,
      api: 'generate',
      requestTimeoutMs: 900_000,
      healthCheckIntervalMs: 2000,
      maxAttempts: 3,
    });
    expect(c.datasets[0]).toEqual({
      name: 'only',
      prompts: join(fixtures, 'prompts.jsonl'),
      tokenBudget: 1000,
      maxNewTokens: 10240,
      sampling: { temperature: 0.6, top_p: 0.95 },
      batchSize: 64,
      budget: 'reserve',
      budgetMarginSd: 2,
      turns: 'last',
      minNewTokens: 16,
      samplesPerPrompt: 1,
    });
    expect(c.output.dir).toBe(join(fixtures, 'out'));
    expect(c.postprocess).toEqual({
      target: join(fixtures, 'out', 'demo', 'train-dataset'),
      keepTruncated: false,
      rows: 'conversation',
      shardSizeMiB: 500,
      verifyWithPython: false,
    });
    expect(c.train).toBeUndefined();
    expect(c.tokenizer.path).toBe(bundledTokenizerPath());
    expect(c.tokenizer.kind).toBe('auto');
  });

  it("a train step's hiddenStates defaults: 4 layers (EAGLE-3), bfloat16, 16 B a token, a 5 % margin", () => {
    const c = loadConfig({
      object: {
        datasets: [{ name: 'a', conversations: 'a.jsonl' }],
        train: {
          mode: 'from-scratch',
          steps: [{ name: 'extract', command: ['x'], hiddenStates: { model: 'models/qwen3-8b' } }],
        },
      },
      baseDir: tmp,
    });
    expect(c.train?.steps?.[0]).toEqual({
      name: 'extract',
      command: ['x'],
      minFreeDiskGiB: 0,
      hiddenStates: { model: 'models/qwen3-8b', layers: 4, dtype: 'bfloat16', overheadBytesPerToken: 16, margin: 0.05 },
    });
    const bad = () =>
      loadConfig({
        object: {
          datasets: [{ name: 'a', conversations: 'a.jsonl' }],
          train: {
            mode: 'from-scratch',
            steps: [
              { name: 'a', command: ['x'] },
              { name: 'b', command: ['x'], hiddenStates: { model: '', dtype: 'int8' } },
            ],
          },
        },
        baseDir: tmp,
      });
    expect(bad).toThrow(/train\.steps\[1\]\.hiddenStates\.model: expected the target model folder/);
    expect(bad).toThrow(/train\.steps\[1\]\.hiddenStates\.dtype: expected one of "bfloat16", "float16", "float32"/);
  });

  it('bundledTokenizerPath() is a folder with tokenizer.json and tokenizer_config.json', () => {
    const dir = bundledTokenizerPath();
    expect(existsSync(join(dir, 'tokenizer.json'))).toBe(true);
    expect(existsSync(join(dir, 'tokenizer_config.json'))).toBe(true);
  });

  it('accepts YAML text and plain objects, resolving paths against baseDir', () => {
    const fromText = loadConfig({ text: `run: r1\n${minimalDataset}`, baseDir: '/srv/cfg', file: 'tm.yaml' });
    expect(fromText.source).toEqual({ file: '/srv/cfg/tm.yaml', baseDir: '/srv/cfg' });
    expect(fromText.datasets[0]?.prompts).toBe('/srv/cfg/a.jsonl');
    expect(fromText.postprocess.target).toBe('/srv/cfg/out/r1/train-dataset');

    const fromObject = loadConfig({
      object: { datasets: [{ name: 'x', conversations: 'c.jsonl' }], output: { dir: '/data/out' } },
      baseDir: '/srv/other',
    });
    expect(fromObject.source).toEqual({ baseDir: '/srv/other' });
    expect(fromObject.datasets[0]?.conversations).toBe('/srv/other/c.jsonl');
    expect(fromObject.output.dir).toBe('/data/out');
    expect(fromObject.postprocess.target).toBe('/data/out/demo/train-dataset');
  });

  it('reads a config file given by path', () => {
    const file = join(tmp, 'ok.yaml');
    writeFileSync(file, `tokenizer: { path: tok }\n${minimalDataset}`);
    const c = loadConfig({ path: file });
    expect(c.tokenizer.path).toBe(join(tmp, 'tok'));
    expect(c.source.file).toBe(file);
  });

  it('a dataset of conversations needs no token budget', () => {
    const c = loadConfig({ text: 'datasets: [{ name: conv, conversations: c.jsonl }]', baseDir: tmp });
    expect(c.datasets[0]?.tokenBudget).toBeUndefined();
  });

  it('eval: omitted by default; its defaults, resolved prompt file and trimmed URLs when given', () => {
    expect(loadConfig({ path: join(fixtures, 'minimal.yaml') }).eval).toBeUndefined();
    const c = loadConfig({
      text: `${minimalDataset}eval: { endpoints: ['http://127.0.0.1:30001/'], baseline: ['http://127.0.0.1:30002'], prompts: p.jsonl }\n`,
      baseDir: '/srv/cfg',
    });
    expect(c.eval).toEqual({
      endpoints: ['http://127.0.0.1:30001'],
      baseline: ['http://127.0.0.1:30002'],
      prompts: '/srv/cfg/p.jsonl',
      maxPromptsPerDataset: 200,
      concurrency: 16,
      maxNewTokens: 512,
      sampling: { temperature: 0 },
      maxAcceptDrop: 0.1,
      requestTimeoutMs: 600_000,
    });
  });

  it('eval: minSpeedup needs a baseline; sampling: dataset needs the held-out prompts', () => {
    const err = yamlError(
      `${minimalDataset}eval:\n  endpoints: ['http://127.0.0.1:30001']\n  minSpeedup: 1.1\n  prompts: p.jsonl\n  sampling: dataset\n`,
    );
    expect(issueAt(err, 'eval.minSpeedup').message).toMatch(/needs "baseline"/);
    expect(issueAt(err, 'eval.sampling').message).toMatch(/"dataset" takes each dataset's sampling/);
  });

  it('eval.server: its defaults; exactly one of endpoints / server; no baseline beside it', () => {
    const c = loadConfig({
      text: `${minimalDataset}eval:\n  server: { command: [sglang, '{checkpoint}', '{port}'], baselineCommand: [sglang, '{port}'] }\n  minSpeedup: 1.1\n`,
      baseDir: '/srv/cfg',
    });
    expect(c.eval?.endpoints).toBeUndefined();
    expect(c.eval?.server).toEqual({
      command: ['sglang', '{checkpoint}', '{port}'],
      baselineCommand: ['sglang', '{port}'],
      port: 30000,
      baselinePort: 30001,
      gpus: 1,
      minFreeGpuMemMiB: 0,
      healthTimeoutMs: 600_000,
      stopGraceMs: 10_000,
    });
    expect(issueAt(yamlError(`${minimalDataset}eval: { maxNewTokens: 64 }\n`), 'eval').message).toBe(
      'expected exactly one of "endpoints" (servers you started) or "server" (servers the eval step starts), got neither',
    );
    const both = yamlError(
      `${minimalDataset}eval:\n  endpoints: ['http://127.0.0.1:30001']\n  baseline: ['http://127.0.0.1:30002']\n  server: { command: [s] }\n`,
    );
    expect(issueAt(both, 'eval').message).toMatch(/got both$/);
    expect(issueAt(both, 'eval.baseline').message).toMatch(/server.baselineCommand starts the baseline/);
    const noBaseline = yamlError(`${minimalDataset}eval:\n  server: { command: [s], port: 0 }\n  minSpeedup: 1.1\n`);
    expect(issueAt(noBaseline, 'eval.minSpeedup').message).toMatch(/needs "baseline" \(or server.baselineCommand\)/);
    expect(issueAt(noBaseline, 'eval.server.port').message).toBe('expected a TCP port (1-65535), got 0');
  });
});

describe('loadConfig: errors name their path, say what was expected and what was got, and give the line', () => {
  it('refuses samplingVariants of several entries with samplesPerPrompt 1 (all but the first would be ignored), with its line', () => {
    const text =
      'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: 10\n' +
      '    samplingVariants: [{temperature: 0}, {temperature: 0.7}]\n';
    const err = yamlError(text);
    const issue = issueAt(err, 'datasets[0].samplingVariants');
    expect(issue.message).toMatch(/has 2 entries, but samplesPerPrompt is 1, so only the first would be used/);
    expect(issue.line).toBe(lineOf(text, 'samplingVariants'));
    // One entry, or as many samples as entries, is fine.
    expect(() =>
      loadConfig({ text: text.replace('samplingVariants', 'samplesPerPrompt: 2\n    samplingVariants'), baseDir: tmp }),
    ).not.toThrow();
    expect(() => loadConfig({ text: text.replace(', {temperature: 0.7}', ''), baseDir: tmp })).not.toThrow();
  });

  it('reports a negative budget at datasets[2].tokenBudget with its line', () => {
    const text = readFileSync(join(fixtures, 'invalid.yaml'), 'utf8');
    const err = configError(() => loadConfig({ path: join(fixtures, 'invalid.yaml') }));
    const issue = issueAt(err, 'datasets[2].tokenBudget');
    expect(issue.message).toBe('expected a positive integer (output tokens), got -5');
    expect(issue.line).toBe(lineOf(text, 'tokenBudget: -5'));
    expect(err.file).toBe(join(fixtures, 'invalid.yaml'));
    expect(err.message).toContain(
      `${join(fixtures, 'invalid.yaml')}:${lineOf(text, 'tokenBudget: -5')}: datasets[2].tokenBudget: expected a positive integer`,
    );
  });

  it('reports every problem of a file at once, in file order', () => {
    const text = readFileSync(join(fixtures, 'invalid.yaml'), 'utf8');
    const err = configError(() => loadConfig({ path: join(fixtures, 'invalid.yaml') }));
    expect(err.issues.map((i) => [i.path, i.line])).toEqual([
      ['sglang.endpoints[0]', lineOf(text, 'endpoints:')],
      ['sglang.api', lineOf(text, 'api: grpc')],
      ['datasets[2].tokenBudget', lineOf(text, 'tokenBudget: -5')],
      ['datasets[3]', lineOf(text, '- name: first', 2)],
      ['datasets[3].name', lineOf(text, '- name: first', 2)],
      ['datasets[3].tokenBuget', lineOf(text, 'tokenBuget')],
    ]);
    expect(err.message).toMatch(/^invalid config \(6 problems\)/);
    for (const i of err.issues) expect(err.message).toContain(`${i.path}: ${i.message}`);
  });

  it('reports an unknown key with its path, its line and the key it probably meant', () => {
    const text = `${minimalDataset}    tokenBuget: 5\nsglnag: { api: chat }\n`;
    const err = yamlError(text);
    expect(issueAt(err, 'datasets[0].tokenBuget')).toEqual({
      path: 'datasets[0].tokenBuget',
      message: 'unknown key (did you mean "tokenBudget"?)',
      line: lineOf(text, 'tokenBuget'),
    });
    expect(issueAt(err, 'sglnag').message).toBe('unknown key (did you mean "sglang"?)');
    expect(issueAt(err, 'sglnag').line).toBe(lineOf(text, 'sglnag'));
  });

  it('lists the allowed keys when an unknown key resembles none', () => {
    const err = yamlError(`${minimalDataset}redis: { flavour: vanilla }\n`);
    expect(issueAt(err, 'redis.flavour').message).toBe(
      'unknown key (allowed keys: url, sentinels, name, password, sentinelPassword, tls, db, prefix)',
    );
  });

  it("requires exactly one of prompts and conversations, on the dataset's path", () => {
    const text = [
      'datasets:',
      '  - name: both',
      '    prompts: p.jsonl',
      '    conversations: c.jsonl',
      '    tokenBudget: 5',
      '  - name: neither',
      '    tokenBudget: 5',
    ].join('\n');
    const err = yamlError(text);
    expect(issueAt(err, 'datasets[0]')).toEqual({
      path: 'datasets[0]',
      message: 'expected exactly one of "prompts" or "conversations", got both',
      line: lineOf(text, 'name: both'),
    });
    expect(issueAt(err, 'datasets[1]')).toEqual({
      path: 'datasets[1]',
      message: 'expected exactly one of "prompts", "source" or "conversations", got none',
      line: lineOf(text, 'name: neither'),
    });
    expect(err.issues).toHaveLength(2);
  });

  it('a source is prepared into <output.dir>/<run>/<dataset>/prompts.jsonl unless prompts names the file; it needs a budget and no conversations', () => {
    const c = loadConfig({
      object: {
        run: 'r',
        datasets: [
          { name: 'a', source: { path: 'dl/a' }, tokenBudget: 5 },
          { name: 'b', source: { path: '/x/b.parquet', format: 'sharegpt' }, prompts: 'p/b.jsonl', tokenBudget: 5 },
        ],
      },
      baseDir: '/base',
    });
    expect(c.datasets[0]).toMatchObject({
      prompts: '/base/out/r/a/prompts.jsonl',
      source: { path: '/base/dl/a', format: 'auto' },
    });
    expect(c.datasets[1]).toMatchObject({
      prompts: '/base/p/b.jsonl',
      source: { path: '/x/b.parquet', format: 'sharegpt' },
    });
    const err = yamlError(
      [
        'datasets:',
        '  - name: s',
        '    source: {path: a.jsonl}',
        '    conversations: c.jsonl',
        '  - name: t',
        '    source: {path: a.jsonl, format: csv}',
      ].join('\n'),
    );
    expect(err.issues.map((i) => `${i.path}: ${i.message}`)).toEqual([
      'datasets[0]: expected "source" or "conversations", got both (a source is prepared into prompts to generate from)',
      'datasets[1].tokenBudget: missing: expected a positive integer (output tokens), required when "source" is set',
      'datasets[1].source.format: expected one of: auto, openai, sharegpt, alpaca, prompt, got "csv"',
    ]);
  });

  it('checks the dataset rules even when the same dataset or list has other errors', () => {
    const text = [
      'datasets:',
      '  - name: 5',
      '    prompts: p.jsonl',
      '    conversations: c.jsonl',
      '    maxNewTokens: -1',
      '  - name: twin',
      '    conversations: a.jsonl',
      '    batchSize: many',
      '  - name: twin',
      '    prompts: b.jsonl',
      '    tokenBudget: 3',
    ].join('\n');
    const err = yamlError(text);
    expect(err.issues.map((i) => i.path).sort()).toEqual(
      [
        'datasets[0]',
        'datasets[0].maxNewTokens',
        'datasets[0].name',
        'datasets[1].batchSize',
        'datasets[2].name',
      ].sort(),
    );
    expect(issueAt(err, 'datasets[0]').message).toContain('got both');
    expect(issueAt(err, 'datasets[2].name').message).toContain('"twin" again');
  });

  it('requires a token budget with prompts, pointing at the dataset when the key is missing', () => {
    const text = 'run: x\ndatasets:\n  - name: nobudget\n    prompts: p.jsonl\n';
    const issue = issueAt(yamlError(text), 'datasets[0].tokenBudget');
    expect(issue.message).toMatch(/^missing: expected a positive integer/);
    expect(issue.message).toContain('"prompts"');
    expect(issue.line).toBe(lineOf(text, 'name: nobudget'));
  });

  it('rejects duplicate dataset names', () => {
    const text = `${minimalDataset}  - name: b\n    conversations: b.jsonl\n  - name: a\n    conversations: c.jsonl\n`;
    const err = yamlError(text);
    expect(err.issues).toHaveLength(1);
    expect(issueAt(err, 'datasets[2].name')).toEqual({
      path: 'datasets[2].name',
      message: 'expected a unique dataset name, got "a" again (first used by datasets[0])',
      line: text.split('\n').lastIndexOf('  - name: a') + 1,
    });
  });

  it('rejects URLs of the wrong kind', () => {
    const text = `redis: { url: "http://127.0.0.1:6379" }\nsglang:\n  endpoints:\n    - http://ok:1\n    - not a url\n${minimalDataset}`;
    const err = yamlError(text);
    expect(issueAt(err, 'redis.url')).toEqual({
      path: 'redis.url',
      message: 'expected a redis:// or rediss:// URL, got "http://127.0.0.1:6379"',
      line: 1,
    });
    expect(issueAt(err, 'sglang.endpoints[1]')).toEqual({
      path: 'sglang.endpoints[1]',
      message: 'expected an http:// or https:// URL, got "not a url"',
      line: lineOf(text, 'not a url'),
    });
    expect(err.issues).toHaveLength(2);
  });

  it('rejects a value outside an enum, listing the allowed ones', () => {
    const text = `sglang:\n  api: grpc\n${minimalDataset}`;
    expect(issueAt(yamlError(text), 'sglang.api')).toEqual({
      path: 'sglang.api',
      message: 'expected one of "generate", "chat", got "grpc"',
      line: 2,
    });
  });

  it('says what was got for wrong types, empty lists and bad names', () => {
    const text = [
      'run: "my run/1"',
      'sglang: { concurrency: lots, endpoints: [] }',
      'postprocess: { keepTruncated: "yes" }',
      'datasets:',
      '  - name: a',
      '    prompts: a.jsonl',
      '    tokenBudget: 1.5',
      '    sampling: { top_p: 0, temperature: -1 }',
      'train: { command: [], mode: sideways }',
    ].join('\n');
    const err = yamlError(text);
    const messages = Object.fromEntries(err.issues.map((i) => [i.path, i.message]));
    expect(messages).toEqual({
      run: 'expected a name of letters, digits, "_", "." or "-" that starts with a letter or digit, got "my run/1"',
      'sglang.concurrency': 'expected a positive integer, got "lots"',
      'sglang.endpoints': 'expected at least one SGLang endpoint, got an empty list',
      'postprocess.keepTruncated': 'expected true or false, got "yes"',
      'datasets[0].tokenBudget': 'expected a positive integer (output tokens), got 1.5',
      'datasets[0].sampling.top_p': 'expected a number in (0, 1], got 0',
      'datasets[0].sampling.temperature': 'expected a number >= 0, got -1',
      'train.command': 'expected a command and its arguments, got an empty list',
      'train.mode': 'expected one of "from-scratch", "resume", got "sideways"',
    });
  });

  it('takes evalHoldout as an integer >= 1 or a fraction in (0, 1), and names the path of anything else', () => {
    const withHoldout = (v: string): string => `${minimalDataset}    evalHoldout: ${v}\n`;
    expect(loadConfig({ text: withHoldout('25'), baseDir: tmp }).datasets[0]?.evalHoldout).toBe(25);
    expect(loadConfig({ text: withHoldout('0.05'), baseDir: tmp }).datasets[0]?.evalHoldout).toBe(0.05);
    expect(loadConfig({ text: minimalDataset, baseDir: tmp }).datasets[0]?.evalHoldout).toBeUndefined();
    const expected =
      'expected an integer >= 1 (that many prompts) or a fraction between 0 and 1, exclusive (that share of the prompts)';
    for (const [value, got] of [
      ['0', '0'],
      ['1.5', '1.5'],
      ['-1', '-1'],
      ['ten', '"ten"'],
      ['"0.1"', '"0.1"'],
    ] as const) {
      const text = withHoldout(value);
      const err = yamlError(text);
      expect(err.issues, value).toEqual([
        { path: 'datasets[0].evalHoldout', message: `${expected}, got ${got}`, line: lineOf(text, 'evalHoldout') },
      ]);
    }
    const conv = yamlError('datasets:\n  - name: c\n    conversations: c.jsonl\n    evalHoldout: 3\n');
    expect(issueAt(conv, 'datasets[0].evalHoldout').message).toContain('expected only with "prompts" or "source"');
  });

  it('reports missing required keys', () => {
    const err = yamlError('run: x\n');
    expect(err.issues).toEqual([{ path: 'datasets', message: 'missing: expected a list of datasets', line: 1 }]);
    const noName = yamlError('datasets:\n  - prompts: a.jsonl\n    tokenBudget: 3\n');
    expect(issueAt(noName, 'datasets[0].name').message).toMatch(/^missing: expected a name/);
    expect(issueAt(noName, 'datasets[0].name').line).toBe(2);
  });

  it('turns a YAML syntax error into a ConfigError with file and line', () => {
    const text = 'run: demo\ndatasets:\n  - name: a\n    prompts: [a.jsonl\n    tokenBudget: 5\nsglang: {}\n';
    const err = yamlError(text);
    expect(err.issues.length).toBeGreaterThan(0);
    const first = err.issues[0];
    expect(first?.message).toMatch(/^YAML syntax error: /);
    expect(first?.line).toBeGreaterThanOrEqual(4);
    expect(err.message).toContain(`${join(tmp, 'tokenmill.yaml')}:${String(first?.line)}: (root): YAML syntax error`);
  });

  it('reports a duplicate YAML key at its line', () => {
    const text = `run: a\n${minimalDataset}run: b\n`;
    const err = yamlError(text);
    expect(err.issues[0]?.message).toMatch(/^YAML syntax error: .*unique/);
    expect(err.issues[0]?.line).toBe(lineOf(text, 'run: b'));
  });

  it('rejects an empty file and a file that is not a mapping', () => {
    expect(yamlError('# nothing here\n').issues[0]?.message).toMatch(/empty document/);
    expect(yamlError('- a\n- b\n').issues).toEqual([
      { path: '', message: 'expected a mapping (key: value), got a list (["a","b"])', line: 1 },
    ]);
  });

  it('names the file when it does not exist', () => {
    const missing = join(tmp, 'nope', 'tokenmill.yaml');
    const err = configError(() => loadConfig({ path: missing }));
    expect(err.file).toBe(missing);
    expect(err.message).toContain(missing);
    expect(err.message).toContain('config file not found');
  });

  it('reports paths without lines for object input', () => {
    const err = configError(() =>
      loadConfig({ object: { datasets: [{ name: 'a', prompts: 'p', tokenBudget: 0 }] }, baseDir: tmp }),
    );
    expect(err.issues).toEqual([
      { path: 'datasets[0].tokenBudget', message: 'expected a positive integer (output tokens), got 0' },
    ]);
  });
});

describe('formatConfigPath', () => {
  it('writes indices in brackets and keys with dots', () => {
    expect(formatConfigPath(['datasets', 2, 'tokenBudget'])).toBe('datasets[2].tokenBudget');
    expect(formatConfigPath([])).toBe('');
    expect(formatConfigPath(['datasets', 0, 'sampling', 'odd key'])).toBe('datasets[0].sampling["odd key"]');
  });
});

/** Every key path of the zod schema, e.g. `datasets[].sampling.top_p`, walked independently of the JSON Schema. */
function zodKeyPaths(schema: z.core.$ZodType, prefix: string, out: string[]): string[] {
  let s = schema;
  for (;;) {
    const def = s._zod.def as { innerType?: z.core.$ZodType };
    if (def.innerType === undefined) break;
    s = def.innerType;
  }
  const def = s._zod.def as { type: string; shape?: Record<string, z.core.$ZodType>; element?: z.core.$ZodType };
  if (def.type === 'object' && def.shape !== undefined) {
    for (const [k, v] of Object.entries(def.shape)) {
      const p = prefix === '' ? k : `${prefix}.${k}`;
      out.push(p);
      zodKeyPaths(v, p, out);
    }
  } else if (def.type === 'array' && def.element !== undefined) {
    zodKeyPaths(def.element, `${prefix}[]`, out);
  }
  return out;
}

describe('JSON Schema and reference', () => {
  it('configJsonSchema() is a JSON Schema of an object with every top-level key', () => {
    const schema = configJsonSchema();
    expect(schema.$schema).toMatch(/json-schema\.org/);
    expect(schema.type).toBe('object');
    expect(Object.keys(schema.properties ?? {}).sort()).toEqual(
      [
        'dashboard',
        'datasets',
        'eval',
        'output',
        'postprocess',
        'prepare',
        'redis',
        'run',
        'sglang',
        'tokenizer',
        'train',
        'workers',
      ].sort(),
    );
    expect(schema.required).toEqual(['datasets']);
    expect(schema.additionalProperties).toBe(false);
    const dataset = schema.properties?.datasets?.items;
    expect(dataset?.required).toEqual(['name']);
    expect(dataset?.properties?.maxNewTokens?.default).toBe(10240);
    // sampling lets extra SGLang keys through; other objects do not.
    expect(dataset?.properties?.sampling?.additionalProperties).not.toBe(false);
    expect(schema.properties?.sglang?.properties?.api?.enum).toEqual(['generate', 'chat']);
  });

  it('the Markdown reference lists every key of the schema with a description', () => {
    const md = configReferenceMarkdown();
    const paths = zodKeyPaths(ConfigSchema, '', []);
    expect(paths.length).toBeGreaterThan(30);
    const rows = md.split('\n').filter((l) => l.startsWith('| `'));
    expect(rows).toHaveLength(paths.length);
    for (const p of paths) {
      const row = rows.find((r) => r.startsWith(`| \`${p}\` |`));
      expect(row, p).toBeDefined();
      const description = row?.split(' | ').at(-1)?.replace(/ \|$/, '') ?? '';
      expect(description.length, `description of ${p}`).toBeGreaterThan(10);
    }
    expect(md).toContain('| `sglang.concurrency` | integer > 0 \\| "auto" | `150` |');
    expect(md).toContain('| `datasets[].name` |');
    expect(md).toMatch(/\| `train\.mode` \| "from-scratch" \\\| "resume" \| \*required\* \|/);
  });
});

describe('tokenmill config', () => {
  async function runConfigCommand(args: string[]): Promise<string> {
    const program = new Command('tokenmill').exitOverride();
    registerConfigCommand(program);
    let out = '';
    const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
      out += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      return true;
    });
    try {
      await program.parseAsync(['node', 'tokenmill', 'config', ...args]);
    } finally {
      spy.mockRestore();
    }
    return out;
  }

  it('--schema prints the JSON Schema', async () => {
    const out = await runConfigCommand(['--schema']);
    expect(JSON.parse(out)).toEqual(JSON.parse(JSON.stringify(configJsonSchema())));
  });

  it('-c prints the resolved config with the Redis password masked', async () => {
    const out = await runConfigCommand(['-c', join(fixtures, 'full.yaml')]);
    const printed = JSON.parse(out) as { redis: { url: string }; datasets: { prompts?: string }[] };
    expect(printed.redis.url).toBe('redis://:***@127.0.0.1:6390/2');
    expect(out).not.toContain('s3cret');
    expect(printed.datasets[0]?.prompts).toBe(join(fixtures, 'data/B1_glaive.jsonl'));
  });

  it('-c masks the dashboard token', async () => {
    const dir = useTempDir('tm-cfg-');
    const file = join(dir, 'c.yaml');
    writeFileSync(
      file,
      'datasets: [{ name: a, conversations: a.jsonl }]\ndashboard: { token: very-secret-token-123456 }\n',
    );
    const out = await runConfigCommand(['-c', file]);
    expect(out).not.toContain('very-secret-token-123456');
    expect((JSON.parse(out) as { dashboard: { token: string } }).dashboard.token).toBe('***');
  });

  it('-c on an invalid file throws the ConfigError', async () => {
    await expect(runConfigCommand(['-c', join(fixtures, 'invalid.yaml')])).rejects.toBeInstanceOf(ConfigError);
  });
});
