/** The Hugging Face encoding engine: `tokenizer.json` run by `@huggingface/tokenizers`. */
import { Tokenizer } from '@huggingface/tokenizers';

import { collectAddedTokens, type AddedTokenEntry, type TokenizerConfigJson } from './config-json.js';
import type { TokenEncoder } from './encoder.js';
import { fastByteLevelEncoder } from './hf-fast.js';

/** A {@link TokenEncoder} over a parsed `tokenizer.json` and its `tokenizer_config.json`. */
export class HfEncoder implements TokenEncoder {
  readonly kind = 'huggingface' as const;
  readonly addedTokens: readonly AddedTokenEntry[];
  readonly size: number;
  readonly #tokenizer: Tokenizer;
  readonly #vocab: Map<string, number>;
  /** The same encoding, faster, for byte-level BPE tokenizers (hf-fast.ts). */
  readonly #fastEncode: ((text: string) => number[]) | undefined;

  constructor(tokenizerJson: Record<string, unknown>, tokenizerConfig: TokenizerConfigJson) {
    this.#tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
    this.#vocab = this.#tokenizer.get_vocab(true);
    this.#fastEncode = fastByteLevelEncoder(this.#tokenizer);
    this.addedTokens = collectAddedTokens(tokenizerJson, tokenizerConfig);
    let maxId = -1;
    for (const id of this.#vocab.values()) if (id > maxId) maxId = id;
    for (const t of this.addedTokens) if (t.id > maxId) maxId = t.id;
    this.size = maxId + 1;
  }

  baseIds(): Iterable<number> {
    return this.#vocab.values();
  }

  encode(text: string): number[] {
    return this.#fastEncode?.(text) ?? this.#tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  decode(ids: readonly number[], skipSpecial: boolean): string {
    return this.#tokenizer.decode([...ids], { skip_special_tokens: skipSpecial });
  }

  tokenToId(token: string): number | undefined {
    return this.#tokenizer.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.#tokenizer.id_to_token(id);
  }

  tokenBytes(): Uint8Array | undefined {
    return undefined;
  }
}
