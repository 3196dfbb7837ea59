/**
 * The target model's tokenizer and chat template: a {@link TokenEncoder} (Hugging Face
 * `tokenizer.json`, a tiktoken rank file, or the server's `/tokenize`) with the folder's
 * `tokenizer_config.json` (optionally `chat_template.jinja`). Loaded by load.ts.
 *
 * The template engine is `@huggingface/jinja` (pure JS). Rendering and tokenization follow Python `transformers`'
 * `apply_chat_template(messages, tokenize=True, add_generation_prompt=True)` exactly, which the
 * parity test (test/integration/tokenizer-python.test.ts) checks token by token:
 *
 * - the template sees `messages` (keys whose value is null/undefined dropped, reasoning fields
 *   aliased as transformers does), `tools` (or none), `documents` (none), `add_generation_prompt`,
 *   the named special tokens that are set (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
 *   `pad_token`, `cls_token`, `mask_token`) and the caller's extra keyword arguments, which win;
 * - the template is compiled with `trim_blocks` and `lstrip_blocks`, as transformers does;
 * - the rendered text is encoded WITHOUT adding special tokens (the template writes its own BOS),
 *   but WITH added-token matching: a literal `<|im_end|>` inside user text becomes the special
 *   token, exactly as in transformers (whose default is `split_special_tokens=False`).
 */
import { Template } from '@huggingface/jinja';
import { installPythonStrip } from './jinja-python-strip.js';
import { renderingAt } from './strftime.js';

import { END_OF_TURN_PROBE_ANSWER, deriveEndOfTurnTokenIds } from './end-of-turn.js';
import { AppError, EnvironmentError, PayloadError, errorMessage } from '../errors.js';
import { templatesFromConfig, tokenContent, type TokenizerConfigJson } from './config-json.js';
import {
  deepSortKeys,
  normalizeMessage,
  type ApplyChatTemplateOptions,
  type ChatMessage,
  type EncodePromptOptions,
  type PromptToEncode,
} from './messages.js';
import { ServerTokensNeededError, type EncoderKind, type TokenEncoder } from './encoder.js';
import { ServerEncoder } from './server.js';
import type { ServerTokenizeClient } from './server-client.js';
import type { TokenizerPreset } from './tiktoken.js';

/** A half-open range of token ids: `start <= id < end`. */
export interface TokenIdRange {
  start: number;
  end: number;
}

/** Names of the special-token attributes transformers hands to chat templates, in its order. */
const NAMED_SPECIAL_TOKENS = [
  'bos_token',
  'eos_token',
  'unk_token',
  'sep_token',
  'pad_token',
  'cls_token',
  'mask_token',
] as const;

/** Rounds of fetching from the server that {@link ChatTokenizer.withServerTokens} allows. */
const SERVER_TOKEN_ROUNDS = 32;

/**
 * A tokenizer with its chat template: encode/decode, render a conversation, and the token ids
 * that matter to generation (end of turn, special, ordinary). Build one with `loadTokenizer`
 * (load.ts).
 */
export class ChatTokenizer {
  /** The tokenizer's name: the config's `name_or_path`, else its folder's name. */
  readonly name: string;
  /** The folder it was loaded from. */
  readonly dir: string;
  /**
   * The tiktoken split pattern and preset it was loaded with, when they were given rather than
   * found in the folder: what another thread needs to load the same tokenizer.
   */
  readonly tiktokenOverrides: { readonly pattern?: string; readonly preset?: TokenizerPreset };
  /**
   * Number of token ids: the highest id among the vocabulary and the added tokens, plus one
   * (what transformers' `len(tokenizer)` returns; 151669 for Qwen3). A model's embedding matrix,
   * `vocab_size` in its config.json, may be padded past it (151936 for Qwen3).
   */
  readonly vocabSize: number;
  /** The id of `eos_token`. */
  readonly eosTokenId: number;
  /** The id of `bos_token`, when the tokenizer has one (Qwen3 has none). */
  readonly bosTokenId: number | undefined;
  /**
   * Ids that end an assistant turn, ascending: the EOS, the `eos_token_id`s of
   * `generation_config.json`, and the special token the chat template closes an assistant turn
   * with; the well-known ones (`<|im_end|>`, `<|eot_id|>`, ...) only when neither the generation
   * config nor the template names one (see end-of-turn.ts).
   */
  readonly endOfTurnTokenIds: readonly number[];
  /** The special token the chat template closes an assistant turn with, when it has one. */
  readonly templateEndOfTurnTokenId: number | undefined;
  /**
   * Special token ids: added tokens marked `special` in tokenizer.json or `added_tokens_decoder`,
   * plus the named special tokens and `additional_special_tokens` of the config. These are the ids
   * `decode(ids, { skipSpecialTokens: true })` drops.
   */
  readonly specialTokenIds: ReadonlySet<number>;
  /** Named special tokens as the template sees them (`bos_token`, `eos_token`, ...), only those set. */
  readonly specialTokens: Readonly<Record<string, string>>;
  /**
   * Ids of the base vocabulary that are no added token (special or not, e.g. `<think>` is
   * excluded), as ascending, disjoint, half-open ranges. Any of them is a valid model output
   * that carries no control meaning.
   */
  readonly ordinaryTokenIdRanges: readonly TokenIdRange[];
  /** How many ids {@link ordinaryTokenIdRanges} holds. */
  readonly ordinaryTokenCount: number;

