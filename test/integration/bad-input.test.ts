/**
 * The bad input catalogue: config mistakes, broken prompt files and bad server answers. Each
 * case must end in a clear message naming the config path and line, the prompt file and line,
 * or the endpoint — nothing lost, the run goes on. Prompt-file cases share one real run (one
 * dataset file with many bad lines), server-answer cases one run with a mix of faults, and the
 * API key one run without it, then one with it.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { ConfigError, RunKeys, loadConfig } from '../../src/shared/index.js';
import { BAD_ANSWERS } from '../../src/sim/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli, waitFor } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 5,
    contextLength: 2048,
    outputLength: { distribution: 'fixed', mean: 24 },
  },
  tmp: 'tm-bad-input-',
  cli: true,
});

async function cli(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number | string; output: string }> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    const p = spawnCli(args);
    return { code: await p.exited, output: p.output() };
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// config

/** The ConfigError that loading `yaml` throws (the file is written to the temp folder). */
function configErrorOf(yaml: string, name: string, env: Record<string, string> = {}): ConfigError {
  const file = path.join(tmp.dir, name);
  writeFileSync(file, yaml);
  try {
    loadConfig({ path: file }, { env });
  } catch (e: unknown) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error(`expected ${name} to be rejected`);
}

const DATASET = 'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: 1000\n';

describe('bad config: every problem named with its path and line', () => {
  const cases: Array<{ name: string; yaml: string; env?: Record<string, string>; expect: RegExp[] }> = [
    {
      name: 'unknown key (a typo)',
      yaml: `sglang:\n  endpoint: http://127.0.0.1:30000\n${DATASET}`,
      expect: [/:2: sglang.endpoint/, /unknown key|not allowed|unrecognized/i],
    },
    {
      name: 'wrong type',
      yaml: 'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: lots\n',
      expect: [/:4: datasets\[0\]\.tokenBudget/, /got "lots"/],
    },
    {
      name: 'negative budget',
      yaml: 'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: -5\n',
      expect: [/:4: datasets\[0\]\.tokenBudget/, /got -5/],
    },
    {
      name: 'duplicate dataset names',
      yaml: `${DATASET}  - name: a\n    prompts: b.jsonl\n    tokenBudget: 10\n`,
      expect: [/:5: datasets\[1\]\.name/, /unique dataset name.*datasets\[0\]/],
    },
    {
      name: 'endpoint without a scheme',
      yaml: `sglang:\n  endpoints: ["127.0.0.1:30000"]\n${DATASET}`,
      expect: [/:2: sglang\.endpoints\[0\]/, /http:\/\/ or https:\/\/ URL/],
    },
    {
      name: 'endpoint with another scheme',
      yaml: `sglang:\n  endpoints: ["ftp://gpu-1:30000"]\n${DATASET}`,
      expect: [/sglang\.endpoints\[0\]/, /http:\/\/ or https:\/\/ URL/],
    },
    {
      name: 'no endpoints',
      yaml: `sglang:\n  endpoints: []\n${DATASET}`,
      expect: [/sglang\.endpoints/, /at least one SGLang endpoint/],
    },
    {
      name: 'YAML syntax error',
      yaml: 'datasets:\n  - name: a\n    prompts: [a.jsonl\n',
      expect: [/YAML syntax error/, /tokenmill-yaml-syntax-error\.yaml:\d+:/],
    },
    { name: 'empty file', yaml: '', expect: [/empty document/] },
    {
      name: 'dataset name with a slash',
      yaml: 'datasets:\n  - name: a/b\n    prompts: a.jsonl\n    tokenBudget: 10\n',
      expect: [/:2: datasets\[0\]\.name/, /letters, digits/],
    },
    {
      name: 'top_p out of range',
      yaml: `${DATASET}    sampling: { top_p: 1.5 }\n`,
      expect: [/datasets\[0\]\.sampling\.top_p/, /\(0, 1\]/],
    },
    {
      name: 'apiKey of the wrong type',
      yaml: `sglang:\n  apiKey: 12345\n${DATASET}`,
      expect: [/:2: sglang\.apiKey/, /expected an API key/],
    },
    {
      name: 'SGLANG_API_KEY with a line break',
      yaml: DATASET,
      env: { SGLANG_API_KEY: 'sk\nx' },
      expect: [/SGLANG_API_KEY/, /without line breaks/],
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const file = `tokenmill-${c.name
        .replace(/[^a-z]+/gi, '-')
        .toLowerCase()
        .replace(/-+$/, '')}.yaml`;
      const e = configErrorOf(c.yaml, file, c.env);
      for (const re of c.expect) expect(e.message).toMatch(re);
      expect(e.message).toContain(file);
    });
  }

  it('a missing config file, and `run` on a bad config: one clear message, exit 1, no stack trace', async () => {
    expect(() => loadConfig({ path: path.join(tmp.dir, 'nope.yaml') })).toThrow(
      /nope\.yaml: \(root\): config file not found/,
    );
    const file = path.join(tmp.dir, 'bad-run.yaml');
    writeFileSync(file, `sglang:\n  concurrency: many\n${DATASET}`);
    const { code, output } = await cli(['run', '-c', file]);
    expect(code).toBe(1);
    expect(output).toMatch(/bad-run\.yaml:2: sglang\.concurrency: expected a positive integer, got "many"/);
    expect(output).not.toMatch(/\n\s+at .*\.ts:\d+/);
  });
});

