// The trainer recipes of deploy/ checked with the trainers' own code (the `trainers` Python
// environment: SpecForge 0.2.0, speculators 0.9.0, CPU torch), no GPU and no model weights:
// - deploy/tokenmill.specforge.yaml and deploy/tokenmill.speculators.yaml (and the commented
//   alternative chain in each) load with tokenmill's config loader; every step reads only
//   earlier steps' outputs;
// - each step's argv, filled in as the train worker fills it (buildArgv + withStepOutputs), is
//   parsed by the program it runs: tokenmill's CLI (commander), `specforge train` (SpecForge's
//   argparse, load_config with the step's section.field=value overrides, its algorithm
//   resolution and launch planner, `--plan`), `speculators` (its typer app, and
//   TrainConfig.resolve behind `-m speculators.train`), and the values the chain relies on come
//   out (each data path is the earlier step's output, max_length and chat template agree
//   between capture and training, the GPU split matches the step's GPUs);
// - the compose override mounts the recipes where the steps read them;
// - the data side of SpecForge's online chain on CPU: a small training dataset made by
//   `tokenmill postprocess` from generation records, the chain's export step run as the worker
//   would run it, the vocab-mapping step run on its rows, and SpecForge's own prompt preparation
//   (prepare_prompt_tasks with the recipe's data settings) on them.
// Container paths (/models, /opt/SpecForge, /data/out, /config/trainers) are mapped to temp
// folders: a target "model" that is its config.json only, and a draft config.
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import type { Command } from 'commander';
import { parse } from 'yaml';
import { beforeAll, describe, expect, it } from 'vitest';

import { buildProgram } from '../../src/cli/main.js';
import { EXPORT_FORMATS } from '../../src/cli/commands/export.js';
import {
  bundledTokenizerPath,
  loadConfig,
  loadTokenizer,
  type ChatMessage,
  type Config,
} from '../../src/shared/index.js';
import type { TrainPayload } from '../../src/shared/queues/train-queue.js';
import { withStepOutputs } from '../../src/workers/train/chain.js';
import { stepGpuNeed } from '../../src/workers/train/gpu-need.js';
import { buildArgv } from '../../src/workers/train/command.js';
import { useHarness } from '../helpers/fixture.js';
import { repoRoot, spawnCli, writeConfig } from '../helpers/pipeline.js';
import { ensurePythonEnv, runProcess, runPythonJson } from '../helpers/python.js';

const DEPLOY = path.join(repoRoot, 'deploy');
const RECIPES = path.join(DEPLOY, 'trainers');
/** The tokenmill configs with trainer chains: EAGLE-3 and DFlash, each with SpecForge and speculators. */
const CHAIN_FILES = [
  'tokenmill.specforge.yaml',
  'tokenmill.speculators.yaml',
  'tokenmill.specforge-dflash.yaml',
  'tokenmill.speculators-dflash.yaml',
];
/** The mask token the DFlash recipes name: Qwen3's first embedding row past its tokenizer. */
const DFLASH_MASK_TOKEN = 151669;
const OVERRIDE = path.join(RECIPES, 'docker-compose.trainers.yml');
/** Where every container mounts the config (docker-compose.yml). */
const CONFIG_IN_CONTAINER = '/config/tokenmill.yaml';
const PLACEHOLDER = /\{([^}]*)\}/g;
const PY_TIMEOUT_MS = 240_000;
/** Tests that start the trainers' Python (torch, SpecForge, speculators: seconds each on this machine). */
const PYTHON_TEST_MS = 300_000;
const SMOKE_TEST_MS = 600_000;

type Step = NonNullable<NonNullable<Config['train']>['steps']>[number];

interface Chain {
  /** `<file> (active)` or `<file> (commented)`. */
  label: string;
  config: Config;
  steps: Step[];
}

// ---------------------------------------------------------------------------------------------
// The configs and their chains
// ---------------------------------------------------------------------------------------------

