/**
 * The token ids that end an assistant turn, derived from the tokenizer itself rather than from a
 * list of model families:
 *
 * - the config's `eos_token` (a string or a `{content}` object);
 * - `eos_token_id` of `generation_config.json` (a number or a list), when the folder has one:
 *   what `transformers`' `generate` and SGLang stop on;
 * - the chat template: a one-turn conversation is rendered and the special token (an added token
 *   marked `special`, from tokenizer.json or `added_tokens_decoder`, or a named special token)
 *   that directly follows the assistant's content is the one the template closes turns with.
 *
 * Only when neither the generation config nor the template names one are the well-known
 * end-of-turn tokens of the common families ({@link KNOWN_END_OF_TURN_TOKENS}) added, where they
 * exist as special tokens.
 */

/** Tokens that end an assistant turn in common model families: the fallback only. */
export const KNOWN_END_OF_TURN_TOKENS: readonly string[] = [
  '<|im_end|>',
  '<|endoftext|>',
  '<｜end▁of▁sentence｜>',
  '<|eot_id|>',
  '<|end_of_text|>',
  '<end_of_turn>',
];

/** The assistant content of the probe conversation; unlikely to merge with what follows it. */
export const END_OF_TURN_PROBE_ANSWER = 'tokenmill end-of-turn probe answer.';

/** What {@link deriveEndOfTurnTokenIds} reads. */
export interface EndOfTurnSources {
  /** The id of the config's `eos_token`. */
  eosTokenId: number;
  /** `generation_config.json`, when the folder has one. */
  generationConfig: Record<string, unknown> | undefined;
  /** Special tokens by their text (added tokens marked special and the named special tokens). */
  specialTokens: ReadonlyMap<string, number>;
  /** Number of ids; ids of the generation config outside `[0, vocabSize)` are ignored. */
  vocabSize: number;
  /**
   * Renders `[user, assistant END_OF_TURN_PROBE_ANSWER]` without a generation prompt; undefined
   * when there is no template or it cannot render that conversation.
   */
  renderOneTurn: () => string | undefined;
  /** The id of a token's text, for the fallback list. */
  tokenToId: (token: string) => number | undefined;
}

/** Where each end-of-turn id came from, for logs and tests. */
export interface EndOfTurnTokens {
  /** Ascending, without duplicates. */
  ids: number[];
  /** The special token the chat template closes an assistant turn with, when it has one. */
  templateTokenId: number | undefined;
  /** The ids `generation_config.json` lists as `eos_token_id`. */
  generationConfigIds: number[];
  /** Whether the known list was used because nothing else named an end-of-turn token. */
  usedFallback: boolean;
}

/** `eos_token_id` of a generation config: a number or a list of numbers. */
export function generationConfigEosIds(config: Record<string, unknown> | undefined, vocabSize: number): number[] {
  const value = config?.eos_token_id;
  const list = Array.isArray(value) ? (value as unknown[]) : [value];
  return list.filter((id): id is number => Number.isInteger(id) && (id as number) >= 0 && (id as number) < vocabSize);
}

/** The special token that directly follows the assistant content in the rendered probe, if any. */
export function templateEndOfTurnTokenId(
  rendered: string | undefined,
  specialTokens: ReadonlyMap<string, number>,
): number | undefined {
  if (rendered === undefined) return undefined;
  const at = rendered.lastIndexOf(END_OF_TURN_PROBE_ANSWER);
  if (at < 0) return undefined;
  const after = rendered.slice(at + END_OF_TURN_PROBE_ANSWER.length);
  let best: string | undefined;
  for (const text of specialTokens.keys()) {
    if (text !== '' && after.startsWith(text) && (best === undefined || text.length > best.length)) best = text;
  }
  return best === undefined ? undefined : specialTokens.get(best);
}

/** Derives the end-of-turn ids (see the module comment). */
export function deriveEndOfTurnTokenIds(src: EndOfTurnSources): EndOfTurnTokens {
  const ids = new Set<number>([src.eosTokenId]);
  const generationConfigIds = generationConfigEosIds(src.generationConfig, src.vocabSize);
  for (const id of generationConfigIds) ids.add(id);
  const templateTokenId = templateEndOfTurnTokenId(src.renderOneTurn(), src.specialTokens);
  if (templateTokenId !== undefined) ids.add(templateTokenId);
  const usedFallback = templateTokenId === undefined && generationConfigIds.length === 0;
  if (usedFallback) {
    const special = new Set(src.specialTokens.values());
    for (const token of KNOWN_END_OF_TURN_TOKENS) {
      const id = src.tokenToId(token);
      if (id !== undefined && special.has(id)) ids.add(id);
    }
  }
  return { ids: [...ids].sort((a, b) => a - b), templateTokenId, generationConfigIds, usedFallback };
}
