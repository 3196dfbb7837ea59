/**
 * SGLang's tokenizer routes for server-side tokenization: `POST /tokenize`
 * `{prompt, add_special_tokens: false}` → `{tokens, count, max_model_len}` (a list of prompts
 * in one request), its `messages` form where the server has it, and `POST /detokenize`.
 *
 * Transient failures (connection errors, timeouts, 429 and 5xx answers) are retried with
 * backoff, moving to the next endpoint; a request that keeps failing, or one the server refuses
 * (other 4xx, a body without ids), fails with an error naming the endpoint, the route and the
 * server's answer.
 */
import { setTimeout as sleep } from 'node:timers/promises';

import { request } from 'undici';

import { EnvironmentError, UnavailableError, UpstreamHttpError, errorMessage } from '../errors.js';

/** Where and how to reach the servers. */
export interface ServerTokenizeOptions {
  endpoints: readonly string[];
  apiKey?: string;
  /** Per request. Default 30 s. */
  timeoutMs?: number;
  /** Attempts per request, transient failures included. Default 6. */
  attempts?: number;
  /** First backoff; doubled per attempt. Default 200 ms. */
  backoffMs?: number;
}

function isIds(v: unknown): v is number[] {
  return Array.isArray(v) && v.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0);
}

/** Thrown for an answer that retrying will not change. */
class RefusedError extends Error {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

/** A client of the tokenizer routes of one or more SGLang endpoints (see the module comment). */
export class ServerTokenizeClient {
  readonly #endpoints: readonly string[];
  readonly #apiKey: string | undefined;
  readonly #timeoutMs: number;
  readonly #attempts: number;
  readonly #backoffMs: number;
  #next = 0;

  constructor(o: ServerTokenizeOptions) {
    if (o.endpoints.length === 0)
      throw new EnvironmentError('server-side tokenization needs at least one sglang endpoint');
    this.#endpoints = o.endpoints;
    this.#apiKey = o.apiKey;
    this.#timeoutMs = o.timeoutMs ?? 30_000;
    this.#attempts = o.attempts ?? 6;
    this.#backoffMs = o.backoffMs ?? 200;
  }

  /** The endpoints, in the order requests rotate over them. */
  get endpoints(): readonly string[] {
    return this.#endpoints;
  }

  /** POSTs `body` to `route` of `endpoint` once; the parsed JSON of a 200, else throws. */
  async post(endpoint: string, route: string, body: unknown): Promise<unknown> {
    const res = await request(new URL(route, endpoint), {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(this.#apiKey === undefined ? {} : { authorization: `Bearer ${this.#apiKey}` }),
      },
      body: JSON.stringify(body),
      headersTimeout: this.#timeoutMs,
      bodyTimeout: this.#timeoutMs,
    });
    const text = await res.body.text();
    if (res.statusCode === 429 || res.statusCode >= 500) {
      throw new UpstreamHttpError(`${endpoint}${route} answered ${res.statusCode}: ${text.slice(0, 200)}`, {
        endpoint,
        status: res.statusCode,
        retryable: true,
      });
    }
    if (res.statusCode !== 200)
      throw new RefusedError(`${endpoint}${route} answered ${res.statusCode}: ${text.slice(0, 300)}`, res.statusCode);
    try {
      return JSON.parse(text) as unknown;
    } catch {
      throw new RefusedError(
        `${endpoint}${route} answered 200 with a body that is not JSON: ${text.slice(0, 200)}`,
        200,
      );
    }
  }

  /** Runs `call` on the endpoints in turn, retrying transient failures (see the module comment). */
  async #withRetries<T>(route: string, call: (endpoint: string) => Promise<T>, only?: string): Promise<T> {
    let last: unknown;
    for (let attempt = 0; attempt < this.#attempts; attempt++) {
      const endpoint = only ?? this.#endpoints[this.#next++ % this.#endpoints.length] ?? '';
      try {
        return await call(endpoint);
      } catch (e: unknown) {
        if (e instanceof RefusedError) {
          throw new UpstreamHttpError(`server-side tokenization: ${e.message}`, {
            endpoint,
            status: e.status,
            retryable: false,
          });
        }
        last = e;
        if (attempt + 1 < this.#attempts) await sleep(this.#backoffMs * 2 ** attempt);
      }
    }
    throw new UnavailableError(
      `server-side tokenization: ${route} failed ${this.#attempts} times on ${only ?? this.#endpoints.join(', ')}; last: ${errorMessage(last)}`,
      { cause: last },
    );
  }

  /** The ids of each text, without added BOS/EOS, in one request (to `only`, else the next endpoint). */
  async tokenize(texts: readonly string[], only?: string): Promise<number[][]> {
    if (texts.length === 0) return [];
    return this.#withRetries(
      '/tokenize',
      async (endpoint) => {
        const body = await this.post(endpoint, '/tokenize', {
          prompt: texts.length === 1 ? texts[0] : texts,
          add_special_tokens: false,
        });
        const tokens = (body as { tokens?: unknown } | null)?.tokens;
        const lists = texts.length === 1 && isIds(tokens) ? [tokens] : tokens;
        if (!Array.isArray(lists) || lists.length !== texts.length || !lists.every(isIds)) {
          throw new RefusedError(
            `${endpoint}/tokenize answered without ${texts.length} id lists: ${JSON.stringify(body).slice(0, 200)}`,
            200,
          );
        }
        return lists;
      },
      only,
    );
  }

  /**
   * The ids of `messages` with the server's own chat template and the generation prompt
   * (`/tokenize {messages}`), or undefined when the server does not take that form (an answer
   * other than 200 with ids).
   */
  async tokenizeMessages(endpoint: string, messages: readonly unknown[]): Promise<number[] | undefined> {
    try {
      const body = await this.post(endpoint, '/tokenize', {
        messages,
        add_generation_prompt: true,
        add_special_tokens: false,
      });
      const tokens = (body as { tokens?: unknown } | null)?.tokens;
      return isIds(tokens) ? tokens : undefined;
    } catch (e: unknown) {
      if (e instanceof RefusedError) return undefined;
      throw e;
    }
  }

  /** The text of each id list, in one request per list. */
  async detokenize(idLists: readonly (readonly number[])[]): Promise<string[]> {
    return Promise.all(
      idLists.map((ids) =>
        this.#withRetries('/detokenize', async (endpoint) => {
          const body = await this.post(endpoint, '/detokenize', { tokens: ids });
          const text = (body as { text?: unknown } | null)?.text;
          if (typeof text !== 'string')
            throw new RefusedError(
              `${endpoint}/detokenize answered without a text: ${JSON.stringify(body).slice(0, 200)}`,
              200,
            );
          return text;
        }),
      ),
    );
  }
}