// ---------------------------------------------------------------------------------------------
// prompt files

interface Reject {
  file: string;
  line: number;
  reason: string;
  id?: string;
}

/** Lines of the prompt-file run: [text, expected reject reason (undefined: generated), id]. */
const PROMPT_LINES: Array<[string, RegExp | undefined, string?]> = (() => {
  const good = (id: string) => JSON.stringify({ id, prompt: `Explain item ${id} briefly.` });
  return [
    [`\uFEFF${good('bom-first')}`, undefined, 'bom-first'], // 1: a BOM before the first line
    [good('g-1'), undefined, 'g-1'], // 2
    ['{"id": "broken", "prompt": "unterminated', /invalid JSON/], // 3
    ['', undefined], // 4: a blank line: skipped, still counted
    [good('g-2'), undefined, 'g-2'], // 5
    [JSON.stringify({ id: 'empty', prompt: '' }), /empty/], // 6
    [JSON.stringify({ id: 'blank', prompt: '   \n\t ' }), /empty/], // 7
    [
      JSON.stringify({ id: 'huge', prompt: 'lorem ipsum dolor '.repeat(20_000) }),
      /prompt has \d+ tokens; the model's context length is 2048/,
    ], // 8
    [good('g-1'), /repeat|duplicate|first/i], // 9: duplicate id
    [good('dir/with/slashes'), undefined, 'dir/with/slashes'], // 10: an id with '/'
    [
      JSON.stringify({
        id: 'assistant-last',
        messages: [
          { role: 'user', content: 'hi' },
          { role: 'assistant', content: 'hello' },
        ],
      }),
      /last message must be a user turn/,
    ], // 11
    [JSON.stringify(['not', 'an', 'object']), /expected a JSON object/], // 12
    [JSON.stringify({ id: 'no-prompt', text: 'hello' }), /expected one of "messages", "conversations" or "prompt"/], // 13
    [JSON.stringify({ id: { nested: true }, prompt: 'x' }), /"id" must be a non-empty string or a number/], // 14
    [JSON.stringify({ id: 'bad-role', messages: [{ role: 'wizard', content: 'hi' }] }), /role/], // 15
    [JSON.stringify({ id: 'no-user', conversations: [{ from: 'gpt', value: 'hi' }] }), /no user turn|role|from/], // 16
    [JSON.stringify({ id: 'prompt-number', prompt: 42 }), /"prompt" must be a string/], // 17
    [good('g-3'), undefined, 'g-3'], // 18
    [good('not-utf8').replace('briefly', 'bri\u0000PLACEHOLDER'), /UTF-8/], // 19: bytes that are not UTF-8 (patched in)
    [good('g-4'), undefined, 'g-4'], // 20
    [JSON.stringify({ id: 12345, prompt: 'numeric id' }), undefined, '12345'], // 21: a numeric id is fine
  ];
})();
const BOM_LINE = 1;
const NOT_UTF8_LINE = 19;

interface PromptRun {
  file: string;
  rejects: Reject[];
  generated: string[];
}

let promptRun: Promise<PromptRun> | undefined;

/** The one run over the prompt file with every bad line (CRLF endings, no final newline). */
function runPromptFile(): Promise<PromptRun> {
  promptRun ??= (async () => {
    const dir = path.join(tmp.dir, 'prompts-run');
    mkdirSync(dir, { recursive: true });
    const buf = Buffer.from(PROMPT_LINES.map(([t]) => t).join('\r\n'), 'utf8');
    const marker = Buffer.from('\u0000PLACEHOLDER', 'utf8');
    const at = buf.indexOf(marker);
    const file = path.join(dir, 'mixed.jsonl');
    writeFileSync(
      file,
      Buffer.concat([buf.subarray(0, at), Buffer.from([0xff, 0xfe, 0xc3, 0x28]), buf.subarray(at + marker.length)]),
    );
    const cfg = writeTestConfig(dir, {
      run: 'bad-prompts',
      redis,
      sim,
      sglang: { concurrency: 8, contextLength: 2048 },
      datasets: [{ name: 'mixed', prompts: 'mixed.jsonl', tokenBudget: 1_000_000, maxNewTokens: 32, batchSize: 4 }],
    });
    const { code, output } = await cli(['run', '-c', cfg]);
    if (code !== 0) throw new Error(`run exited ${code}:\n${output}`);
    const runDir = path.join(dir, 'out', 'bad-prompts');
    const rejects = readFileSync(path.join(runDir, 'mixed', 'rejects.jsonl'), 'utf8')
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as Reject);
    return { file, rejects, generated: readGenerations(runDir, 'mixed').map((g) => g.id) };
  })();
  return promptRun;
}