/** The commented alternative `steps:` of a config, between its two markers, as YAML text. */
function commentedChain(text: string, file: string): string | undefined {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => /^\s*# --- (online|offline) chain/.test(l));
  if (start === -1) return undefined;
  const end = lines.findIndex((l, i) => i > start && /^\s*# --- end of the (online|offline) chain/.test(l));
  if (end === -1) throw new Error(`${file}: the commented chain has no end marker`);
  return lines
    .slice(start + 1, end)
    .map((l) => l.replace(/^ {2}# ?/, ''))
    .join('\n');
}

/** Every tokenmill config in deploy/, with its chain and the commented one. */
function chainsOf(file: string): Chain[] {
  const text = readFileSync(file, 'utf8');
  const name = path.basename(file);
  const config = loadConfig({ path: file });
  const chains: Chain[] = [];
  if (config.train?.steps !== undefined) chains.push({ label: `${name} (active)`, config, steps: config.train.steps });
  const alt = commentedChain(text, name);
  if (alt !== undefined) {
    const object = parse(text) as { train: Record<string, unknown> };
    object.train.steps = (parse(alt) as { steps: unknown }).steps;
    const altConfig = loadConfig({ object, baseDir: DEPLOY });
    chains.push({ label: `${name} (commented)`, config: altConfig, steps: altConfig.train?.steps ?? [] });
  }
  return chains;
}

const configFiles = readdirSync(DEPLOY)
  .filter((f) => /^tokenmill.*\.ya?ml$/.test(f))
  .map((f) => path.join(DEPLOY, f));
const chainsByFile = new Map(configFiles.map((f) => [path.basename(f), chainsOf(f)]));

function chains(file: string): Chain[] {
  const c = chainsByFile.get(file);
  if (c === undefined) throw new Error(`no ${file} in deploy/`);
  return c;
}

/** The chain of `file` whose steps have these names. */
function chainNamed(file: string, names: string[]): Chain {
  const c = chains(file).find((ch) => ch.steps.map((s) => s.name).join(',') === names.join(','));
  if (c === undefined)
    throw new Error(
      `${file}: no chain ${names.join(' → ')} (has ${chains(file)
        .map((ch) => ch.label)
        .join(', ')})`,
    );
  return c;
}

/** The GPUs a step asks for (a split step's: its two groups' total). */
function gpusOf(chain: Chain, step: Step | undefined): number {
  const train = chain.config.train;
  if (step === undefined || train === undefined) return 0;
  return stepGpuNeed(step, train).gpus;
}

/**
 * The argv the train worker runs for step `index` of a chain, in attempt folder `attemptDir`: on
 * GPUs 0…N-1, or for a split step on the groups given (by default the target group first).
 */
function stepArgv(
  chain: Chain,
  index: number,
  attemptDir: string,
  groups?: { target: number[]; drafter: number[] },
): string[] {
  const step = chain.steps[index];
  const train = chain.config.train;
  if (step === undefined || train === undefined) throw new Error(`${chain.label}: no step ${index}`);
  const need = stepGpuNeed(step, train);
  const split =
    need.groups === null
      ? null
      : (groups ?? {
          target: Array.from({ length: need.groups.target.gpus }, (_, i) => i),
          drafter: Array.from({ length: need.groups.drafter.gpus }, (_, i) => need.groups!.target.gpus + i),
        });
  const payload = {
    steps: chain.steps.map((s) => ({ name: s.name, command: s.command })),
    stepIndex: index,
  } as unknown as TrainPayload;
  const argv = buildArgv(step.command, [], {
    dataset: chain.config.postprocess.target,
    output: path.join(attemptDir, step.name, 'output'),
    checkpoint: null,
    gpus: split === null ? Array.from({ length: need.gpus }, (_, i) => i) : [...split.target, ...split.drafter],
    groups: split,
  });
  return withStepOutputs(argv, payload, attemptDir);
}

function stepOutput(attemptDir: string, step: string): string {
  return path.join(attemptDir, step, 'output');
}

/** The value after `flag` in argv. */
function flag(argv: readonly string[], name: string): string {
  const i = argv.indexOf(name);
  const v = i === -1 ? undefined : argv[i + 1];
  if (v === undefined) throw new Error(`no ${name} in ${argv.join(' ')}`);
  return v;
}

/** `section.field=value` overrides of a `specforge train` argv, as a map. */
function overridesOf(argv: readonly string[]): Map<string, string> {
  return new Map(
    argv.filter((a) => /^[a-z_][\w.]*=/.test(a)).map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]),
  );
}

// ---------------------------------------------------------------------------------------------
// tokenmill's CLI, parsed by commander without running the command
// ---------------------------------------------------------------------------------------------

/** Parses `args` (after the entrypoint) with tokenmill's program; resolves to the verb and its options. */
async function parseTokenmill(args: readonly string[]): Promise<{ verb: string; opts: Record<string, unknown> }> {
  const program = buildProgram();
  const silent = { writeErr: (): void => undefined, writeOut: (): void => undefined };
  program.configureOutput(silent);
  let seen: { verb: string; opts: Record<string, unknown> } | undefined;
  for (const cmd of program.commands) {
    cmd.exitOverride().configureOutput(silent);
    cmd.action((...a: unknown[]) => {
      const c = a.at(-1) as Command;
      seen = { verb: c.name(), opts: c.opts() };
    });
  }
  await program.parseAsync(['node', 'tokenmill', ...args]);
  if (seen === undefined) throw new Error(`tokenmill ${args.join(' ')}: no command ran`);
  return seen;
}

/** The CLI's path in the image: the Dockerfile's ENTRYPOINT after `node`. */
function imageCli(): string {
  const text = readFileSync(path.join(repoRoot, 'Dockerfile'), 'utf8');
  const entrypoint = JSON.parse(/^ENTRYPOINT\s+(\[.*\])\s*$/m.exec(text)?.[1] ?? '[]') as string[];
  expect(entrypoint[0]).toBe('node');
  return entrypoint[1] ?? '';
}

// ---------------------------------------------------------------------------------------------
// Container paths → this machine
// ---------------------------------------------------------------------------------------------

/** The train worker's short-syntax mounts in a compose file: container path → host path (variables at their defaults). */
function trainWorkerMounts(file: string): Map<string, string> {
  const compose = parse(readFileSync(file, 'utf8'), { merge: true }) as {
    services: Record<string, { volumes?: string[] }>;
  };
  const volumes = compose.services['train-worker']?.volumes ?? [];
  return new Map(
    volumes.map((v) => {
      const [source = '', target = ''] = v.replace(/\$\{[A-Z_]+:-([^}]*)\}/g, '$1').split(':');
      return [target, source];
    }),
  );
}

interface Machine {
  root: string;
  /** A container path (or an argument holding one) as a path of this machine. */
  local(arg: string): string;
}

const QWEN3_8B = {
  architectures: ['Qwen3ForCausalLM'],
  model_type: 'qwen3',
  hidden_size: 4096,
  intermediate_size: 12288,
  num_hidden_layers: 36,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 128,
  vocab_size: 151936,
  max_position_embeddings: 40960,
  rope_theta: 1000000,
  rms_norm_eps: 1e-6,
  hidden_act: 'silu',
  attention_bias: false,
  tie_word_embeddings: false,
  torch_dtype: 'bfloat16',
  bos_token_id: 151643,
  eos_token_id: 151645,
};