  readonly #encoder: TokenEncoder;
  readonly #templates: ReadonlyMap<string, Template>;
  readonly #templateSources: ReadonlyMap<string, string>;
  readonly #ordinaryRangeStarts: readonly number[];
  readonly #sortToolKeys: boolean;

  /** Use `loadTokenizer`, or this with an encoder and the parsed config. */
  constructor(params: {
    dir: string;
    name: string;
    encoder: TokenEncoder;
    tokenizerConfig: TokenizerConfigJson;
    /** Sort the keys of tool schemas before rendering (Kimi's tokenizer does). */
    sortToolKeys?: boolean;
    /** tiktoken: the pattern and preset given by the config (see {@link tiktokenOverrides}). */
    tiktokenOverrides?: { pattern?: string; preset?: TokenizerPreset };
    /** Templates by name ("default", "tool_use", ...), overriding the config's `chat_template`. */
    chatTemplates?: ReadonlyMap<string, string>;
    /** `generation_config.json`, when the folder has one (its `eos_token_id` ends turns too). */
    generationConfig?: Record<string, unknown>;
  }) {
    const { encoder, tokenizerConfig } = params;
    this.dir = params.dir;
    this.tiktokenOverrides = params.tiktokenOverrides ?? {};
    this.name = params.name;
    this.#encoder = encoder;
    this.#sortToolKeys = params.sortToolKeys ?? false;
    const vocab = { get: (token: string): number | undefined => encoder.tokenToId(token) };
    const added = encoder.addedTokens;
    this.vocabSize = encoder.size;

    const specialTokens: Record<string, string> = {};
    for (const key of NAMED_SPECIAL_TOKENS) {
      const content = tokenContent(tokenizerConfig[key]);
      if (content !== undefined) specialTokens[key] = content;
    }
    this.specialTokens = specialTokens;

    const special = new Set<number>();
    for (const t of added) if (t.special) special.add(t.id);
    const extra = tokenizerConfig.additional_special_tokens ?? tokenizerConfig.extra_special_tokens;
    const namedSpecial = [...Object.values(specialTokens), ...(Array.isArray(extra) ? extra.map(tokenContent) : [])];
    for (const content of namedSpecial) {
      const id = content === undefined ? undefined : vocab.get(content);
      if (id !== undefined) special.add(id);
    }
    this.specialTokenIds = special;

    const eos = specialTokens.eos_token;
    const eosId = eos === undefined ? undefined : vocab.get(eos);
    if (eosId === undefined) {
      throw new EnvironmentError(
        `tokenizer in ${params.dir}: eos_token ${eos === undefined ? 'is not set' : `"${eos}" is not in the vocabulary`}`,
      );
    }
    this.eosTokenId = eosId;
    const bos = specialTokens.bos_token;
    this.bosTokenId = bos === undefined ? undefined : vocab.get(bos);

    const addedIds = new Set(added.map((t) => t.id));
    const ordinary: number[] = [];
    for (const id of encoder.baseIds()) if (!addedIds.has(id) && !special.has(id)) ordinary.push(id);
    ordinary.sort((a, b) => a - b);
    const ranges: TokenIdRange[] = [];
    for (const id of ordinary) {
      const last = ranges.at(-1);
      if (last !== undefined && last.end === id) last.end = id + 1;
      else if (last === undefined || last.end < id) ranges.push({ start: id, end: id + 1 });
    }
    this.ordinaryTokenIdRanges = ranges;
    const starts: number[] = [];
    let count = 0;
    for (const r of ranges) {
      starts.push(count);
      count += r.end - r.start;
    }
    this.#ordinaryRangeStarts = starts;
    this.ordinaryTokenCount = count;

    const sources = params.chatTemplates ?? templatesFromConfig(tokenizerConfig.chat_template);
    installPythonStrip();
    const templates = new Map<string, Template>();
    for (const [templateName, source] of sources) {
      try {
        templates.set(templateName, new Template(source));
      } catch (e: unknown) {
        throw new EnvironmentError(
          `tokenizer in ${params.dir}: chat template "${templateName}" does not parse: ${errorMessage(e)}`,
          { cause: e },
        );
      }
    }
    this.#templates = templates;
    this.#templateSources = sources;

    const specialByText = new Map<string, number>();
    for (const t of added) if (t.special) specialByText.set(t.content, t.id);
    for (const content of namedSpecial) {
      const id = content === undefined ? undefined : vocab.get(content);
      if (content !== undefined && id !== undefined) specialByText.set(content, id);
    }
    const endOfTurn = deriveEndOfTurnTokenIds({
      eosTokenId: eosId,
      generationConfig: params.generationConfig,
      specialTokens: specialByText,
      vocabSize: this.vocabSize,
      renderOneTurn: () => this.#renderEndOfTurnProbe(),
      tokenToId: (token) => vocab.get(token),
    });
    this.endOfTurnTokenIds = endOfTurn.ids;
    this.templateEndOfTurnTokenId = endOfTurn.templateTokenId;
  }