describe('bad prompt files: one run, every bad line in rejects.jsonl with its file and line, the rest generated', () => {
  it('generates the good lines (CRLF, an id with "/", a numeric id) and rejects each bad one with file, line and reason', async () => {
    const { file, rejects, generated } = await runPromptFile();
    const problems: string[] = [];
    for (const [i, [, reason, id]] of PROMPT_LINES.entries()) {
      const line = i + 1;
      if (line === BOM_LINE || line === NOT_UTF8_LINE) continue; // their own tests below
      const r = rejects.filter((x) => x.line === line);
      if (reason === undefined) {
        if (r.length > 0) problems.push(`line ${line} (${id ?? 'blank'}) was rejected: ${r[0]?.reason}`);
        else if (id !== undefined && !generated.includes(id)) problems.push(`line ${line}: ${id} was not generated`);
        continue;
      }
      if (r.length !== 1) problems.push(`line ${line}: expected one reject matching ${reason}, got ${r.length}`);
      else if (!reason.test(r[0]?.reason ?? ''))
        problems.push(`line ${line}: reason ${JSON.stringify(r[0]?.reason)} does not match ${reason}`);
      else if (r[0]?.file !== file) problems.push(`line ${line}: the reject names file ${r[0]?.file}`);
    }
    expect(problems).toEqual([]);
    expect(rejects.find((r) => r.line === 9)?.reason).toContain('line 2');
    expect(duplicates(generated)).toEqual([]);
  }, 60_000);

  // The BOM that some Windows editors write is skipped: read as part of line 1, it made the
  // line "invalid JSON" and the first prompt was lost.
  it('a UTF-8 BOM before the first line is ignored: line 1 is generated', async () => {
    const { rejects, generated } = await runPromptFile();
    expect(rejects.filter((r) => r.line === BOM_LINE)).toEqual([]);
    expect(generated).toContain('bom-first');
  }, 60_000);

  // Decoded with replacement characters, such a line was generated from a silently altered
  // prompt; it is rejected, naming the bad byte and its column.
  it('a line with bytes that are not UTF-8 is rejected, naming its line', async () => {
    const { rejects, generated } = await runPromptFile();
    expect(rejects.filter((r) => r.line === NOT_UTF8_LINE).map((r) => r.reason)).toEqual([
      expect.stringMatching(/^not valid UTF-8 \(byte 0xff at column 53\)$/),
    ]);
    expect(generated).not.toContain('not-utf8');
  }, 60_000);
});

// ---------------------------------------------------------------------------------------------
// server answers

