// `tokenmill eval` against simulators over real HTTP: a speculative simulator serving the
// attempt's drafter, a baseline serving the target alone. The acceptance length it reports is the
// one the servers' own answers give; a weak drafter is found slower (warning, threshold exit
// code); each refusal says what is wrong and where; an endpoint that is down ends in a bounded,
// named error. The simulator announces itself in /server_info, and the report says its figures
// are the simulator's configured ones; a server without the announcement is measured.
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { evalCommand, EVAL_CHECK_FAILED_EXIT } from '../../src/cli/commands/eval.js';
import {
  loadConfig,
  loadConfiguredTokenizer,
  readPromptFile,
  SglangClient,
  type Config,
  type ConfigInput,
} from '../../src/shared/index.js';
import type { SimulatorHandle, SimulatorOptions } from '../../src/sim/index.js';
import { evalRid, runPhase, type EvalPromptSet, type EvalReport } from '../../src/workers/index.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';

const harness = useHarness({ tmp: true, cli: true });
const { tmp } = harness;

const PROMPTS = 24;
const MAX_NEW_TOKENS = 256;
/** Every answer the same length: the phases' speeds compare without the noise of long tails. */
const SIM: SimulatorOptions = {
  seed: 7,
  timeScale: 20,
  maxRunningRequests: 64,
  outputLength: { distribution: 'fixed', mean: 120 },
};

let runDir: string;
let drafter1: string;
let drafter2: string;
let strong: SimulatorHandle;
let weak: SimulatorHandle;
let baseline: SimulatorHandle;

function configFile(name: string, evalSection: Record<string, unknown>): string {
  const config: ConfigInput = {
    run: 'r',
    datasets: [{ name: 'ds', prompts: 'prompts.jsonl', tokenBudget: 1_000_000 }],
    output: { dir: 'out' },
    eval: { concurrency: 8, maxNewTokens: MAX_NEW_TOKENS, ...evalSection } as ConfigInput['eval'],
  };
  return writeConfig(tmp.dir, config, `${name}.yaml`);
}

const configOf = (file: string): Config => loadConfig({ path: file });

/** The eval error message of `p`; fails the test when it resolves. */
async function refusal(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e: unknown) {
    return e instanceof Error ? e.message : String(e);
  }
  throw new Error('expected a refusal, but eval ran');
}

/**
 * Σ completion tokens / Σ spec_verify_ct of the strong simulator's own answers to the drafter
 * phase's requests, sent here: the same rendered prompts, the same rids (the simulator's
 * answers are a function of its seed, the rid and the prompt).
 */
async function acceptLengthFromServer(config: Config): Promise<{ acceptLength: number; verify: number; hist: number }> {
  const tokenizer = await loadConfiguredTokenizer(config);
  const file = path.join(runDir, 'ds', 'eval-prompts.jsonl');
  const records = [];
  for await (const line of readPromptFile(file)) if (line.ok) records.push(line.record);
  const ids = await tokenizer.encodePrompts(records.map((r) => r.messages));
  const client = new SglangClient({ endpoint: strong.url, concurrency: 8, requestTimeoutMs: 60_000 });
  let completion = 0;
  let verify = 0;
  let hist = 0;
  try {
    const answers = await Promise.all(
      records.map((r, i) =>
        client.generate({
          inputIds: ids[i] as number[],
          maxNewTokens: MAX_NEW_TOKENS,
          samplingParams: { temperature: 0 },
          rid: evalRid('ds', r.id, 'drafter'),
        }),
      ),
    );
    for (const a of answers) {
      completion += a.completionTokens;
      verify += a.metaInfo.spec_verify_ct as number;
      hist += (a.metaInfo.spec_correct_drafts_histogram as number[]).reduce((x, y) => x + y, 0);
    }
  } finally {
    await client.close();
  }
  return { acceptLength: completion / verify, verify, hist };
}

beforeAll(async () => {
  runDir = path.join(tmp.dir, 'out', 'r');
  // Two attempts, each with a drafter checkpoint (the newest folder of checkpoints/ is the final one).
  for (const a of ['0001', '0002']) {
    for (const step of ['step-10', 'step-20']) {
      const dir = path.join(runDir, 'train', a, 'checkpoints', step);
      mkdirSync(dir, { recursive: true });
      writeFileSync(path.join(dir, 'config.json'), '{"architectures":["LlamaForCausalLMEagle3"]}\n');
    }
  }
  drafter1 = path.join(runDir, 'train', '0001', 'checkpoints', 'step-20');
  drafter2 = path.join(runDir, 'train', '0002', 'checkpoints', 'step-20');
  mkdirSync(path.join(runDir, 'ds'), { recursive: true });
  writePrompts(path.join(runDir, 'ds'), 'eval-prompts', PROMPTS);
  writePrompts(tmp.dir, 'prompts', 4);
  [strong, weak, baseline] = await Promise.all([
    harness.startSim({ ...SIM, speculative: { draftModelPath: drafter1, meanAcceptLength: 3, draftOverhead: 0.25 } }),
    harness.startSim({ ...SIM, speculative: { draftModelPath: drafter2, meanAcceptLength: 1.2, draftOverhead: 1 } }),
    harness.startSim(SIM),
  ]);
});

