/**
 * What the simulated model "generates": a completion length drawn from a distribution and its
 * token ids, both a pure function of (seed, rid, prompt length) so that a request repeated with
 * the same rid gets the same output. The ids are random ordinary tokens (`output: 'random'`) or
 * the encoding of composed text (`output: 'text'`, output-text.ts), canonical as a real model's.
 */
import { composeAnswer } from './output-text.js';
import { requestRng, type Rng } from './random.js';

export interface OutputLengthSpec {
  distribution: 'lognormal' | 'fixed' | 'uniform';
  /** Mean completion length in tokens, stop token included. */
  mean: number;
  /** Lognormal shape (standard deviation of the log); default 0.8. */
  sigma?: number;
  min?: number;
  max?: number;
}

export const DEFAULT_OUTPUT_LENGTH: OutputLengthSpec = { distribution: 'lognormal', mean: 2700, sigma: 0.8 };

function standardNormal(rng: Rng): number {
  const u1 = Math.max(rng(), 1e-12);
  const u2 = rng();
  return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
}

/** A natural completion length (tokens, stop token included), at least 1. */
export function sampleOutputLength(spec: OutputLengthSpec, rng: Rng): number {
  const mean = Math.max(1, spec.mean);
  let length: number;
  switch (spec.distribution) {
    case 'fixed':
      length = mean;
      break;
    case 'uniform': {
      const low = spec.min ?? 1;
      const high = spec.max ?? Math.max(low, 2 * mean - low);
      length = low + rng() * (high - low + 1);
      break;
    }
    case 'lognormal': {
      const sigma = spec.sigma ?? 0.8;
      const mu = Math.log(mean) - (sigma * sigma) / 2;
      length = Math.exp(mu + sigma * standardNormal(rng));
      break;
    }
  }
  length = Math.floor(length);
  if (spec.min !== undefined) length = Math.max(length, spec.min);
  if (spec.max !== undefined) length = Math.min(length, spec.max);
  return Math.max(1, length);
}

/** SGLang's finish reasons as they appear in `meta_info.finish_reason`. */
export type FinishReason =
  | { type: 'length'; length: number }
  | { type: 'stop'; matched: number | string }
  | { type: 'abort'; message: string; status_code?: number | null; err_type?: string | null };

export interface OutputPlanInput {
  spec: OutputLengthSpec;
  seed: number;
  rid: string;
  promptTokens: number;
  /** Cap on generated tokens (the rest of the context when the request set none). */
  maxNewTokens: number;
  minNewTokens: number;
  ignoreEos: boolean;
  stopTokenIds: readonly number[];
  eosTokenId: number;
  /**
   * The completion's natural length (stop token included) when the answer is known rather than
   * drawn (a tool call, tool-calls.ts); default: drawn from `spec`.
   */
  naturalTokens?: number;
}

export interface OutputPlan {
  /** Tokens the request will generate, stop token included. */
  outputTokens: number;
  finishReason: FinishReason;
  /** The token that ends the completion when it stops on a token. */
  stopTokenId: number | undefined;
}

/**
 * Decides how a request ends: its natural length, capped by `max_new_tokens` (finish
 * `length`), or ending on the end-of-turn token (or the first of `stop_token_ids`), which is
 * counted in the completion as SGLang does. `ignore_eos` ignores stop tokens altogether.
 */
export function planOutput(input: OutputPlanInput): OutputPlan {
  const maxNewTokens = Math.max(0, Math.floor(input.maxNewTokens));
  if (input.ignoreEos) {
    return {
      outputTokens: maxNewTokens,
      finishReason: { type: 'length', length: maxNewTokens },
      stopTokenId: undefined,
    };
  }
  const drawn =
    input.naturalTokens ??
    sampleOutputLength(input.spec, requestRng(input.seed, input.rid, input.promptTokens, 'length'));
  const natural = Math.max(drawn, input.minNewTokens + 1);
  if (natural > maxNewTokens) {
    return {
      outputTokens: maxNewTokens,
      finishReason: { type: 'length', length: maxNewTokens },
      stopTokenId: undefined,
    };
  }
  const stopTokenId = input.stopTokenIds[0] ?? input.eosTokenId;
  if (natural === maxNewTokens) {
    // SGLang checks the length before the stop token: a stop token drawn as the last allowed
    // token still finishes with `length` (and stays the last output id).
    return { outputTokens: natural, finishReason: { type: 'length', length: maxNewTokens }, stopTokenId };
  }
  return { outputTokens: natural, finishReason: { type: 'stop', matched: stopTokenId }, stopTokenId };
}

/**
 * How the simulated model writes a completion: `random` ordinary token ids (words, punctuation,
 * newlines drawn one id at a time: cheap, but no real model's ids, and their decoded text encodes
 * to other ids), or `text`: composed prose, lists and code encoded once with the tokenizer,
 * cut to the drawn length (canonical ids, as a real model mostly emits).
 */
export type OutputMode = 'random' | 'text';

/** The output modes, for option checks. */
export const OUTPUT_MODES: readonly OutputMode[] = ['random', 'text'];

/** Ordinary token ids the simulated model writes with: words, punctuation, newlines. */
export interface TokenPool {
  words: readonly number[];
  punctuation: readonly number[];
  newlines: readonly number[];
  /** The tokenizer's encoding of text (no special tokens added), for `output: 'text'`. */
  encode?: (text: string) => number[];
}

/**
 * The first `count` completion ids of a request. When `count` reaches the plan's length and
 * the plan ends on a stop token, that token is the last id. With `mode` `text` the ids are those
 * of {@link textCompletionIds}, cut to `count`: a prefix of the full completion, whatever `count`.
 */
