/**
 * The encoding engine under a {@link ChatTokenizer}: text to ids and back, and the vocabulary.
 * Three kinds: `huggingface` (`tokenizer.json`, hf.ts), `tiktoken` (a rank file,
 * tiktoken.ts) and `server` (SGLang's `/tokenize`, server.ts).
 */
import { AppError } from '../errors.js';
import type { AddedTokenEntry } from './config-json.js';

/** How token ids are made (`tokenizer.kind` once resolved). */
export type EncoderKind = 'huggingface' | 'tiktoken' | 'server';

/** A tokenizer's encoding engine. */
export interface TokenEncoder {
  readonly kind: EncoderKind;
  /** Added tokens (special or not), by id. */
  readonly addedTokens: readonly AddedTokenEntry[];
  /** The highest id of the base vocabulary and the added tokens, plus one. */
  readonly size: number;
  /** Ids of the base vocabulary (not the added tokens), any order. */
  baseIds(): Iterable<number>;
  /** Text to ids: no BOS/EOS added; added tokens written in the text become their ids. */
  encode(text: string): number[];
  /** Ids (checked to be in range) to text; `skipSpecial` drops the encoder's special tokens. */
  decode(ids: readonly number[], skipSpecial: boolean): string;
  tokenToId(token: string): number | undefined;
  idToToken(id: number): string | undefined;
  /** The bytes a token id stands for, when the encoder knows them (tiktoken); undefined otherwise. */
  tokenBytes(id: number): Uint8Array | undefined;
}

/**
 * Server-side tokenization: a text (or ids) this process has not had tokenized (detokenized)
 * by the server yet. {@link ChatTokenizer.withServerTokens} fetches them and runs again.
 */
export class ServerTokensNeededError extends AppError {
  constructor(
    readonly texts: readonly string[],
    readonly idLists: readonly (readonly number[])[],
  ) {
    super(
      'tokenizer.kind server: ids come from the server, so this text must be tokenized there first ' +
        '(conversation datasets and other local tokenization need a local tokenizer: tokenizer.kind huggingface or tiktoken)',
    );
  }
}