describe('tokenmill eval', () => {
  it("reports the servers' own acceptance length and a real speed-up; writes the attempt's eval.json", async () => {
    const file = configFile('strong', { endpoints: [strong.url], baseline: [baseline.url] });
    const cli = spawnCli(['eval', '-c', file, '--attempt', '1', '--json']);
    const code = await cli.exited;
    expect(code, cli.output()).toBe(0);
    const report = JSON.parse(cli.stdout()) as EvalReport;
    // One warm-up request per slot in flight before the clock starts, left out of the figures.
    const rids = strong.stats().requests.map((r) => r.rid);
    expect(rids.filter((r) => r.startsWith('eval:ds:warmup-')).sort()).toEqual(
      Array.from({ length: 8 }, (_, j) => `eval:ds:warmup-${j}:drafter`).sort(),
    );
    expect(rids.filter((r) => /^eval:ds:eval-prompts-\d+:drafter$/.test(r))).toHaveLength(PROMPTS);
    const own = await acceptLengthFromServer(configOf(file));

    const ds = report.datasets[0];
    expect(report.attempt).toBe('0001');
    expect(report.drafter).toBe(drafter1);
    expect(ds?.dataset).toBe('ds');
    expect(ds?.drafter.requests).toBe(PROMPTS);
    expect(ds?.drafter.failures).toBe(0);
    expect(ds?.baseline?.requests).toBe(PROMPTS);
    const reported = ds?.drafter.acceptLength ?? 0;
    expect(Math.abs(reported - own.acceptLength) / own.acceptLength).toBeLessThan(0.005);
    expect(ds?.drafter.verifySteps).toBe(own.verify);
    expect(ds?.drafter.histogram?.reduce((x, y) => x + y, 0)).toBe(own.hist);
    expect(ds?.drafter.acceptRate).toBeGreaterThan(0);
    expect(report.endpoints[0]).toMatchObject({ url: strong.url, algorithm: 'EAGLE3', draftModelPath: drafter1 });
    // Three tokens a verify step at 1.25 decode steps each: clearly faster than the target alone.
    expect(report.overall.speedup).toBeGreaterThan(1.3);
    expect(report.warnings).toEqual([]);
    expect(report.previous).toBeNull();
    // The simulator said what it is: the figures are its configured acceptance, not the drafter's.
    expect(report.source).toBe('simulator');
    expect(report.simulated?.acceptanceConfigured).toBe(true);
    expect(report.simulated?.datasets.ds).toBeCloseTo(3, 4);
    expect(report.endpoints[0]?.simulator).toMatchObject({ imitates: '0.5.4', draftOverhead: 0.25 });
    expect(report.baseline?.[0]?.simulator).toMatchObject({ imitates: '0.5.4', meanAcceptLength: null });
    const written = JSON.parse(readFileSync(path.join(runDir, 'train', '0001', 'eval.json'), 'utf8')) as EvalReport;
    expect(written.overall.drafter.acceptLength).toBe(report.overall.drafter.acceptLength);
  });

  it('a weak drafter is found slower: the warning, the deltas against attempt 1, and exit code 3 below the thresholds', async () => {
    const file = configFile('weak', {
      endpoints: [weak.url],
      baseline: [baseline.url],
      minSpeedup: 1,
      minAcceptLength: 2,
    });
    const cli = spawnCli(['eval', '-c', file, '--json']);
    const code = await cli.exited;
    expect(code, cli.output()).toBe(EVAL_CHECK_FAILED_EXIT);
    const report = JSON.parse(cli.stdout()) as EvalReport;
    expect(report.attempt).toBe('0002');
    expect(report.overall.speedup).toBeLessThan(0.9);
    expect(report.ok).toBe(false);
    expect(report.failed.map((f) => f.check).sort()).toEqual(['minAcceptLength', 'minSpeedup']);
    expect(report.previous?.attempt).toBe('0001');
    expect(report.datasets[0]?.delta?.acceptLength).toBeLessThan(-0.5);
    expect(report.warnings.some((w) => w.startsWith('dataset ds: the drafter makes decoding slower: '))).toBe(true);
    expect(report.warnings.some((w) => w.includes('acceptance length fell by'))).toBe(true);
    // A person sees it on stderr too.
    expect(cli.output()).toMatch(/WARNING: dataset ds: the drafter makes decoding slower: [\d.]+ vs [\d.]+ tok\/s/);
    expect(cli.output()).toContain('FAILED: speed-up');

    // The table, without --json: the deltas and the same warning.
    const table = spawnCli(['eval', '-c', file, '--attempt', '2']);
    expect(await table.exited, table.output()).toBe(EVAL_CHECK_FAILED_EXIT);
    expect(table.stdout()).toMatch(/Δ accept len/);
    expect(table.stdout()).toMatch(/^ds\s+24\s+/m);
    expect(table.stdout()).toContain('WARNING: dataset ds: the drafter makes decoding slower');
  });

  it('refuses an endpoint without speculative decoding, naming it, as one line and exit code 1', async () => {
    const file = configFile('plain', { endpoints: [baseline.url] });
    const cli = spawnCli(['eval', '-c', file, '--attempt', '1']);
    expect(await cli.exited).toBe(1);
    expect(cli.output().trim()).toBe(
      `tokenmill: eval: endpoint ${baseline.url} serves without speculative decoding (/server_info speculative_algorithm: null); ` +
        `start it with --speculative-algorithm EAGLE3 --speculative-draft-model-path ${drafter1}, or list it in eval.baseline`,
    );
  });

  it("refuses a drafter endpoint serving another drafter than the attempt's, saying both paths", async () => {
    const config = configOf(configFile('wrong', { endpoints: [weak.url] }));
    const msg = await refusal(evalCommand(config, { attempt: '1' }));
    expect(msg).toBe(
      `eval: endpoint ${weak.url} serves the drafter ${drafter2}, not the one evaluated: ${drafter1}, attempt 0001's final output`,
    );
  });

  it('compares real paths: a --checkpoint through a symbolic link is the drafter it points to', async () => {
    const link = path.join(tmp.dir, 'drafter-link');
    symlinkSync(drafter1, link);
    const out = path.join(tmp.dir, 'link-eval.json');
    const config = configOf(configFile('link', { endpoints: [strong.url], maxPromptsPerDataset: 4 }));
    const { report, files } = await evalCommand(config, { checkpoint: link, out });
    expect(report.attempt).toBeNull();
    expect(report.baseline).toBeNull();
    expect(report.overall.speedup).toBeNull();
    expect(report.datasets[0]?.prompts).toBe(4);
    expect(files).toEqual([out]);
    expect((JSON.parse(readFileSync(out, 'utf8')) as EvalReport).drafter).toBe(link);
  });

  it('refuses a baseline that decodes speculatively, or that serves another model', async () => {
    const spec = configOf(configFile('spec-base', { endpoints: [strong.url], baseline: [weak.url] }));
    expect(await refusal(evalCommand(spec, { attempt: '1' }))).toBe(
      `eval: baseline endpoint ${weak.url} decodes speculatively (/server_info speculative_algorithm: EAGLE3, drafter ${drafter2}); ` +
        'a baseline must serve the target alone',
    );
    const other = await harness.startSim({ ...SIM, modelPath: 'Qwen/Qwen3-32B' });
    const config = configOf(configFile('other-base', { endpoints: [strong.url], baseline: [other.url] }));
    expect(await refusal(evalCommand(config, { attempt: '1' }))).toBe(
      `eval: baseline endpoint ${other.url} serves the model Qwen/Qwen3-32B, but drafter endpoint ${strong.url} serves Qwen/Qwen3-8B: ` +
        'the speed-up would compare two targets',
    );
  });

  it('refuses answers without spec_verify_ct from a drafter endpoint', async () => {
    const tokenizer = await loadConfiguredTokenizer(configOf(configFile('phase', { endpoints: [strong.url] })));
    const [ids] = await tokenizer.encodePrompts([[{ role: 'user', content: 'hello' }]]);
    const set: EvalPromptSet = {
      dataset: 'ds',
      file: 'x',
      prompts: Array.from({ length: 6 }, (_, i) => ({ id: `p${i}`, inputIds: ids as number[], maxNewTokens: 32 })),
      sampling: { temperature: 0 },
      rejected: [],
    };
    // A plain simulator as the drafter endpoint: its answers carry no speculative fields.
    const client = new SglangClient({ endpoint: baseline.url, concurrency: 4, requestTimeoutMs: 30_000 });
    try {
      const msg = await refusal(runPhase({ phase: 'drafter', clients: [client], set, concurrency: 4 }));
      expect(msg).toMatch(
        new RegExp(
          `^eval: endpoint ${baseline.url.replace(/[.]/g, '\\.')} answered /generate \\(rid eval:ds:p\\d:drafter\\) without meta_info\\.spec_verify_ct: it is not decoding speculatively`,
        ),
      );
    } finally {
      await client.close();
    }
  });

  it('an endpoint that is down ends in a bounded error naming it', async () => {
    const gone = await harness.startSim(SIM);
    const url = gone.url;
    await gone.stop();
    const config = configOf(configFile('down', { endpoints: [url] }));
    const msg = await refusal(
      evalCommand(config, { attempt: '1' }, { retry: { attempts: 3, backoffMs: 50, maxBackoffMs: 100 } }),
    );
    expect(msg).toMatch(
      new RegExp(
        `^eval: endpoint ${url.replace(/[.]/g, '\\.')} is down: GET /server_info failed 3 times over [\\d.]+ s \\(.*ECONNREFUSED`,
      ),
    );
  });

  it('says what is missing: no eval section, no held-out prompts, no attempt', async () => {
    const bare = loadConfig({
      object: {
        run: 'r',
        datasets: [{ name: 'ds', prompts: 'prompts.jsonl', tokenBudget: 10 }],
        output: { dir: 'out' },
      },
      baseDir: tmp.dir,
    });
    expect(await refusal(evalCommand(bare, {}))).toMatch(/^eval: the config has no eval section: set eval\.endpoints/);
    const noHoldout = loadConfig({
      object: {
        run: 'r',
        datasets: [{ name: 'other', prompts: 'prompts.jsonl', tokenBudget: 10 }],
        output: { dir: 'out' },
        eval: { endpoints: [strong.url] },
      },
      baseDir: tmp.dir,
    });
    expect(await refusal(evalCommand(noHoldout, { attempt: '1' }))).toMatch(
      /^eval: no prompts to evaluate on: other: no held-out prompts \(.*other\/eval-prompts\.jsonl; set datasets\[\]\.evalHoldout\)/,
    );
    expect(
      await refusal(evalCommand(configOf(configFile('none', { endpoints: [strong.url] })), { attempt: '9' })),
    ).toMatch(/^eval: no attempt 0009 under .*train \(attempts: 0001, 0002\)$/);
  });

  it('the simulator announces itself; the table and the --out file say the figures are its configured ones', async () => {
    const info = (await (await fetch(`${strong.url}/server_info`)).json()) as Record<string, unknown>;
    expect(info.version).toBe('0.5.4');
    expect(info.tokenmill_simulator).toMatchObject({
      simulator: 'tokenmill sim',
      imitates: '0.5.4',
      speculative: { algorithm: 'EAGLE3', num_steps: 3, per_dataset: {}, draft_overhead: 0.25 },
    });
    const out = path.join(tmp.dir, 'simulated.json');
    const file = configFile('strong-table', { endpoints: [strong.url], baseline: [baseline.url] });
    const cli = spawnCli(['eval', '-c', file, '--checkpoint', drafter1, '--out', out]);
    expect(await cli.exited, cli.output()).toBe(0);
    const text = cli.stdout();
    expect(text).toMatch(
      /^ {2}SIMULATED: the acceptance is the simulator's configured one \(accept len 3\.00\), not measured from$/m,
    );
    expect(text).toContain(
      `  drafter   ${strong.url}: EAGLE3, 3 steps, topk 1, 4 draft tokens (tokenmill sim, imitating SGLang 0.5.4)`,
    );
    expect(text).toMatch(/^ds +24 +\d\.\d\d +3\.00 +0\.\d{3} /m);
    const report = JSON.parse(readFileSync(out, 'utf8')) as EvalReport;
    expect(report).toMatchObject({ attempt: null, source: 'simulator', simulated: { meanAcceptLength: 3 } });
  });

  it('a server that does not announce itself is measured: no word of simulation in the report or the table', async () => {
    const [drafterSim, baselineSim] = await Promise.all([
      harness.startSim({
        ...SIM,
        announce: false,
        speculative: { draftModelPath: drafter1, meanAcceptLength: 3, draftOverhead: 0.25 },
      }),
      harness.startSim({ ...SIM, announce: false }),
    ]);
    const info = (await (await fetch(`${drafterSim.url}/server_info`)).json()) as Record<string, unknown>;
    expect(Object.keys(info).filter((k) => k.startsWith('tokenmill'))).toEqual([]);
    const out = path.join(tmp.dir, 'measured.json');
    const file = configFile('quiet', { endpoints: [drafterSim.url], baseline: [baselineSim.url] });
    const cli = spawnCli(['eval', '-c', file, '--checkpoint', drafter1, '--out', out]);
    expect(await cli.exited, cli.output()).toBe(0);
    expect(cli.stdout()).not.toMatch(/SIMULATED|configured|tokenmill sim/);
    expect(cli.stdout()).toContain('4 draft tokens (SGLang 0.5.4)');
    const report = JSON.parse(readFileSync(out, 'utf8')) as EvalReport;
    expect(report).toMatchObject({ source: 'sglang', simulated: null });
    expect(report.endpoints[0]?.simulator).toBeNull();
    expect(report.baseline?.[0]?.simulator).toBeNull();
  });
});