/**
 * A temp folder standing for the train worker's container: /models/Qwen3-8B (its config.json),
 * /opt/SpecForge/configs/qwen3-8b-eagle3.json (an EAGLE-3 draft config of the target's shape,
 * 32000 draft tokens), /data/out, and /config/trainers (the recipes, their container paths
 * mapped the same way).
 */
function machine(root: string): Machine {
  const prefixes: [string, string][] = [
    ['/models/', path.join(root, 'models') + '/'],
    ['/opt/SpecForge/', path.join(root, 'SpecForge') + '/'],
    ['/data/out/', path.join(root, 'data-out') + '/'],
    ['/config/trainers/', path.join(root, 'recipes') + '/'],
  ];
  const local = (arg: string): string => prefixes.reduce((a, [from, to]) => a.split(from).join(to), arg);
  mkdirSync(path.join(root, 'models', 'Qwen3-8B'), { recursive: true });
  writeFileSync(path.join(root, 'models', 'Qwen3-8B', 'config.json'), JSON.stringify(QWEN3_8B));
  mkdirSync(path.join(root, 'SpecForge', 'configs'), { recursive: true });
  writeFileSync(
    path.join(root, 'SpecForge', 'configs', 'qwen3-8b-eagle3.json'),
    JSON.stringify({
      ...QWEN3_8B,
      architectures: ['LlamaForCausalLMEagle3'],
      model_type: 'llama',
      num_hidden_layers: 1,
      draft_vocab_size: 32000,
    }),
  );
  mkdirSync(path.join(root, 'recipes'), { recursive: true });
  for (const f of readdirSync(RECIPES)) {
    const from = path.join(RECIPES, f);
    if (/\.ya?ml$/.test(f)) writeFileSync(path.join(root, 'recipes', f), local(readFileSync(from, 'utf8')));
    else copyFileSync(from, path.join(root, 'recipes', f));
  }
  return { root, local };
}

// ---------------------------------------------------------------------------------------------
// The trainers' own code
// ---------------------------------------------------------------------------------------------

interface PyOk {
  ok: true;
}
interface PyFail {
  ok: false;
  error: string;
}
interface SpecForgeConfig extends PyOk {
  mode: string;
  algorithm: string;
  strategy: string;
  target_model_path: string;
  draft_model_config: string | null;
  vocab_mapping_path: string;
  prompts_path: string;
  train_data_path: string;
  hidden_states_path: string;
  max_length: number;
  num_anchors: number;
  draft_block_size: number | null;
  draft_num_hidden_layers: number | null;
  mask_token_id: number | null;
  chat_template: string;
  chat_template_registered: boolean;
  cache_dir: string;
  output_dir: string;
  deployment_mode: string;
  nproc_per_node: number;
  control_dir: string | null;
  backend: string | null;
  managed_local: { trainer_devices: string[]; capture_devices: string[][] } | null;
}
interface SpecForgePlan extends PyOk {
  kind: string;
  role: string;
  managed_root: string | null;
  commands: { label: string; argv: string[]; cuda: string | null }[];
  services: { label: string; cuda: string | null; context_length: number | null; model_path: string | null }[];
}
interface SpecForgePrompts extends PyOk {
  min_loss_tokens: number;
  prompts: { input_ids: number[]; loss_mask: number[] }[];
}
interface VocabMapping extends PyOk {
  keys: string[];
  d2t_shape: number[];
  t2d_shape: number[];
  t2d_dtype: string;
  kept: number[];
  t2d_true: number[];
}
interface SpeculatorsTrain extends PyOk {
  module_runnable: boolean;
  values: Record<string, string | number | null>;
  provenance: Record<string, string>;
  warnings: string[];
}
interface SpeculatorsCli extends PyOk {
  commands: string[];
  params: Record<string, unknown>;
}

/** Runs ops of test/python/trainer_recipes.py in one process; each result must be ok. */
async function trainers<T extends unknown[]>(ops: Record<string, unknown>[]): Promise<T> {
  const out = await runPythonJson<{ versions: Record<string, string>; results: (PyOk | PyFail)[] }>(
    'trainer_recipes.py',
    [],
    { ops },
    { env: 'trainers', timeoutMs: PY_TIMEOUT_MS },
  );
  expect(out.versions).toMatchObject({ specforge: '0.2.0', speculators: '0.9.0' });
  out.results.forEach((r, i) => {
    expect(r.ok, `${String(ops[i]?.['op'])}: ${r.ok ? '' : r.error}`).toBe(true);
  });
  return out.results as T;
}

// ---------------------------------------------------------------------------------------------
// The configs
// ---------------------------------------------------------------------------------------------

