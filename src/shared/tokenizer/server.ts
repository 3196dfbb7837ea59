/**
 * Server-side tokenization (`tokenizer.kind: server`): for a tokenizer tokenmill cannot run
 * itself, the ids come from the served model's own tokenizer, through SGLang's `/tokenize`.
 *
 * The chat template is still rendered here, from the folder's `tokenizer_config.json` (or
 * `chat_template.jinja`). What is known locally, without a request: the added tokens of
 * `added_tokens_decoder` (their ids and texts). Everything else is asked of the server and
 * remembered: {@link ServerEncoder.encode} answers texts already tokenized there and throws
 * {@link ServerTokensNeededError} for others, which `ChatTokenizer.withServerTokens` fetches. Prompts
 * are tokenized in batches by the producer (`ServerTokenizeClient.tokenize`).
 *
 * Token bytes are not known, so conversation datasets (whose loss mask needs them) are refused.
 */
import type { AddedTokenEntry } from './config-json.js';
import { ServerTokensNeededError, type TokenEncoder } from './encoder.js';
import type { ServerTokenizeClient } from './server-client.js';

/** Texts remembered with their ids; dropped whole past this (only probes and special tokens are expected). */
const MEMO_LIMIT = 10_000;
/** Texts per `/tokenize` request, and requests in flight at once, when many texts are tokenized. */
const TEXTS_PER_REQUEST = 64;
const REQUESTS_IN_FLIGHT = 4;

/** A {@link TokenEncoder} whose ids come from the server (see the module comment). */
export class ServerEncoder implements TokenEncoder {
  readonly kind = 'server' as const;
  readonly addedTokens: readonly AddedTokenEntry[];
  readonly size: number;
  readonly client: ServerTokenizeClient;
  readonly #addedByText = new Map<string, number>();
  readonly #addedById = new Map<number, AddedTokenEntry>();
  readonly #encoded = new Map<string, readonly number[]>();
  readonly #decoded = new Map<string, string>();

  /**
   * `size`: the model's vocabulary size (its `config.json`'s `vocab_size`), else the highest
   * added id plus one.
   */
  constructor(client: ServerTokenizeClient, addedTokens: readonly AddedTokenEntry[], size: number) {
    this.client = client;
    this.addedTokens = addedTokens;
    this.size = size;
    for (const t of addedTokens) {
      this.#addedByText.set(t.content, t.id);
      this.#addedById.set(t.id, t);
    }
  }

  /** Ids below {@link size} that are no added token. */
  *baseIds(): Iterable<number> {
    for (let id = 0; id < this.size; id++) if (!this.#addedById.has(id)) yield id;
  }

  encode(text: string): number[] {
    const known = this.#encoded.get(text);
    if (known !== undefined) return [...known];
    throw new ServerTokensNeededError([text], []);
  }

  /** Remembers ids the server gave for `text` (the producer's prompts are not remembered). */
  remember(text: string, ids: readonly number[]): void {
    if (this.#encoded.size >= MEMO_LIMIT) this.#encoded.clear();
    this.#encoded.set(text, ids);
  }

  decode(ids: readonly number[], skipSpecial: boolean): string {
    const kept = skipSpecial ? ids.filter((id) => this.#addedById.get(id)?.special !== true) : ids;
    if (kept.every((id) => this.#addedById.has(id)))
      return kept.map((id) => this.#addedById.get(id)?.content ?? '').join('');
    const known = this.#decoded.get(kept.join(','));
    if (known !== undefined) return known;
    throw new ServerTokensNeededError([], [kept]);
  }

  tokenToId(token: string): number | undefined {
    const added = this.#addedByText.get(token);
    if (added !== undefined) return added;
    const ids = this.#encoded.get(token);
    return ids?.length === 1 ? ids[0] : undefined;
  }

  idToToken(id: number): string | undefined {
    return this.#addedById.get(id)?.content;
  }

  tokenBytes(): Uint8Array | undefined {
    return undefined;
  }

  /**
   * The ids of many texts (prompts), in order: requests of {@link TEXTS_PER_REQUEST} texts,
   * {@link REQUESTS_IN_FLIGHT} at a time, each retried on transient failures by the client.
   * Rejects when a request keeps failing or is refused. Nothing is remembered.
   */
  async encodeMany(texts: readonly string[]): Promise<number[][]> {
    const out = new Array<number[]>(texts.length);
    let next = 0;
    const lane = async (): Promise<void> => {
      while (next < texts.length) {
        const from = next;
        next = Math.min(texts.length, next + TEXTS_PER_REQUEST);
        const ids = await this.client.tokenize(texts.slice(from, next));
        ids.forEach((list, i) => (out[from + i] = list));
      }
    };
    await Promise.all(
      Array.from({ length: Math.min(REQUESTS_IN_FLIGHT, Math.ceil(texts.length / TEXTS_PER_REQUEST)) }, lane),
    );
    return out;
  }

  /** Fetches what `need` names from the server and remembers it. */
  async fetchMissing(need: ServerTokensNeededError): Promise<void> {
    const texts = need.texts.filter((t) => !this.#encoded.has(t));
    const [encoded, decoded] = await Promise.all([this.client.tokenize(texts), this.client.detokenize(need.idLists)]);
    texts.forEach((t, i) => this.remember(t, encoded[i] ?? []));
    need.idLists.forEach((ids, i) => this.#decoded.set(ids.join(','), decoded[i] ?? ''));
  }
}
