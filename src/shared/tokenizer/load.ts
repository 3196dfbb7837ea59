/**
 * Loading a {@link ChatTokenizer} from a tokenizer folder, with the encoder `tokenizer.kind`
 * names or the folder implies:
 *
 * - `huggingface`: `tokenizer.json` (+ `tokenizer_config.json`);
 * - `tiktoken`: a rank file (`tiktoken.model`, else the one `*.tiktoken`), the special tokens
 *   of `tokenizer_config.json`'s `added_tokens_decoder`, and a split pattern: `tokenizer.pattern`,
 *   else the preset's, else the config's `pat_str`. The `kimi-k2` preset (named, or detected from
 *   `tokenization_kimi.py` / the config's `auto_map`) brings Kimi's pattern, its special-token
 *   layout (ids from the rank count up, `<|reserved_token_N|>` where the config names none), its
 *   long-text cutting and its sorting of tool schemas;
 * - `server`: the ids come from SGLang's `/tokenize` (server.ts);
 * - `auto`: `huggingface` when the folder has `tokenizer.json`, else `tiktoken` when it has a
 *   rank file.
 */
import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';

import { AppError, ConfigError, EnvironmentError, errorMessage } from '../errors.js';
import { isRecord } from '../util/index.js';
import { ChatTokenizer } from './chat.js';
import { readRankFile } from './bpe.js';
import {
  collectAddedTokens,
  templatesFromConfig,
  tokenContent,
  type AddedTokenEntry,
  type TokenizerConfigJson,
} from './config-json.js';
import type { TokenEncoder } from './encoder.js';
import { readJsonFile, readOptionalJsonFile, readTemplateFiles } from './files.js';
import { HfEncoder } from './hf.js';
import { KIMI_K2_PATTERN } from './pattern.js';
import { ServerEncoder } from './server.js';
import { ServerTokenizeClient, type ServerTokenizeOptions } from './server-client.js';
import { KIMI_CHUNK_LIMITS, TiktokenEncoder, type TokenizerPreset } from './tiktoken.js';

/** `tokenizer.kind`. */
export type TokenizerKind = 'auto' | 'huggingface' | 'tiktoken' | 'server';
/** How to load a tokenizer folder. */
export interface TokenizerLoadOptions {
  /** Default `auto`. */
  kind?: TokenizerKind;
  /** tiktoken: the split pattern (tiktoken / Rust regex syntax). */
  pattern?: string;
  /** tiktoken: a built-in family; default detected from the folder. */
  preset?: TokenizerPreset;
  /** `server` only: the SGLang endpoints whose `/tokenize` gives the ids. */
  server?: ServerTokenizeOptions;
}

/** The parts of a loaded config that say how to load the run's tokenizer. */
export interface TokenizerConfigSource {
  tokenizer: { path: string; kind: TokenizerKind; pattern?: string | undefined; preset?: TokenizerPreset | undefined };
  sglang: { endpoints: readonly string[]; apiKey?: string | undefined };
}

/** The reserved special tokens Kimi's tokenizer places after the rank file's tokens. */
const KIMI_RESERVED_TOKENS = 256;

/** Folder names too generic to name a tokenizer; the parent folder names it instead. */
const GENERIC_FOLDER_NAMES = new Set(['models', 'model', 'tokenizer', 'tokenizers', 'files']);

function nameFor(dir: string, config: TokenizerConfigJson): string {
  const fromConfig = config.name_or_path;
  if (typeof fromConfig === 'string' && fromConfig !== '') return fromConfig;
  const base = path.basename(dir);
  return GENERIC_FOLDER_NAMES.has(base.toLowerCase()) ? path.basename(path.dirname(dir)) : base;
}

/** {@link TokenizerLoadOptions} from a loaded config (`tokenizer.*`, and `sglang.*` for `server`). */
export function tokenizerLoadOptions(config: TokenizerConfigSource): TokenizerLoadOptions {
  const t = config.tokenizer;
  const opts: TokenizerLoadOptions = { kind: t.kind };
  if (t.pattern !== undefined) opts.pattern = t.pattern;
  if (t.preset !== undefined) opts.preset = t.preset;
  if (t.kind === 'server') {
    opts.server = {
      endpoints: config.sglang.endpoints,
      ...(config.sglang.apiKey === undefined ? {} : { apiKey: config.sglang.apiKey }),
    };
  }
  return opts;
}

/**
 * Refuses what server-side tokenization cannot do exactly: conversation datasets, whose loss
 * mask needs the tokenizer locally (prefix encodings, token bytes). Throws a {@link ConfigError}
 * naming each such dataset and what to set instead.
 */
