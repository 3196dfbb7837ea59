/**
 * The simulator with speculative decoding (EAGLE3) over real HTTP, beside a baseline simulator
 * without it in the same process (same model path, ports 0): /server_info's `speculative_*`
 * keys against a real SGLang 0.5.23 answer, `/generate`'s `spec_*` meta_info fields (present,
 * absent, consistent with SGLang's counting), streaming, aborts, per-dataset acceptance and the
 * `tokenmill sim --speculative-*` flags. The speed relation is measured in
 * bench/sim-speculative.ts, not here.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { type SimulatorHandle, type SimulatorOptions, startSimulator } from '../../src/sim/index.js';
import { planSpeculation, specRng } from '../../src/sim/speculative.js';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const REAL_PLAIN = JSON.parse(
  readFileSync(path.join(REPO_ROOT, 'test/fixtures/sglang/server_info-0.5.23-plain.json'), 'utf8'),
) as Record<string, unknown>;

const SPEC_KEYS = [
  'speculative_algorithm',
  'speculative_draft_model_path',
  'speculative_num_steps',
  'speculative_eagle_topk',
  'speculative_num_draft_tokens',
] as const;
const SPEC_META = [
  'spec_accept_rate',
  'spec_accept_length',
  'spec_num_correct_drafts',
  'spec_num_proposed_drafts',
  'spec_verify_ct',
  'spec_correct_drafts_histogram',
];

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- response bodies are asserted field by field
type Json = any;

async function post(url: string, body: unknown): Promise<{ status: number; text: string; json: Json }> {
  const res = await fetch(url, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json' },
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, text, json };
}

async function getJson(url: string): Promise<Json> {
  const res = await fetch(url);
  expect(res.status).toBe(200);
  return res.json();
}

async function waitFor(what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The JSON type of a value, as the fixture comparison needs it. */
function jsonType(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

/** SGLang's counting: histogram sums to verify steps, Σ k·hist[k] = correct drafts, the rest derived. */
function expectConsistent(meta: Json, numDraftTokens: number): void {
  const hist: number[] = meta.spec_correct_drafts_histogram;
  expect(hist.reduce((a, b) => a + b, 0)).toBe(meta.spec_verify_ct);
  expect(hist.reduce((s, n, k) => s + k * n, 0)).toBe(meta.spec_num_correct_drafts);
  expect(hist.length).toBeLessThanOrEqual(numDraftTokens);
  expect(meta.spec_num_proposed_drafts).toBe(meta.spec_verify_ct * (numDraftTokens - 1));
  expect(meta.spec_accept_rate).toBeCloseTo(meta.spec_num_correct_drafts / meta.spec_num_proposed_drafts, 12);
  expect(meta.spec_accept_length).toBeCloseTo(meta.completion_tokens / meta.spec_verify_ct, 12);
  // The prefill's token, then accepted + 1 a step; only the last step may be cut (by at most numSteps).
  const full = 1 + meta.spec_num_correct_drafts + meta.spec_verify_ct;
  expect(meta.completion_tokens).toBeLessThanOrEqual(full);
  expect(meta.completion_tokens).toBeGreaterThanOrEqual(full - (numDraftTokens - 1));
}

const COMMON: SimulatorOptions = {
  timeScale: 20,
  maxRunningRequests: 8,
  contextLength: 32768,
  modelPath: 'Qwen/Qwen3-8B',
  outputLength: { distribution: 'fixed', mean: 400 },
};

let plain: SimulatorHandle;
let spec: SimulatorHandle;

beforeAll(async () => {
  [plain, spec] = await Promise.all([
    startSimulator(COMMON),
    startSimulator({
      ...COMMON,
      speculative: {
        algorithm: 'EAGLE3',
        draftModelPath: 'out/drafters/qwen3-8b-eagle3',
        numSteps: 3,
        acceptance: [0.8, 0.6, 0.4],
        perDataset: { weak: { meanAcceptLength: 1.1 }, strong: { meanAcceptLength: 3.8 } },
      },
    }),
  ]);
});

afterAll(async () => {
  await Promise.all([plain?.stop(), spec?.stop()]);
});

describe('/server_info', () => {
  it('has the keys of a real 0.5.23 server, of the same types, null without speculation', async () => {
    const info = await getJson(`${plain.url}/server_info`);
    for (const key of ['model_path', 'version', 'launch_command', ...SPEC_KEYS]) {
      expect(REAL_PLAIN).toHaveProperty(key);
      expect(info).toHaveProperty(key);
      expect(jsonType(info[key]), key).toBe(jsonType(REAL_PLAIN[key]));
    }
    for (const key of SPEC_KEYS) expect(info[key]).toBeNull();
    expect(info.model_path).toBe('Qwen/Qwen3-8B');
    expect(info.launch_command).toContain(`--model-path Qwen/Qwen3-8B --host 127.0.0.1 --port ${plain.port}`);
    expect(info.launch_command).not.toContain('--speculative');
    expect(info.internal_states[0]).not.toHaveProperty('avg_spec_accept_length');
  });

  it("with speculation: SGLang's EAGLE3 settings, the launch command that gives them, the same model", async () => {
    const info = await getJson(`${spec.url}/server_info`);
    expect(spec.port).not.toBe(plain.port);
    expect(info).toMatchObject({
      model_path: 'Qwen/Qwen3-8B',
      speculative_algorithm: 'EAGLE3',
      speculative_draft_model_path: 'out/drafters/qwen3-8b-eagle3',
      speculative_num_steps: 3,
      speculative_eagle_topk: 1,
      speculative_num_draft_tokens: 4,
    });
    expect(info.launch_command).toContain(
      '--speculative-algorithm EAGLE3 --speculative-draft-model-path out/drafters/qwen3-8b-eagle3 ' +
        '--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4',
    );
    // /model_info is the same on both.
    expect(await getJson(`${spec.url}/model_info`)).toEqual(await getJson(`${plain.url}/model_info`));
  });
});

describe('/generate', () => {
  /** Completions end at 400 tokens (the fixed length) or at max_new_tokens; exactly there with `ignoreEos`. */
  const body = (rid: string, maxNewTokens = 1000, ignoreEos = false) => ({
    rid,
    input_ids: [1, 2, 3, 4],
    sampling_params: { max_new_tokens: maxNewTokens, temperature: 0, ...(ignoreEos ? { ignore_eos: true } : {}) },
  });

  it('adds the spec_* fields with speculation, none without; the output is the same', async () => {
    const [a, b] = await Promise.all([
      post(`${spec.url}/generate`, body('g-1')),
      post(`${plain.url}/generate`, body('g-1')),
    ]);
    expect(a.status).toBe(200);
    expect(b.status).toBe(200);
    for (const key of SPEC_META) {
      expect(a.json.meta_info).toHaveProperty(key);
      expect(b.json.meta_info).not.toHaveProperty(key);
    }
    expect(a.json.output_ids).toEqual(b.json.output_ids);
    expect(a.json.text).toBe(b.json.text);
    expect(a.json.meta_info.completion_tokens).toBe(400);
    expectConsistent(a.json.meta_info, 4);
    expect(a.json.meta_info.spec_accept_length).toBeGreaterThan(1.8);
    expect(a.json.meta_info.spec_accept_length).toBeLessThan(3.2);
  });

  it('cuts the last step at max_new_tokens; one token (the prefill’s) has no verify step and no fields', async () => {
    for (const n of [2, 3, 5, 17, 64]) {
      const r = await post(`${spec.url}/generate`, body(`cut-${n}`, n));
      expect(r.json.meta_info.finish_reason).toEqual({ type: 'length', length: n });
      expect(r.json.meta_info.completion_tokens).toBe(n);
      expectConsistent(r.json.meta_info, 4);
    }
    const one = await post(`${spec.url}/generate`, body('cut-1', 1));
    expect(one.json.meta_info.completion_tokens).toBe(1);
    for (const key of SPEC_META) expect(one.json.meta_info).not.toHaveProperty(key);
  });

  it("a dataset's override applies to the rids that name it (eval:<dataset>:…)", async () => {
    const lengths = async (dataset: string): Promise<number> => {
      const replies = await Promise.all(
        Array.from({ length: 8 }, (_, i) => post(`${spec.url}/generate`, body(`eval:${dataset}:${i}#0`))),
      );
      const steps = replies.reduce((s, r) => s + r.json.meta_info.spec_verify_ct, 0);
      const tokens = replies.reduce((s, r) => s + r.json.meta_info.completion_tokens, 0);
      return tokens / steps;
    };
    const [weak, strong] = [await lengths('weak'), await lengths('strong')];
    expect(weak).toBeGreaterThan(1.0);
    expect(weak).toBeLessThan(1.3);
    expect(strong).toBeGreaterThan(3.5);
    const info = await getJson(`${spec.url}/server_info`);
    expect(info.internal_states[0].avg_spec_accept_length).toBeGreaterThan(1);
  });

  it('streams a verify step at a time; only the final event carries the spec_* fields', async () => {
    // ~1,200 verify steps: about a second here, so the stream has many events.
    const r = await post(`${spec.url}/generate`, { ...body('stream-1', 3000, true), stream: true });
    const events = r.text
      .split('\n\n')
      .filter((c) => c.startsWith('data: ') && c !== 'data: [DONE]')
      .map((c) => JSON.parse(c.slice('data: '.length)) as Json);
    expect(events.length).toBeGreaterThan(5);
    const last = events.at(-1);
    for (const e of events.slice(0, -1)) for (const key of SPEC_META) expect(e.meta_info).not.toHaveProperty(key);
    expect(last.meta_info.completion_tokens).toBe(3000);
    expectConsistent(last.meta_info, 4);
    const counts = events.map((e) => e.meta_info.completion_tokens as number);
    expect([...counts].sort((x, y) => x - y)).toEqual(counts);
    // Every event ends on a verify step: the same plan, drawn from (seed 0, rid), has its boundaries.
    const plan = planSpeculation([0.8, 0.6, 0.4], 3000, specRng(0, 'stream-1'));
    expect(plan.accepted.length).toBe(last.meta_info.spec_verify_ct);
    const boundaries = new Set(plan.emittedBefore.map((e) => 1 + e));
    expect(counts.filter((n) => !boundaries.has(n))).toEqual([]);
  });

  it('an aborted request reports the verify steps it ran, ending on a step boundary', async () => {
    const pending = post(`${spec.url}/generate`, body('abort-1', 30_000, true));
    // 30,000 tokens at ~2.5 a step take seconds here; abort once decoding is under way.
    await waitFor('decoding', async () => {
      const [load] = (await getJson(`${spec.url}/get_load`)) as { num_tokens: number }[];
      return (load?.num_tokens ?? 0) > 200;
    });
    await post(`${spec.url}/abort_request`, { rid: 'abort-1' });
    const r = await pending;
    const meta = r.json.meta_info;
    expect(meta.finish_reason.type).toBe('abort');
    expect(meta.completion_tokens).toBeGreaterThan(100);
    expect(meta.completion_tokens).toBeLessThan(30_000);
    expectConsistent(meta, 4);
    expect(meta.completion_tokens).toBe(1 + meta.spec_num_correct_drafts + meta.spec_verify_ct);
  });
});

describe('tokenmill sim --speculative-*', () => {
  let child: ChildProcess | undefined;

  afterEach(() => {
    if (child !== undefined && child.exitCode === null) child.kill('SIGKILL');
  });

  it('serves with the settings of the flags', async () => {
    child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        'src/cli/main.ts',
        'sim',
        '--port',
        '0',
        '--time-scale',
        '100',
        '--output-distribution',
        'fixed',
        '--mean-output-tokens',
        '64',
        '--speculative-algorithm',
        'EAGLE3',
        '--speculative-draft-model-path',
        'drafter',
        '--speculative-num-steps',
        '5',
        '--speculative-num-draft-tokens',
        '8',
        '--speculative-acceptance',
        '3.0',
        '--speculative-dataset',
        'gsm8k=0.9,0.9,0.9,0.9,0.9',
      ],
      { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    await waitFor('URL on stdout', () => /listening on (http:\/\/\S+)/.test(stdout), 30_000);
    const url = /listening on (http:\/\/\S+)/.exec(stdout)?.[1] ?? '';
    const info = await getJson(`${url}/server_info`);
    expect(info).toMatchObject({ speculative_algorithm: 'EAGLE3', speculative_num_steps: 5 });
    // As SGLang: topk 1 sets the draft tokens to num_steps + 1, with a warning.
    expect(info.speculative_num_draft_tokens).toBe(6);
    expect(stdout + stderr).toContain('speculative_num_draft_tokens is adjusted to speculative_num_steps + 1');
    const r = await post(`${url}/generate`, { input_ids: [1, 2], sampling_params: { max_new_tokens: 100 } });
    expect(r.json.meta_info.spec_num_proposed_drafts).toBe(r.json.meta_info.spec_verify_ct * 5);
    expectConsistent(r.json.meta_info, 6);
  });

  it('refuses a flag without --speculative-algorithm', async () => {
    child = spawn(
      process.execPath,
      ['--import', 'tsx', 'src/cli/main.ts', 'sim', '--port', '0', '--speculative-num-steps', '4'],
      { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((resolve) => child?.on('exit', (c) => resolve(c)));
    expect(code).not.toBe(0);
    expect(stderr).toContain('--speculative-num-steps needs --speculative-algorithm EAGLE3');
  });
});