  #renderEndOfTurnProbe(): string | undefined {
    if (!this.hasChatTemplate) return undefined;
    try {
      return this.applyChatTemplate(
        [
          { role: 'user', content: 'tokenmill end-of-turn probe question' },
          { role: 'assistant', content: END_OF_TURN_PROBE_ANSWER },
        ],
        { addGenerationPrompt: false },
      );
    } catch {
      return undefined; // a template that cannot render this probe names no end-of-turn token
    }
  }

  /**
   * The source text of the chat template `name` (default: the one a rendering with tools uses,
   * `tool_use` when the folder has it, else `default`), for reading what it writes (the tool-call
   * format); undefined without one.
   */
  chatTemplateSource(name?: string): string | undefined {
    if (name !== undefined) return this.#templateSources.get(name);
    return (
      this.#templateSources.get('tool_use') ??
      this.#templateSources.get('default') ??
      [...this.#templateSources.values()][0]
    );
  }

  /** Whether a chat template is available. */
  get hasChatTemplate(): boolean {
    return this.#templates.size > 0;
  }

  /**
   * Encodes text to ids. Adds no special tokens (no BOS/EOS), but added tokens written in the
   * text (`<|im_start|>`, `<think>`) become their single ids, as in transformers.
   */
  encode(text: string): number[] {
    return this.#encoder.encode(text);
  }

  /** The server client, with server-side tokenization (`tokenizer.kind: server`); else undefined. */
  get serverClient(): ServerTokenizeClient | undefined {
    return this.#encoder instanceof ServerEncoder ? this.#encoder.client : undefined;
  }

  /** The encoding engine's kind: `huggingface`, `tiktoken` or `server`. */
  get encoderKind(): EncoderKind {
    return this.#encoder.kind;
  }

  /**
   * The bytes of a token id, when the encoder knows them (tiktoken: the rank file's bytes, or a
   * special token's UTF-8 text); undefined for the other encoders and unknown ids.
   */
  tokenBytes(id: number): Uint8Array | undefined {
    return this.#encoder.tokenBytes(id);
  }

  /**
   * Runs `fn`, which may encode or decode with this tokenizer. With server-side tokenization
   * (`tokenizer.kind: server`), texts and ids not yet seen are fetched from the server and `fn`
   * runs again, until it completes; `fn` must be deterministic. Other encoders run it once.
   */
  async withServerTokens<T>(fn: () => T): Promise<T> {
    const encoder = this.#encoder;
    for (let round = 0; ; round++) {
      try {
        return fn();
      } catch (e: unknown) {
        if (
          !(e instanceof ServerTokensNeededError) ||
          !(encoder instanceof ServerEncoder) ||
          round >= SERVER_TOKEN_ROUNDS
        )
          throw e;
        await encoder.fetchMissing(e);
      }
    }
  }

  /**
   * Decodes ids to text. Throws a {@link PayloadError} for an id that is not an integer in
   * `[0, vocabSize)`.
   */
  decode(ids: readonly number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    for (const id of ids) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new PayloadError(`token id ${String(id)} is out of range [0, ${this.vocabSize}) of ${this.name}`);
      }
    }
    if (ids.length === 0) return '';
    const skip = opts.skipSpecialTokens ?? false;
    if (skip && this.#encoder.kind !== 'huggingface') {
      return this.#encoder.decode(
        ids.filter((id) => !this.specialTokenIds.has(id)),
        false,
      );
    }
    return this.#encoder.decode(ids, skip);
  }

  /** The id of a token string (as in the vocabulary, e.g. `Ġthe`), or undefined. */
  tokenToId(token: string): number | undefined {
    return this.#encoder.tokenToId(token);
  }

  /** The token string of an id, or undefined. */
  idToToken(id: number): string | undefined {
    return this.#encoder.idToToken(id);
  }

  /** Whether `id` is a special token id. */
  isSpecialTokenId(id: number): boolean {
    return this.specialTokenIds.has(id);
  }

  /**
   * The `index`-th ordinary token id, `0 <= index < ordinaryTokenCount`; with a uniform random
   * index this draws a uniform random ordinary token.
   */
  ordinaryTokenId(index: number): number {
    if (!Number.isInteger(index) || index < 0 || index >= this.ordinaryTokenCount) {
      throw new RangeError(`ordinary token index ${index} is out of range [0, ${this.ordinaryTokenCount})`);
    }
    const starts = this.#ordinaryRangeStarts;
    let lo = 0;
    let hi = starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if ((starts[mid] ?? 0) <= index) lo = mid;
      else hi = mid - 1;
    }
    const range = this.ordinaryTokenIdRanges[lo];
    if (range === undefined) throw new RangeError('no ordinary tokens');
    return range.start + (index - (starts[lo] ?? 0));
  }

  /**
   * Renders a conversation with the chat template, as transformers'
   * `apply_chat_template(messages, tokenize=False, ...)` does. Throws a {@link PayloadError} for
   * an empty conversation or when the template rejects it (`raise_exception`), and an
   * {@link AppError} when the tokenizer has no chat template.
   */
  applyChatTemplate(messages: readonly ChatMessage[], opts: ApplyChatTemplateOptions): string {
    if (messages.length === 0) {
      throw new PayloadError('cannot apply the chat template to an empty conversation');
    }
    const template = this.#selectTemplate(opts.tools !== undefined);
    const context: Record<string, unknown> = {
      messages: messages.map(normalizeMessage),
      tools: opts.tools === undefined ? null : this.#sortToolKeys ? deepSortKeys(opts.tools) : opts.tools,
      documents: null,
      add_generation_prompt: opts.addGenerationPrompt,
      ...this.specialTokens,
      ...opts.templateKwargs,
    };
    try {
      return renderingAt(opts.now, () => template.render(context));
    } catch (e: unknown) {
      throw new PayloadError(`chat template of ${this.name} failed: ${errorMessage(e)}`, { cause: e });
    }
  }

  /** The prompt's ids: `encode(applyChatTemplate(messages, { addGenerationPrompt: true, ... }))`. */
  encodePrompt(messages: readonly ChatMessage[], opts: EncodePromptOptions = {}): number[] {
    return this.encode(this.applyChatTemplate(messages, { ...opts, addGenerationPrompt: true }));
  }

  /**
   * The prompt ids of many conversations ({@link encodePrompt} each), in order; an entry is the
   * error of a conversation the template rejects. A conversation given as `{messages, tools}` is
   * rendered with its own tool schemas (over `opts.tools`). With server-side tokenization the
   * rendered prompts are tokenized by the server in batches (server.ts); a server failure that
   * retries do not cure rejects the whole call.
   */
  async encodePrompts(
    conversations: readonly PromptToEncode[],
    opts: EncodePromptOptions = {},
  ): Promise<(number[] | Error)[]> {
    const rendered = conversations.map((conversation): string | Error => {
      const { messages, tools } =
        'messages' in conversation ? conversation : { messages: conversation, tools: undefined };
      try {
        return this.applyChatTemplate(messages, {
          ...opts,
          ...(tools === undefined ? {} : { tools }),
          addGenerationPrompt: true,
        });
      } catch (e: unknown) {
        return e instanceof Error ? e : new Error(String(e));
      }
    });
    const encoder = this.#encoder;
    if (!(encoder instanceof ServerEncoder)) return rendered.map((r) => (r instanceof Error ? r : encoder.encode(r)));
    const texts = rendered.filter((r): r is string => typeof r === 'string');
    const ids = await encoder.encodeMany(texts);
    let k = 0;
    return rendered.map((r) => (r instanceof Error ? r : (ids[k++] ?? [])));
  }

  #selectTemplate(withTools: boolean): Template {
    const templates = this.#templates;
    if (templates.size === 0) {
      throw new AppError(`tokenizer ${this.name} (${this.dir}) has no chat_template`);
    }
    // Same choice as transformers' get_chat_template: "tool_use" when tools are given, else "default".
    const chosen =
      (withTools ? templates.get('tool_use') : undefined) ??
      templates.get('default') ??
      (templates.size === 1 ? [...templates.values()][0] : undefined);
    if (chosen === undefined) {
      throw new AppError(
        `tokenizer ${this.name} has several chat templates (${[...templates.keys()].join(', ')}) and none named "default"`,
      );
    }
    return chosen;
  }
}