export function checkTokenizerKindFits(config: {
  tokenizer: { kind: TokenizerKind };
  datasets: readonly { name: string; conversations?: string | undefined }[];
}): void {
  if (config.tokenizer.kind !== 'server') return;
  const issues = config.datasets.flatMap((d, i) =>
    d.conversations === undefined
      ? []
      : [
          {
            path: `datasets[${i}].conversations`,
            message:
              `dataset "${d.name}" is a conversation dataset, which tokenizer.kind server cannot tokenize exactly (its loss mask needs the ` +
              'tokenizer here); use a local tokenizer: tokenizer.kind huggingface (tokenizer.json) or tiktoken (a rank file)',
          },
        ],
  );
  if (issues.length > 0) throw new ConfigError(issues);
}

/** Loads `config.tokenizer.path` as the config says (see {@link tokenizerLoadOptions}). */
export function loadConfiguredTokenizer(config: TokenizerConfigSource): Promise<ChatTokenizer> {
  return loadTokenizer(config.tokenizer.path, tokenizerLoadOptions(config));
}

/** The tiktoken rank file of a folder's file list: `tiktoken.model`, else the only `*.tiktoken`. */
function rankFileOf(dir: string, files: readonly string[]): string | undefined {
  if (files.includes('tiktoken.model')) return path.join(dir, 'tiktoken.model');
  const found = files.filter((f) => f.endsWith('.tiktoken'));
  if (found.length > 1) {
    throw new EnvironmentError(
      `tokenizer folder ${dir} has several tiktoken rank files (${found.join(', ')}); keep one`,
    );
  }
  return found[0] === undefined ? undefined : path.join(dir, found[0]);
}

/** Whether the folder is a Kimi K2-family tokenizer (its code file, or the config pointing at it). */
function detectPreset(files: readonly string[], config: TokenizerConfigJson): TokenizerPreset | undefined {
  if (files.includes('tokenization_kimi.py')) return 'kimi-k2';
  const autoMap = config.auto_map;
  if (isRecord(autoMap) && JSON.stringify(autoMap).includes('tokenization_kimi')) return 'kimi-k2';
  return undefined;
}

/** Kimi's special-token layout: every id from the rank count up, named by the config or reserved. */
function kimiSpecialTokens(numBase: number, added: readonly AddedTokenEntry[]): AddedTokenEntry[] {
  const byId = new Map(added.map((t) => [t.id, t]));
  let count = KIMI_RESERVED_TOKENS;
  for (const t of added) count = Math.max(count, t.id - numBase + 1);
  const out: AddedTokenEntry[] = [];
  for (let id = numBase; id < numBase + count; id++) {
    out.push(byId.get(id) ?? { id, content: `<|reserved_token_${id}|>`, special: true });
  }
  return out;
}

async function tiktokenEncoder(
  dir: string,
  files: readonly string[],
  config: TokenizerConfigJson,
  opts: TokenizerLoadOptions,
): Promise<{ encoder: TokenEncoder; preset: TokenizerPreset | undefined }> {
  const rankFile = rankFileOf(dir, files);
  if (rankFile === undefined) {
    throw new EnvironmentError(
      opts.kind === 'tiktoken'
        ? `tokenizer: ${dir} has no tiktoken rank file (tiktoken.model or *.tiktoken), which tokenizer.kind tiktoken needs`
        : `tokenizer: ${path.join(dir, 'tokenizer.json')} is missing, and ${dir} has no tiktoken rank file (tiktoken.model or *.tiktoken) either; ` +
            'set tokenizer.kind: server to have the server tokenize',
    );
  }
  const preset = opts.preset ?? detectPreset(files, config);
  const fromConfig = typeof config.pat_str === 'string' ? config.pat_str : undefined;
  const pattern = opts.pattern ?? (preset === 'kimi-k2' ? KIMI_K2_PATTERN : fromConfig);
  if (pattern === undefined) {
    throw new EnvironmentError(
      `tiktoken tokenizer in ${dir}: no split pattern; set tokenizer.pattern (the tokenizer code's pat_str) or tokenizer.preset`,
    );
  }
  const patternSource =
    opts.pattern !== undefined
      ? 'tokenizer.pattern'
      : preset !== undefined
        ? `the ${preset} preset's pattern`
        : `pat_str of ${dir}/tokenizer_config.json`;
  const ranks = await readRankFile(rankFile);
  const added = collectAddedTokens({}, config);
  const specialTokens = preset === 'kimi-k2' ? kimiSpecialTokens(ranks.ranks.size, added) : added;
  const encoder = new TiktokenEncoder({
    ranks,
    pattern,
    patternSource,
    specialTokens,
    ...(preset === 'kimi-k2' ? { chunkLimits: KIMI_CHUNK_LIMITS } : {}),
  });
  return { encoder, preset };
}