describe('bad server answers: one run through a mix of faults, nothing lost', () => {
  it('queue-full 503s, 500s, HTML 502 pages, wrong shapes, missing output_ids, negative counts, truncated JSON and 413s', async () => {
    const dir = path.join(tmp.dir, 'answers-run');
    mkdirSync(dir, { recursive: true });
    const n = 40;
    writeFileSync(
      path.join(dir, 'answers.jsonl'),
      Array.from({ length: n }, (_, i) =>
        JSON.stringify({ id: `q-${i}`, prompt: `Question ${i}: say something short.` }),
      ).join('\n'),
    );
    const cfg = writeTestConfig(dir, {
      run: 'bad-answers',
      redis,
      sim,
      sglang: {
        concurrency: 8,
        contextLength: 2048,
        maxAttempts: 10,
        healthCheckIntervalMs: 200,
      },
      datasets: [{ name: 'answers', prompts: 'answers.jsonl', tokenBudget: 1_000_000, maxNewTokens: 32, batchSize: 4 }],
    });
    // Every bad shape but 413 (which fails the prompt it hits) cycles while the run goes on.
    const retryable = BAD_ANSWERS.filter((k) => k !== '413');
    sim.resetStats();
    sim.setFaults({
      firstTry503Rate: 0.1,
      errorRate: 0.03,
      malformedRate: 0.03,
      badAnswerRate: 0.12,
      badAnswer: 'html502',
    });
    let k = 0;
    const cycle = setInterval(() => {
      k += 1;
      // One short window of 413s.
      const kind = k === 6 ? '413' : retryable[k % retryable.length];
      if (kind !== undefined) sim.setFaults({ badAnswer: kind });
    }, 40);
    let result: { code: number | string; output: string };
    try {
      result = await cli(['run', '-c', cfg]);
    } finally {
      clearInterval(cycle);
      sim.clearFaults();
    }
    expect(result.code, result.output).toBe(0);
    expect(sim.stats().failed).toBeGreaterThan(5);

    const runDir = path.join(dir, 'out', 'bad-answers');
    const generated = readGenerations(runDir, 'answers');
    expect(duplicates(generated.map((g) => g.id))).toEqual([]);
    // Every answer written is a whole, valid one.
    for (const g of generated) {
      expect(g.output_ids.length).toBe(g.completion_tokens);
      expect(g.completion_tokens).toBeGreaterThan(0);
    }
    const keys = new RunKeys(redis.prefix, 'bad-answers');
    const r = redis.connection('client');
    const failed = await r.hgetall(keys.failed('answers'));
    // Only a 413 may fail a prompt, with a reason naming it and the endpoint.
    for (const [id, json] of Object.entries(failed)) {
      const f = JSON.parse(json) as { reason: string; status?: number; endpoint: string };
      expect(f.status, `${id}: ${f.reason}`).toBe(413);
      expect(f.reason).toContain('too large');
      expect(f.endpoint).toBe(sim.url);
    }
    expect(generated.length + Object.keys(failed).length).toBe(n);
  }, 90_000);
});

describe('a server that wants an API key', () => {
  const { sim: keyed } = useHarness({
    sim: {
      timeScale: 200,
      seed: 6,
      contextLength: 2048,
      outputLength: { distribution: 'fixed', mean: 16 },
      apiKey: 'sk-catalogue',
    },
  });
  let dir: string;
  let cfg: string;
  const keys = () => new RunKeys(redis.prefix, 'api-key');

  beforeAll(() => {
    dir = path.join(tmp.dir, 'key-run');
    mkdirSync(dir, { recursive: true });
    writeFileSync(
      path.join(dir, 'k.jsonl'),
      Array.from({ length: 12 }, (_, i) => JSON.stringify({ id: `k-${i}`, prompt: `Key ${i}` })).join('\n'),
    );
    cfg = writeTestConfig(dir, {
      run: 'api-key',
      redis,
      sim: keyed,
      sglang: { concurrency: 4, contextLength: 2048, healthCheckIntervalMs: 200 },
      datasets: [{ name: 'k', prompts: 'k.jsonl', tokenBudget: 1_000_000, maxNewTokens: 16, batchSize: 4 }],
    });
  });

  it('without the key: the 401 names the endpoint and sglang.apiKey, takes the endpoint out of rotation, fails nothing', async () => {
    const first = spawnCli(['run', '-c', cfg]);
    await waitFor(() => keyed.stats().failed > 0, 'a request refused with 401', 30_000);
    await waitFor(() => /endpoint out of rotation/.test(first.output()), 'the endpoint taken out of rotation', 15_000);
    const out = first.output();
    expect(out).toContain(`SGLang endpoint ${keyed.url} answered 401 Unauthorized to POST /generate`);
    expect(out).toContain('check sglang.apiKey');
    const r = redis.connection('client');
    expect(await r.hlen(keys().failed('k'))).toBe(0);
    first.child.kill('SIGTERM');
    // Stopped unfinished: 143, and still nothing failed.
    expect(await first.exited).toBe(143);
    expect(await r.hlen(keys().failed('k'))).toBe(0);
    expect(first.output()).not.toContain('sk-catalogue');
  }, 60_000);

  it('with SGLANG_API_KEY: the same run completes, every prompt generated once, none failed', async () => {
    process.env['SGLANG_API_KEY'] = 'sk-catalogue';
    let second: ReturnType<typeof spawnCli>;
    try {
      second = spawnCli(['run', '-c', cfg]);
    } finally {
      delete process.env['SGLANG_API_KEY'];
    }
    const code = await Promise.race([
      second.exited,
      new Promise<string>((r) => setTimeout(() => r('still running'), 15_000)),
    ]);
    if (code === 'still running') second.child.kill('SIGKILL');
    expect(code, second.output()).toBe(0);
    expect(second.output()).not.toContain('sk-catalogue');
    const ids = readGenerations(path.join(dir, 'out', 'api-key'), 'k').map((g) => g.id);
    expect(ids.sort()).toEqual(Array.from({ length: 12 }, (_, i) => `k-${i}`).sort());
    expect(await redis.connection('client').hlen(keys().failed('k'))).toBe(0);
  }, 30_000);
});