describe('tokenmill configs of deploy/ with trainer chains', () => {
  it('load with the config loader (the commented chain too), and each step reads only earlier steps', () => {
    expect([...chainsByFile.keys()]).toEqual(expect.arrayContaining(['tokenmill.yaml', ...CHAIN_FILES]));
    for (const file of CHAIN_FILES) {
      const cs = chains(file);
      expect(
        cs.map((c) => c.label),
        file,
      ).toEqual([`${file} (active)`, `${file} (commented)`]);
      for (const chain of cs) {
        expect(chain.steps[0]?.name, chain.label).toBe('export');
        expect(chain.steps[0]?.gpus, `${chain.label}: the export needs no GPU`).toBe(0);
        expect(chain.steps.at(-1)?.name, chain.label).toBe('train');
        chain.steps.forEach((step, i) => {
          const earlier = new Set(chain.steps.slice(0, i).map((s) => s.name));
          for (const arg of step.command) {
            for (const [, name = ''] of arg.matchAll(PLACEHOLDER)) {
              const where = `${chain.label} step ${step.name}: {${name}} in "${arg}"`;
              if (name.startsWith('output:')) expect(earlier.has(name.slice(7)), where).toBe(true);
              // A chain step gets no checkpoint: it reruns whole.
              else expect(['output', 'gpus', 'dataset', 'target_gpus', 'drafter_gpus'], where).toContain(name);
            }
          }
        });
      }
    }
  });

  it('run tokenmill in their export steps as the image has it, on the config as every container mounts it, with a verb and options the CLI has', async () => {
    const cli = imageCli();
    const mounts = trainWorkerMounts(path.join(repoRoot, 'docker-compose.yml'));
    expect(mounts.get(CONFIG_IN_CONTAINER)).toBe('./deploy/tokenmill.yaml');
    let seen = 0;
    for (const file of CHAIN_FILES) {
      for (const chain of chains(file)) {
        for (const [i, step] of chain.steps.entries()) {
          if (step.command[0] !== 'node') continue;
          seen += 1;
          const argv = stepArgv(chain, i, '/data/out/compose/train/a');
          expect(argv[1], `${chain.label} ${step.name}`).toBe(cli);
          const { verb, opts } = await parseTokenmill(argv.slice(2));
          expect(verb).toBe('export');
          expect(opts['config']).toBe(CONFIG_IN_CONTAINER);
          expect(EXPORT_FORMATS as readonly string[]).toContain(opts['format']);
          expect(String(opts['out']).startsWith(stepOutput('/data/out/compose/train/a', step.name))).toBe(true);
        }
      }
    }
    expect(seen).toBe(8);
    // The check can fail: an option the CLI lacks is refused.
    await expect(
      parseTokenmill(['export', '-c', CONFIG_IN_CONTAINER, '--format', 'jsonl', '--output', '/x']),
    ).rejects.toThrow(/unknown option/);
  });

  it('mount the recipes through the compose override where the steps read them', () => {
    const mounts = trainWorkerMounts(OVERRIDE);
    expect(mounts.get('/config/trainers')).toBe('./deploy/trainers');
    expect(mounts.get('/opt/SpecForge')).toBe('./SpecForge');
    for (const file of CHAIN_FILES) {
      for (const chain of chains(file)) {
        for (const step of chain.steps) {
          for (const arg of step.command) {
            for (const [p = ''] of arg.matchAll(/\/config\/trainers\/[\w.-]+/g)) {
              expect(existsSync(path.join(repoRoot, 'deploy/trainers', path.basename(p))), `${chain.label}: ${p}`).toBe(
                true,
              );
            }
            // Under /opt: the SpecForge tree the override mounts, or the image's venv.
            if (arg.startsWith('/opt/')) expect(/^\/opt\/(SpecForge|venv)\//.test(arg), arg).toBe(true);
          }
        }
      }
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The recipes, with the trainers' own code
// ---------------------------------------------------------------------------------------------

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-recipes-', cli: true });

describe('SpecForge 0.2 recipes', () => {
  let m: Machine;
  beforeAll(() => {
    m = machine(path.join(tmp.dir, 'sf'));
  });

  it(
    'offline chain: export → capture → train validates with SpecForge and plans one rank per GPU',
    async () => {
      const chain = chainNamed('tokenmill.specforge.yaml', ['export', 'capture', 'train']);
      const attempt = m.local('/data/out/compose/train/attempt-1');
      const [exp, capture, train] = [0, 1, 2].map((i) => stepArgv(chain, i, attempt).map(m.local)) as [
        string[],
        string[],
        string[],
      ];
      expect(flag(exp, '--format')).toBe('specforge');
      expect(capture.slice(0, 4)).toEqual(['torchrun', '--standalone', '--nproc_per_node', '8']);
      expect(capture[4]).toBe(m.local('/opt/SpecForge/scripts/prepare_hidden_states.py'));
      expect(flag(capture, '--data-path')).toBe(flag(exp, '--out'));
      expect(chain.steps[1]?.minFreeDiskGiB, 'the capture step waits for disk space').toBeGreaterThan(0);
      expect(chain.steps[1]?.hiddenStates?.model, 'the capture step is sized before it starts').toBe(
        '/models/Qwen3-8B',
      );
      // The export's sidecar settings: the text the target saw, SpecForge's Qwen3 template that adds
      // no system prompt to preformatted text and supervises no empty think block.
      expect(capture).toContain('--is-preformatted');
      expect(flag(capture, '--chat-template')).toBe('qwen3-instruct');
      expect(train.slice(0, 3)).toEqual(['specforge', 'train', '-c']);

      const overrides = [...overridesOf(train)].map(([k, v]) => `${k}=${v}`);
      const [cfg, plan] = await trainers<[SpecForgeConfig, SpecForgePlan]>([
        { op: 'specforge-config', config: train[3], overrides },
        { op: 'specforge-plan', argv: train.slice(1), cwd: m.root },
      ]);
      expect(cfg).toMatchObject({
        mode: 'offline',
        algorithm: 'eagle3',
        deployment_mode: 'local_colocated',
        hidden_states_path: flag(capture, '--output-path'),
        vocab_mapping_path: path.join(flag(capture, '--output-path'), 'vocab_mapping', 'vocab_mapping.pt'),
        output_dir: stepOutput(attempt, 'train'),
        target_model_path: flag(capture, '--target-model-path'),
        draft_model_config: flag(capture, '--draft-model-config'),
        max_length: Number(flag(capture, '--max-length')),
        chat_template: flag(capture, '--chat-template'),
        chat_template_registered: true,
        nproc_per_node: chain.steps[2]?.gpus,
      });
      expect(cfg.cache_dir.startsWith(stepOutput(attempt, 'train'))).toBe(true);
      expect(plan.kind).toBe('command');
      const torchrun = plan.commands[0]?.argv ?? [];
      expect(torchrun[torchrun.indexOf('--nproc_per_node') + 1]).toBe(String(chain.steps[2]?.gpus));
      expect(torchrun).toEqual(expect.arrayContaining(overrides));
    },
    PYTHON_TEST_MS,
  );

  it(
    "online chain: export → vocab-mapping → train validates with SpecForge and plans its own capture stack on the step's GPUs",
    async () => {
      const chain = chainNamed('tokenmill.specforge.yaml', ['export', 'vocab-mapping', 'train']);
      const attempt = m.local('/data/out/compose/train/attempt-2');
      const [exp, vocab, train] = [0, 1, 2].map((i) => stepArgv(chain, i, attempt).map(m.local)) as [
        string[],
        string[],
        string[],
      ];
      expect(flag(exp, '--format')).toBe('jsonl');
      expect(flag(vocab, '--rows')).toBe(flag(exp, '--out'));
      const overrides = [...overridesOf(train)].map(([k, v]) => `${k}=${v}`);
      const [cfg, plan] = await trainers<[SpecForgeConfig, SpecForgePlan]>([
        { op: 'specforge-config', config: train[3], overrides },
        { op: 'specforge-plan', argv: train.slice(1), cwd: m.root },
      ]);
      expect(cfg).toMatchObject({
        mode: 'online',
        algorithm: 'eagle3',
        deployment_mode: 'disaggregated',
        backend: 'mooncake',
        prompts_path: flag(exp, '--out'),
        vocab_mapping_path: flag(vocab, '--out'),
        output_dir: stepOutput(attempt, 'train'),
        target_model_path: flag(vocab, '--target-model-path'),
        draft_model_config: flag(vocab, '--draft-model-config'),
        max_length: Number(flag(vocab, '--max-length')),
        chat_template_registered: true,
      });
      expect(cfg.control_dir?.startsWith(stepOutput(attempt, 'train'))).toBe(true);
      expect(cfg.cache_dir.startsWith(stepOutput(attempt, 'train'))).toBe(true);
      // The capture servers and trainer ranks share out exactly the step's GPUs.
      const managed = cfg.managed_local;
      expect(managed).not.toBeNull();
      const used = [...(managed?.trainer_devices ?? []), ...(managed?.capture_devices.flat() ?? [])].map(Number);
      expect(used.sort((a, b) => a - b)).toEqual(Array.from({ length: gpusOf(chain, chain.steps[2]) }, (_, i) => i));
      expect(cfg.nproc_per_node).toBe(managed?.trainer_devices.length);

      expect(plan.kind).toBe('managed_supervisor');
      expect(plan.managed_root).toBe(cfg.control_dir);
      const consumer = plan.commands.find((c) => c.label === 'consumer');
      expect(consumer?.cuda).toBe(managed?.trainer_devices.join(','));
      expect(consumer?.argv).toEqual(expect.arrayContaining(overrides));
      const servers = plan.services.filter((s) => s.label.startsWith('capture-server'));
      expect(servers.map((s) => s.cuda)).toEqual(managed?.capture_devices.map((d) => d.join(',')));
      for (const s of servers) {
        // SpecForge's own headroom: a prompt of max_length tokens fits the capture server.
        expect(s.context_length).toBe(cfg.max_length + 7);
        expect(s.model_path).toBe(cfg.target_model_path);
      }
    },
    PYTHON_TEST_MS,
  );
});

describe('speculators 0.9 recipes', () => {
  let m: Machine;
  beforeAll(() => {
    m = machine(path.join(tmp.dir, 'spec'));
  });

  it(
    "offline and online chains parse with speculators' own CLI and train config resolution",
    async () => {
      const offline = chainNamed('tokenmill.speculators.yaml', ['export', 'capture', 'train']);
      const online = chainNamed('tokenmill.speculators.yaml', ['export', 'train']);
      const a1 = m.local('/data/out/compose/train/attempt-1');
      const a2 = m.local('/data/out/compose/train/attempt-2');
      const [exp1, capture, train1] = [0, 1, 2].map((i) => stepArgv(offline, i, a1).map(m.local)) as [
        string[],
        string[],
        string[],
      ];
      const [exp2, train2] = [0, 1].map((i) => stepArgv(online, i, a2).map(m.local)) as [string[], string[]];
      for (const [exp, train, steps] of [
        [exp1, train1, offline.steps],
        [exp2, train2, online.steps],
      ] as const) {
        expect(flag(exp, '--format')).toBe('speculators');
        expect(train.slice(0, 6)).toEqual([
          'torchrun',
          '--standalone',
          '--nproc_per_node',
          String(steps.at(-1)?.gpus),
          '-m',
          'speculators.train',
        ]);
      }
      expect(capture.slice(0, 2)).toEqual(['speculators', 'generate-offline-data']);
      expect(offline.steps[1]?.gpus, 'generate-offline-data asks a vLLM server: no local GPU').toBe(0);
      expect(offline.steps[1]?.minFreeDiskGiB, 'the capture step waits for disk space').toBeGreaterThan(0);
      expect(offline.steps[1]?.hiddenStates?.model, 'the capture step is sized before it starts').toBe(
        '/models/Qwen3-8B',
      );

      const [cli, off, on] = await trainers<[SpeculatorsCli, SpeculatorsTrain, SpeculatorsTrain]>([
        { op: 'speculators-cli', argv: capture.slice(1) },
        { op: 'speculators-train', argv: train1.slice(6) },
        { op: 'speculators-train', argv: train2.slice(6) },
      ]);
      expect(cli.commands).toEqual(expect.arrayContaining(['generate-offline-data', 'train']));
      expect(cli.params).toMatchObject({
        preprocessed_data: flag(exp1, '--out'),
        output: path.join(stepOutput(a1, 'capture'), 'hidden_states'),
        fail_on_error: true,
        validate_outputs: true,
      });
      for (const [r, exp, attempt] of [
        [off, exp1, a1],
        [on, exp2, a2],
      ] as const) {
        expect(r.module_runnable).toBe(true);
        expect(r.warnings, 'no unknown keys, no ignored settings').toEqual([]);
        expect(r.values).toMatchObject({
          speculator_type: 'eagle3',
          verifier_name_or_path: m.local('/models/Qwen3-8B'),
          data_path: flag(exp, '--out'),
          draft_vocab_size: 32000,
          total_seq_len: 8192,
          hidden_states_backend: 'file',
        });
        expect(r.provenance['data_path']).toBe('flag');
        expect(String(r.values['save_path']).startsWith(stepOutput(attempt, 'train'))).toBe(true);
        expect(String(r.values['log_dir']).startsWith(stepOutput(attempt, 'train'))).toBe(true);
      }
      expect(off.values).toMatchObject({ on_missing: 'raise', hidden_states_path: cli.params['output'] });
      expect(on.values).toMatchObject({ on_missing: 'generate', vllm_endpoint: cli.params['endpoint'] });
    },
    PYTHON_TEST_MS,
  );
});

describe('DFlash recipes', () => {
  let m: Machine;
  beforeAll(() => {
    m = machine(path.join(tmp.dir, 'dflash'));
  });

  it(
    "SpecForge online chain: the GPU split's groups become the capture servers and trainer ranks, the run config validates as DFlash",
    async () => {
      const chain = chainNamed('tokenmill.specforge-dflash.yaml', ['export', 'train']);
      const step = chain.steps[1];
      expect(step?.gpus, "the seeds' topology: 5 target GPUs + 3 drafter GPUs").toEqual({ target: 5, drafter: 3 });
      expect(typeof step?.minFreeGpuMemMiB).toBe('object');
      const attempt = m.local('/data/out/compose/train/attempt-1');
      // Groups scattered by free memory: the config's own layout (0-4, 5-7) must not survive.
      const groups = { target: [0, 2, 3, 5, 6], drafter: [1, 4, 7] };
      const exp = stepArgv(chain, 0, attempt).map(m.local);
      const train = stepArgv(chain, 1, attempt, groups).map(m.local);
      expect(flag(exp, '--format')).toBe('jsonl');
      expect(train[0]).toBe('/opt/venv/bin/python');
      expect(flag(train, '--target-gpus')).toBe('0,2,3,5,6');
      expect(flag(train, '--drafter-gpus')).toBe('1,4,7');
      mkdirSync(stepOutput(attempt, 'train'), { recursive: true });
      const written = flag(train, '--write');
      const overrides = [...overridesOf(train)].map(([k, v]) => `${k}=${v}`);
      const [plan] = await trainers<[SpecForgePlan]>([
        { op: 'specforge-plan', script: train[1], argv: train.slice(2), cwd: m.root },
      ]);
      const [cfg] = await trainers<[SpecForgeConfig]>([{ op: 'specforge-config', config: written, overrides }]);
      expect(cfg).toMatchObject({
        mode: 'online',
        algorithm: 'dflash',
        strategy: 'dflash',
        num_anchors: 1024,
        draft_block_size: 32,
        draft_num_hidden_layers: 5,
        mask_token_id: DFLASH_MASK_TOKEN,
        deployment_mode: 'disaggregated',
        backend: 'mooncake',
        prompts_path: flag(exp, '--out'),
        vocab_mapping_path: '',
        output_dir: stepOutput(attempt, 'train'),
        target_model_path: m.local('/models/Qwen3-8B'),
        nproc_per_node: 3,
        managed_local: { trainer_devices: ['1', '4', '7'], capture_devices: [['0'], ['2'], ['3'], ['5'], ['6']] },
      });
      expect(cfg.control_dir?.startsWith(stepOutput(attempt, 'train'))).toBe(true);
      expect(plan.kind).toBe('managed_supervisor');
      const consumer = plan.commands.find((c) => c.label === 'consumer');
      expect(consumer?.cuda).toBe('1,4,7');
      expect(consumer?.argv).toEqual(expect.arrayContaining(overrides));
      const servers = plan.services.filter((s) => s.label.startsWith('capture-server'));
      expect(servers.map((s) => s.cuda)).toEqual(['0', '2', '3', '5', '6']);
      for (const s of servers) {
        expect(s.context_length).toBe(cfg.max_length + 7);
        expect(s.model_path).toBe(cfg.target_model_path);
      }
      // The mask token is no token the target's tokenizer makes, and neither pad nor eos.
      const tok = await loadTokenizer(bundledTokenizerPath());
      expect(DFLASH_MASK_TOKEN).toBe(tok.vocabSize);
      expect(tok.tokenToId('<|endoftext|>')).not.toBe(DFLASH_MASK_TOKEN);
    },
    PYTHON_TEST_MS,
  );

  it(
    'SpecForge offline chain: export → capture → train validates as DFlash on the captured features',
    async () => {
      const chain = chainNamed('tokenmill.specforge-dflash.yaml', ['export', 'capture', 'train']);
      const attempt = m.local('/data/out/compose/train/attempt-2');
      const [exp, capture, train] = [0, 1, 2].map((i) => stepArgv(chain, i, attempt).map(m.local)) as [
        string[],
        string[],
        string[],
      ];
      expect(flag(exp, '--format')).toBe('specforge');
      expect(flag(capture, '--data-path')).toBe(flag(exp, '--out'));
      expect(chain.steps[1]?.hiddenStates).toMatchObject({ model: '/models/Qwen3-8B', layers: 5 });
      const overrides = [...overridesOf(train)].map(([k, v]) => `${k}=${v}`);
      const [cfg] = await trainers<[SpecForgeConfig]>([{ op: 'specforge-config', config: train[3], overrides }]);
      expect(cfg).toMatchObject({
        mode: 'offline',
        algorithm: 'dflash',
        num_anchors: 1024,
        draft_block_size: 32,
        mask_token_id: DFLASH_MASK_TOKEN,
        deployment_mode: 'local_colocated',
        hidden_states_path: flag(capture, '--output-path'),
        target_model_path: flag(capture, '--target-model-path'),
        draft_model_config: flag(capture, '--draft-model-config'),
        max_length: Number(flag(capture, '--max-length')),
        chat_template: flag(capture, '--chat-template'),
        nproc_per_node: gpusOf(chain, chain.steps[2]),
      });
    },
    PYTHON_TEST_MS,
  );

  it(
    "speculators online and offline chains parse with speculators' own CLI as DFlash",
    async () => {
      const online = chainNamed('tokenmill.speculators-dflash.yaml', ['export', 'train']);
      const offline = chainNamed('tokenmill.speculators-dflash.yaml', ['export', 'capture', 'train']);
      const a1 = m.local('/data/out/compose/train/attempt-3');
      const a2 = m.local('/data/out/compose/train/attempt-4');
      const [exp1, train1] = [0, 1].map((i) => stepArgv(online, i, a1).map(m.local)) as [string[], string[]];
      const [exp2, capture, train2] = [0, 1, 2].map((i) => stepArgv(offline, i, a2).map(m.local)) as [
        string[],
        string[],
        string[],
      ];
      for (const train of [train1, train2]) expect(train.slice(4, 6)).toEqual(['-m', 'speculators.train']);
      const [cli, on, off] = await trainers<[SpeculatorsCli, SpeculatorsTrain, SpeculatorsTrain]>([
        { op: 'speculators-cli', argv: capture.slice(1) },
        { op: 'speculators-train', argv: train1.slice(6) },
        { op: 'speculators-train', argv: train2.slice(6) },
      ]);
      for (const [r, exp, attempt] of [
        [on, exp1, a1],
        [off, exp2, a2],
      ] as const) {
        expect(r.module_runnable).toBe(true);
        expect(r.warnings, 'no unknown keys, no ignored settings').toEqual([]);
        expect(r.values).toMatchObject({
          speculator_type: 'dflash',
          block_size: 32,
          max_anchors: 1024,
          mask_token_id: DFLASH_MASK_TOKEN,
          num_layers: 5,
          verifier_name_or_path: m.local('/models/Qwen3-8B'),
          data_path: flag(exp, '--out'),
        });
        expect(String(r.values['save_path']).startsWith(stepOutput(attempt, 'train'))).toBe(true);
      }
      expect(on.values).toMatchObject({ on_missing: 'generate', vllm_endpoint: 'http://vllm:8000/v1' });
      expect(off.values).toMatchObject({ on_missing: 'raise', hidden_states_path: cli.params['output'] });
      expect(off.provenance['on_missing']).toBe('flag');
    },
    PYTHON_TEST_MS,
  );
});

// ---------------------------------------------------------------------------------------------
// The data side of SpecForge's online chain, on CPU
// ---------------------------------------------------------------------------------------------

const DATASET = 'B1';
const LONG_ANSWER = 'long-answer';
const LONG_PROMPT = 'long-prompt';

interface Row {
  id: string;
  input_ids: number[];
  loss_mask: number[];
}

describe('SpecForge online chain on a small run', () => {
  it(
    "export step's rows → vocab-mapping step → SpecForge's prompt preparation with the recipe's data settings",
    async () => {
      const m = machine(path.join(tmp.dir, 'smoke'));
      const run = 'recipes';
      // Generation records as the results sink writes them: ten short answers, one answer longer
      // than data.max_length (SpecForge cuts it) and one prompt longer than it (nothing supervised
      // is left: SpecForge leaves it out).
      const tok = await loadTokenizer(bundledTokenizerPath());
      const imEnd = tok.tokenToId('<|im_end|>');
      if (imEnd === undefined) throw new Error('not the Qwen3 tokenizer');
      const words = (n: number, seed: number): string =>
        Array.from({ length: n }, (_, i) => ['alpha', 'beta', 'gamma', 'delta', 'omega'][(i * seed) % 5]).join(' ');
      const prompts: string[] = [];
      const records: string[] = [];
      const add = (id: string, user: string, answer: string): void => {
        const messages: ChatMessage[] = [{ role: 'user', content: user }];
        prompts.push(JSON.stringify({ id, messages }));
        const promptIds = tok.encodePrompt(messages);
        const outputIds = [...tok.encode(`<think>\nThinking about ${id}.\n</think>\n\n${answer}`), imEnd];
        records.push(
          JSON.stringify({
            id,
            dataset: DATASET,
            prompt_ids: promptIds,
            output_ids: outputIds,
            prompt_tokens: promptIds.length,
            completion_tokens: outputIds.length,
            finish_reason: { type: 'stop', matched: imEnd },
            endpoint: 'http://gpu-node:30000',
            worker: 'w1',
            attempt: 1,
            ts: '2026-01-01T00:00:00.000Z',
          }),
        );
      };
      for (let i = 0; i < 10; i++)
        add(`s-${i}`, `Question ${i}: ${words(20 + i, i + 1)}?`, `Answer ${i}: ${words(40 + 7 * i, i + 2)}.`);
      add(LONG_ANSWER, 'Write at length.', words(6000, 3));
      add(LONG_PROMPT, `Summarize: ${words(6000, 2)}`, 'A short summary.');
      writeFileSync(path.join(tmp.dir, 'prompts.jsonl'), `${prompts.join('\n')}\n`);
      const generations = path.join(tmp.dir, 'out', run, DATASET, 'generations');
      mkdirSync(generations, { recursive: true });
      writeFileSync(path.join(generations, 'imported-00000.jsonl'), `${records.join('\n')}\n`);
      const configPath = writeConfig(tmp.dir, {
        run,
        redis: { url: redis.url, prefix: redis.prefix },
        sglang: { endpoints: ['http://127.0.0.1:9'] },
        datasets: [{ name: DATASET, prompts: 'prompts.jsonl', tokenBudget: 1_000_000 }],
        output: { dir: 'out' },
      });
      const pp = spawnCli(['postprocess', '-c', configPath]);
      expect(await pp.exited, pp.output()).toBe(0);

      // The chain's steps as the worker runs them, /config/tokenmill.yaml being this run's config.
      const chain = chainNamed('tokenmill.specforge.yaml', ['export', 'vocab-mapping', 'train']);
      const attempt = m.local('/data/out/compose/train/attempt-1');
      const onThisMachine = (argv: string[]): string[] =>
        argv.map((a) => (a === CONFIG_IN_CONTAINER ? configPath : m.local(a)));
      const [exp, vocab, train] = [0, 1, 2].map((i) => onThisMachine(stepArgv(chain, i, attempt))) as [
        string[],
        string[],
        string[],
      ];
      for (const step of chain.steps) mkdirSync(stepOutput(attempt, step.name), { recursive: true });
      const ex = spawnCli(exp.slice(2));
      expect(await ex.exited, ex.output()).toBe(0);
      const rowsFile = flag(exp, '--out');
      const rows = readFileSync(rowsFile, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Row);
      expect(rows).toHaveLength(12);

      const python = await ensurePythonEnv('trainers');
      expect(vocab[0]).toBe('/opt/venv/bin/python');
      const vm = await runProcess(python, vocab.slice(1), { timeoutMs: PY_TIMEOUT_MS });
      expect(vm.code, vm.stderr).toBe(0);
      const vmResult = JSON.parse(vm.stdout.trim().split('\n').at(-1) ?? '{}') as {
        rows: number;
        rowsCounted: number;
        distinctTokens: number;
      };
      expect(vmResult).toMatchObject({ rows: 12, rowsCounted: 11 });

      const overrides = [...overridesOf(train)].map(([k, v]) => `${k}=${v}`);
      const [cfg, prepared, mapping] = await trainers<[SpecForgeConfig, SpecForgePrompts, VocabMapping]>([
        { op: 'specforge-config', config: train[3], overrides },
        { op: 'specforge-prompts', config: train[3], overrides },
        { op: 'vocab-mapping', file: flag(vocab, '--out') },
      ]);
      expect(cfg.prompts_path).toBe(rowsFile);
      expect(cfg.vocab_mapping_path).toBe(flag(vocab, '--out'));
      const maxLength = cfg.max_length;

      // What SpecForge streams: every row, cut at max_length, less the one with nothing supervised there.
      const expected = rows
        .map((r) => ({
          id: r.id,
          input_ids: r.input_ids.slice(0, maxLength),
          loss_mask: r.loss_mask.slice(0, maxLength),
        }))
        .filter((r) => r.loss_mask.reduce((a, b) => a + b, 0) >= prepared.min_loss_tokens);
      expect(expected.map((r) => r.id)).not.toContain(LONG_PROMPT);
      expect(rows.find((r) => r.id === LONG_ANSWER)?.input_ids.length).toBeGreaterThan(maxLength);
      expect(prepared.prompts).toEqual(expected.map(({ input_ids, loss_mask }) => ({ input_ids, loss_mask })));

      // The draft vocabulary: SpecForge's shapes, and every token SpecForge supervises in it.
      expect(mapping).toMatchObject({
        keys: ['d2t', 't2d'],
        d2t_shape: [32000],
        t2d_shape: [151936],
        t2d_dtype: 'torch.bool',
      });
      expect(mapping.t2d_true).toEqual(mapping.kept);
      const supervised = new Set(expected.flatMap((r) => r.input_ids.filter((_, i) => r.loss_mask[i] === 1)));
      expect(supervised.size).toBe(vmResult.distinctTokens);
      const kept = new Set(mapping.kept);
      for (const t of supervised) expect(kept.has(t), `token ${t}`).toBe(true);
    },
    SMOKE_TEST_MS,
  );
});