/** The model's vocabulary size from its `config.json` (`vocab_size`, or `text_config.vocab_size`). */
function modelVocabSize(modelConfig: Record<string, unknown> | undefined): number | undefined {
  const direct = modelConfig?.vocab_size;
  if (Number.isInteger(direct)) return direct as number;
  const text = modelConfig?.text_config;
  const nested = isRecord(text) ? text.vocab_size : undefined;
  return Number.isInteger(nested) ? (nested as number) : undefined;
}

async function serverEncoder(
  dir: string,
  config: TokenizerConfigJson,
  opts: TokenizerLoadOptions,
): Promise<ServerEncoder> {
  if (opts.server === undefined)
    throw new EnvironmentError('tokenizer.kind server needs the sglang endpoints to tokenize on');
  const [tokenizerJson, modelConfig] = await Promise.all([
    readOptionalJsonFile(path.join(dir, 'tokenizer.json'), 'tokenizer'),
    readOptionalJsonFile(path.join(dir, 'config.json'), 'tokenizer'),
  ]);
  const added = collectAddedTokens(tokenizerJson ?? {}, config);
  const size =
    modelVocabSize(modelConfig) ?? (added.length === 0 ? undefined : Math.max(...added.map((t) => t.id)) + 1);
  if (size === undefined) {
    throw new EnvironmentError(
      `tokenizer folder ${dir}: server-side tokenization needs the vocabulary size: a config.json with vocab_size, or added_tokens_decoder in tokenizer_config.json`,
    );
  }
  const encoder = new ServerEncoder(new ServerTokenizeClient(opts.server), added, size);
  // Named special tokens that are no added token: their ids, once, from the server.
  const addedTexts = new Set(added.map((t) => t.content));
  const named = ['bos_token', 'eos_token', 'unk_token', 'pad_token']
    .map((k) => tokenContent(config[k]))
    .filter((t): t is string => t !== undefined && !addedTexts.has(t));
  if (named.length > 0) {
    const ids = await encoder.client.tokenize(named);
    named.forEach((t, i) => encoder.remember(t, ids[i] ?? []));
  }
  return encoder;
}

/**
 * Loads the tokenizer in `dir` with the encoder `opts.kind` names (see the module comment).
 * Throws an {@link EnvironmentError} naming the folder or file that is missing, unreadable or
 * unsupported.
 */
export async function loadTokenizer(dir: string, opts: TokenizerLoadOptions = {}): Promise<ChatTokenizer> {
  const resolved = path.resolve(dir);
  let files: string[];
  try {
    if (!(await stat(resolved)).isDirectory())
      throw new EnvironmentError(`tokenizer folder ${resolved} is not a folder`);
    files = await readdir(resolved);
  } catch (e: unknown) {
    if (e instanceof AppError) throw e;
    throw new EnvironmentError(`tokenizer folder ${resolved} does not exist`, { cause: e });
  }
  const kind = opts.kind ?? 'auto';
  const useHf = kind === 'huggingface' || (kind === 'auto' && files.includes('tokenizer.json'));
  const [tokenizerConfig, templateFiles, generationConfig, tokenizerJson] = await Promise.all([
    readJsonFile(path.join(resolved, 'tokenizer_config.json'), 'tokenizer'),
    readTemplateFiles(resolved),
    readOptionalJsonFile(path.join(resolved, 'generation_config.json'), 'tokenizer'),
    useHf ? readJsonFile(path.join(resolved, 'tokenizer.json'), 'tokenizer') : Promise.resolve(undefined),
  ]);
  const chatTemplates = templateFiles.size > 0 ? templateFiles : templatesFromConfig(tokenizerConfig.chat_template);
  try {
    let encoder: TokenEncoder;
    let preset: TokenizerPreset | undefined;
    if (tokenizerJson !== undefined) encoder = new HfEncoder(tokenizerJson, tokenizerConfig);
    else if (kind === 'server') encoder = await serverEncoder(resolved, tokenizerConfig, opts);
    else ({ encoder, preset } = await tiktokenEncoder(resolved, files, tokenizerConfig, opts));
    return new ChatTokenizer({
      dir: resolved,
      name: nameFor(resolved, tokenizerConfig),
      encoder,
      tokenizerConfig,
      chatTemplates,
      sortToolKeys: preset === 'kimi-k2' || (kind === 'server' && detectPreset(files, tokenizerConfig) === 'kimi-k2'),
      tiktokenOverrides: {
        ...(opts.pattern === undefined ? {} : { pattern: opts.pattern }),
        ...(opts.preset === undefined ? {} : { preset: opts.preset }),
      },
      ...(generationConfig === undefined ? {} : { generationConfig }),
    });
  } catch (e: unknown) {
    if (e instanceof AppError) throw e;
    throw new EnvironmentError(`tokenizer in ${resolved} cannot be built: ${errorMessage(e)}`, { cause: e });
  }
}