export function completionIds(
  plan: OutputPlan,
  pool: TokenPool,
  seed: number,
  rid: string,
  promptTokens: number,
  count: number,
  mode: OutputMode = 'random',
): number[] {
  const n = Math.max(0, Math.min(count, plan.outputTokens));
  if (mode === 'text' && n > 0) return textCompletionIds(plan, pool, seed, rid, promptTokens).slice(0, n);
  const rng = requestRng(seed, rid, promptTokens, 'ids');
  const ids = new Array<number>(n);
  const pick = (list: readonly number[]): number => list[Math.floor(rng() * list.length)] ?? list[0] ?? 0;
  for (let i = 0; i < n; i++) {
    const r = rng();
    if (r < 0.012 && pool.newlines.length > 0 && i > 0) ids[i] = pick(pool.newlines);
    else if (r < 0.09 && pool.punctuation.length > 0 && i > 0) ids[i] = pick(pool.punctuation);
    else ids[i] = pick(pool.words);
  }
  if (n === plan.outputTokens && n > 0 && plan.stopTokenId !== undefined) ids[n - 1] = plan.stopTokenId;
  return ids;
}

/**
 * The whole completion of a request in `text` mode: text composed from the request's PRNG
 * ({@link composeAnswer}, at least as many words as the plan has tokens), encoded once with
 * the pool's tokenizer, cut to the plan's length less the stop token, then the stop token when
 * the plan ends on one. Text that encodes shorter than the plan (a tokenizer that joins words)
 * is topped up with random word ids. Throws when the pool has no encoder.
 */
export function textCompletionIds(
  plan: OutputPlan,
  pool: TokenPool,
  seed: number,
  rid: string,
  promptTokens: number,
): number[] {
  if (pool.encode === undefined)
    throw new Error("simulator output 'text' needs a token pool with the tokenizer's encoder");
  const n = plan.outputTokens;
  if (n <= 0) return [];
  const body = plan.stopTokenId === undefined ? n : n - 1;
  const rng = requestRng(seed, rid, promptTokens, 'text');
  const ids = body > 0 ? pool.encode(composeAnswer(rng, body)).slice(0, body) : [];
  while (ids.length < body) ids.push(pool.words[Math.floor(rng() * pool.words.length)] ?? 0);
  if (plan.stopTokenId !== undefined) ids.push(plan.stopTokenId);
  return ids;
}

/**
 * The ids of a completion whose answer is known (`bodyIds`, its encoding without the stop token):
 * cut to the plan's length, the stop token last when the plan ends on one.
 */
export function knownCompletionIds(plan: OutputPlan, bodyIds: readonly number[]): number[] {
  const n = plan.outputTokens;
  if (n <= 0) return [];
  const body = plan.stopTokenId === undefined ? n : n - 1;
  const ids = bodyIds.slice(0, body);
  if (plan.stopTokenId !== undefined) ids.push(plan.stopTokenId);
  return ids;
}

/** The parts of a tokenizer the token pool needs (ChatTokenizer has them). */
export interface TokenPoolSource {
  readonly ordinaryTokenCount: number;
  ordinaryTokenId(index: number): number;
  tokenToId(token: string): number | undefined;
  isSpecialTokenId(id: number): boolean;
  /** When given, the pool can write `text` completions. */
  encode?(text: string): number[];
}

/** Common, neutral English words: completions read as (meaningless) plain text. */
const COMMON_WORDS = `the of and to in is that for it as with was on be by this are from at or an have not
which but all were when we there can more if will one about their has would other so what up out them some
time these two may then do first any like now my such make over our even most also after made many before
must through back years where much your way well down should because each just those people how too little
state good very world still own see men work long get here between both life being under never day same
another know while last might great old year off come since against go came right used take three small
large place around however home again number part found public system water city early later house
group high point line level order case field study model data result value process method test set form
power light change river market plan table chart paper report story book road music garden morning evening
simple clear quiet bright warm cold green blue red white black open close start finish build write read
learn teach answer question problem idea reason example step rule note list sample token batch
server queue budget record memory engine signal stream source target output input window layer weight
carefully quickly slowly together always often sometimes usually rather almost enough already
mountain valley forest ocean island desert cloud stone bridge tower village harbor station machine
letter circle square corner center border season summer winter spring autumn`.split(/\s+/);

const PUNCTUATION_TOKENS = [',', '.', ';', ':'];
const NEWLINE_TOKENS = ['Ċ', 'ĊĊ', '<0x0A>'];

/**
 * Picks ordinary tokens that read as text: common words with a leading space (`Ġword` /
 * `▁word` pieces), punctuation and newlines, so that completions decode to plain ASCII.
 * Falls back to a spread of all ordinary tokens for a vocabulary without such pieces.
 */
export function buildTokenPool(source: TokenPoolSource): TokenPool {
  const lookup = (tokens: readonly string[]): number[] => {
    const ids = new Set<number>();
    for (const t of tokens) {
      const id = source.tokenToId(t);
      if (id !== undefined && !source.isSpecialTokenId(id)) ids.add(id);
    }
    return [...ids];
  };
  const words = lookup(COMMON_WORDS.flatMap((w) => [`Ġ${w}`, `▁${w}`]));
  const punctuation = lookup(PUNCTUATION_TOKENS);
  const newlines = lookup(NEWLINE_TOKENS);
  const encode = source.encode === undefined ? {} : { encode: (text: string) => source.encode?.(text) ?? [] };
  if (words.length >= 50) return { words, punctuation, newlines, ...encode };
  const spread = new Set<number>();
  const step = Math.max(1, Math.floor(source.ordinaryTokenCount / 50_000));
  for (let i = 0; i < source.ordinaryTokenCount; i += step) spread.add(source.ordinaryTokenId(i));
  return { words: [...spread], punctuation: [], newlines: [], ...encode };
}
