/**
 * HTTP client for one SGLang endpoint (docs/design.md, SGLang's HTTP API as tokenmill uses it), on
 * undici.
 *
 * Every failure comes out as an {@link AppError} that says what to do next: a 400 fails the
 * prompt ({@link SglangBadRequestError}), a 5xx or an unusable body is retryable, an endpoint
 * that cannot be reached is an `UnavailableError` (wait, do not spend attempts), the request
 * deadline gives a `TimeoutError`, and the caller's abort signal a `CancelledError`. A 401, 403,
 * 404, 405 or other endpoint-level 4xx is an `EndpointMisconfiguredError` (take the endpoint
 * out of rotation; the prompt is not at fault). A request
 * that was cancelled or timed out is also aborted on the server (`/abort_request`), so its
 * batch slot is freed at once.
 */
import { EventEmitter } from 'node:events';
import { Pool } from 'undici';

import { type AppError, CancelledError, ConfigError, TimeoutError, errorMessage } from '../errors.js';
import { type Logger, logger as componentLogger } from '../logger.js';
import { recordGenerationRequest, recordRequestStarted } from './request-stats.js';
import {
  EndpointMisconfiguredError,
  SglangResponseFormatError,
  type SglangRequestContext,
  classifyResponse,
  classifyTransportError,
  isEndpointLevelStatus,
  sglangErrorMessage,
} from './errors.js';
import {
  type ChatMessageInput,
  type ChatResult,
  type GenerateResult,
  type LoadInfo,
  type ModelInfo,
  type ParseOutcome,
  type SglangSamplingOptions,
  type ServerInfo,
  parseChatResponse,
  parseGenerateResponse,
  parseLoad,
  parseModelInfo,
  parseServerInfo,
} from './schemas.js';

/** Options of {@link SglangClient}. */
export interface SglangClientOptions {
  /** Base URL of the SGLang server, e.g. `http://127.0.0.1:30000` (a path prefix is kept). */
  endpoint: string;
  /**
   * Generation requests this client keeps in flight at most: the connection pool has this many
   * keep-alive connections (HTTP/1.1, no pipelining), so more requests wait locally, not in
   * SGLang's queue. Health, abort and info calls use a separate small pool and never wait
   * behind generations.
   */
  concurrency: number;
  /**
   * Deadline of one generation request, from the call to the last byte of the response (time
   * spent waiting for a free connection counts). It must cover queueing in SGLang plus the
   * longest completion (10k tokens at tens of tokens/s).
   */
  requestTimeoutMs: number;
  /** Deadline of health, abort and info calls. Default 10 000. */
  controlTimeoutMs?: number;
  /**
   * `model` sent to `/v1/chat/completions`. SGLang serves one model and ignores the name
   * (except `base:adapter` for LoRA). Default `default`, SGLang's own default name.
   */
  chatModel?: string;
  /**
   * Sent as `Authorization: Bearer <apiKey>` on every request (SGLang's `--api-key`). Never
   * logged.
   */
  apiKey?: string;
  /** Default: the `sglang-client` component logger, bound to the endpoint. */
  logger?: Logger;
}

/** A `/generate` request: rendered prompt ids in, completion ids out. */
export interface SglangGenerateRequest {
  inputIds: number[];
  /** Most tokens to generate, sent as `sampling_params.max_new_tokens`. */
  maxNewTokens: number;
  /** The other sampling parameters, sent in `sampling_params` as they are. */
  samplingParams?: SglangSamplingOptions;
  /** Request id, unique among requests in flight on this server; `/abort_request` uses it. */
  rid: string;
  /** Aborting it rejects with `CancelledError` and aborts the request on the server too. */
  signal?: AbortSignal;
  /**
   * When given, the response is streamed (`stream: true`) and this is told the completion
   * tokens produced so far at each event; the result is the last event's (the complete output,
   * or the partial one when the request was aborted with `/abort_request`).
   */
  onProgress?: (completionTokens: number) => void;
}

/** A `/v1/chat/completions` request (SGLang applies the chat template). */
export interface SglangChatRequest {
  messages: readonly ChatMessageInput[];
  /** Most tokens to generate, sent as `max_tokens`. */
  maxNewTokens: number;
  /** The other sampling parameters, sent under their own names. */
  samplingParams?: SglangSamplingOptions;
  rid: string;
  signal?: AbortSignal;
  /** Passed as `chat_template_kwargs`, e.g. `{ enable_thinking: false }`. */
  chatTemplateKwargs?: Record<string, unknown>;
}

/** Result of a health probe; never an exception. */
export interface HealthResult {
  ok: boolean;
  /** HTTP status, when the server answered. */
  status?: number;
  /** Why it is not ok: SGLang's message, or the connection error. */
  error?: string;
  /**
   * The endpoint answered with an endpoint-level status (401, 403, 404, …; see
   * `EndpointMisconfiguredError`): waiting will not fix it, its configuration must change.
   */
  misconfigured?: boolean;
}

interface SendOptions {
  pool: Pool;
  method: 'GET' | 'POST';
  path: string;
  body?: unknown;
  timeoutMs: number;
  signal?: AbortSignal | undefined;
  /** For generation requests: aborted on the server when the call is cancelled or times out. */
  rid?: string;
  /** Read the body as server-sent events: each `data:` payload is told here, the last one returned. */
  onEvent?: (data: string) => void;
}

interface RawResponse {
  status: number;
  text: string;
  context: SglangRequestContext;
}

const DEFAULT_CONTROL_TIMEOUT_MS = 10_000;
const CONTROL_CONNECTIONS = 4;
const MAX_CONNECT_TIMEOUT_MS = 10_000;
/** undici's own header/body timers sit just behind our deadline, as a backstop. */
const UNDICI_TIMEOUT_MARGIN_MS = 1_000;

/**
 * Client for one SGLang endpoint. Create one per endpoint and share it; call {@link close}
 * when done.
 */
export class SglangClient {
  /** The endpoint's base URL, without a trailing slash. */
  readonly endpoint: string;
  readonly concurrency: number;
  readonly requestTimeoutMs: number;
  readonly controlTimeoutMs: number;

  private readonly basePath: string;
  private readonly chatModel: string;
  private readonly authorization: string | undefined;
  /**
   * SGLang exempts `/health*` from `--api-key`, so a health check alone cannot see a missing or
   * wrong key: until an authenticated route has answered, {@link healthGenerate} also checks
   * one. Needed with a key (is it the right one?) and after an endpoint-level answer.
   */
  private accessCheckNeeded: boolean;
  private readonly log: Logger;
  private readonly pool: Pool;
  private readonly controlPool: Pool;
  private readonly pendingAborts = new Set<Promise<void>>();
  /** One 'abort' listener per caller signal, however many requests share it. */
  private readonly signalCallbacks = new WeakMap<AbortSignal, Set<() => void>>();
  private generationsInFlight = 0;
  private closing: Promise<void> | undefined;

  constructor(options: SglangClientOptions) {
    const url = parseEndpoint(options.endpoint);
    if (!Number.isInteger(options.concurrency) || options.concurrency < 1) {
      throw new ConfigError([
        { path: 'concurrency', message: `expected a positive integer, got ${options.concurrency}` },
      ]);
    }
    if (!(options.requestTimeoutMs > 0)) {
      throw new ConfigError([
        { path: 'requestTimeoutMs', message: `expected a positive number, got ${options.requestTimeoutMs}` },
      ]);
    }
    this.basePath = url.pathname.replace(/\/+$/, '');
    this.endpoint = `${url.origin}${this.basePath}`;
    this.concurrency = options.concurrency;
    this.requestTimeoutMs = options.requestTimeoutMs;
    this.controlTimeoutMs = options.controlTimeoutMs ?? DEFAULT_CONTROL_TIMEOUT_MS;
    this.chatModel = options.chatModel ?? 'default';
    if (options.apiKey !== undefined && (options.apiKey === '' || /[\r\n]/.test(options.apiKey))) {
      throw new ConfigError([{ path: 'apiKey', message: 'expected a non-empty key without line breaks' }]);
    }
    this.authorization = options.apiKey === undefined ? undefined : `Bearer ${options.apiKey}`;
    this.accessCheckNeeded = options.apiKey !== undefined;
    this.log = options.logger ?? componentLogger('sglang-client', { endpoint: this.endpoint });

    this.pool = new Pool(url.origin, {
      connections: this.concurrency,
      pipelining: 1,
      headersTimeout: this.requestTimeoutMs + UNDICI_TIMEOUT_MARGIN_MS,
      bodyTimeout: this.requestTimeoutMs + UNDICI_TIMEOUT_MARGIN_MS,
      connect: { timeout: Math.min(MAX_CONNECT_TIMEOUT_MS, this.requestTimeoutMs) },
    });
    this.controlPool = new Pool(url.origin, {
      connections: CONTROL_CONNECTIONS,
      pipelining: 1,
      headersTimeout: this.controlTimeoutMs + UNDICI_TIMEOUT_MARGIN_MS,
      bodyTimeout: this.controlTimeoutMs + UNDICI_TIMEOUT_MARGIN_MS,
      connect: { timeout: Math.min(MAX_CONNECT_TIMEOUT_MS, this.controlTimeoutMs) },
    });
  }

  /** Generation requests (`generate` + `chat`) currently in flight, queued locally or not. */
  get inFlight(): number {
    return this.generationsInFlight;
  }

  /**
   * `POST /generate` with token ids. Resolves with the completion, including a completion
   * SGLang ended with `finish_reason.type == "abort"` (the caller decides what that means);
   * rejects with a typed error (see the module comment).
   */
  async generate(req: SglangGenerateRequest): Promise<GenerateResult> {
    const onProgress = req.onProgress;
    const res = await this.sendGeneration({
      path: '/generate',
      body: {
        input_ids: req.inputIds,
        sampling_params: { ...req.samplingParams, max_new_tokens: req.maxNewTokens },
        rid: req.rid,
        stream: onProgress !== undefined,
      },
      signal: req.signal,
      rid: req.rid,
      ...(onProgress === undefined ? {} : { onEvent: (data: string) => reportCompletionTokens(data, onProgress) }),
    });
    // An error in the middle of a stream comes as an event on HTTP 200.
    if (onProgress !== undefined && res.text.startsWith('{"error"')) {
      const error = classifyResponse(500, res.text, res.context);
      if (error !== null) throw error;
    }
    const result = this.parseBody(res, parseGenerateResponse);
    if (result.droppedLeadingIds > 0) {
      this.log.debug(
        { rid: req.rid, droppedLeadingIds: result.droppedLeadingIds },
        'output_ids longer than completion_tokens; kept the last completion_tokens ids',
      );
    }
    return result;
  }

  /**
   * `POST /v1/chat/completions` (non-streamed). `maxNewTokens` is sent as `max_tokens`, the
   * other parameters under their own names.
   */
  async chat(req: SglangChatRequest): Promise<ChatResult> {
    const body: Record<string, unknown> = {
      ...req.samplingParams,
      model: this.chatModel,
      messages: req.messages,
      max_tokens: req.maxNewTokens,
      rid: req.rid,
      stream: false,
    };
    if (req.chatTemplateKwargs !== undefined) body['chat_template_kwargs'] = req.chatTemplateKwargs;
    const res = await this.sendGeneration({ path: '/v1/chat/completions', body, signal: req.signal, rid: req.rid });
    return this.parseBody(res, parseChatResponse);
  }

  /**
   * `POST /abort_request {rid}`: asks SGLang to stop a request and free its slot. Best effort:
   * never throws (the request may have finished already, or the server may be down).
   */
  async abort(rid: string): Promise<void> {
    try {
      const res = await this.send({
        pool: this.controlPool,
        method: 'POST',
        path: '/abort_request',
        body: { rid },
        timeoutMs: this.controlTimeoutMs,
      });
      if (res.status < 200 || res.status >= 300) {
        this.log.debug({ rid, status: res.status, body: sglangErrorMessage(res.text) }, 'abort_request refused');
      }
    } catch (e: unknown) {
      this.log.debug({ rid, err: e }, 'abort_request failed');
    }
  }

  /**
   * `GET /health_generate`: ok when SGLang can generate (200). Never throws. While access has
   * not been confirmed (an API key is configured, or a request got an endpoint-level answer),
   * it first checks an authenticated route (`GET /model_info`): a 401/403/404 there is
   * reported as not ok, `misconfigured: true`, with a message naming the status and what to
   * check.
   */
  async healthGenerate(): Promise<HealthResult> {
    if (this.accessCheckNeeded) {
      const access = await this.checkAccess();
      if (!access.ok) return access;
    }
    return this.probe('/health_generate');
  }

  /**
   * Whether this client may use the endpoint: `GET /model_info` (then the old
   * `/get_model_info` on 404) answers something other than an endpoint-level 4xx. SGLang's
   * `--api-key` guards it, unlike `/health`. Never throws.
   */
  async checkAccess(): Promise<HealthResult> {
    try {
      let res = await this.send({
        pool: this.controlPool,
        method: 'GET',
        path: '/model_info',
        timeoutMs: this.controlTimeoutMs,
      });
      if (res.status === 404) {
        res = await this.send({
          pool: this.controlPool,
          method: 'GET',
          path: '/get_model_info',
          timeoutMs: this.controlTimeoutMs,
        });
      }
      if (isEndpointLevelStatus(res.status)) {
        this.accessCheckNeeded = true;
        const e = new EndpointMisconfiguredError(res.status, res.context, sglangErrorMessage(res.text));
        return { ok: false, status: res.status, error: e.message, misconfigured: true };
      }
      if (res.status >= 200 && res.status < 300) this.accessCheckNeeded = false;
      return { ok: true, status: res.status };
    } catch (e: unknown) {
      return { ok: false, error: errorMessage(e) };
    }
  }

  /** `GET /health`: ok when the server process answers 200. Never throws. */
  health(): Promise<HealthResult> {
    return this.probe('/health');
  }

  /** `GET /model_info`, falling back to the old `/get_model_info` on 404. */
  modelInfo(): Promise<ModelInfo> {
    return this.getInfo(['/model_info', '/get_model_info'], parseModelInfo);
  }

  /** `GET /server_info`, falling back to the old `/get_server_info` on 404. */
  serverInfo(): Promise<ServerInfo> {
    return this.getInfo(['/server_info', '/get_server_info'], parseServerInfo);
  }

  /** Load per data-parallel rank: `GET /get_load`, falling back to `/v1/loads` on 404. */
  getLoad(): Promise<LoadInfo[]> {
    return this.getInfo(['/get_load', '/v1/loads'], parseLoad);
  }

  /**
   * Stops the client: waits for pending `/abort_request` calls, then closes both pools once
   * their requests have finished. To stop sooner, abort in-flight generations through their
   * signals before calling it (they are then aborted on the server too), or call
   * {@link destroy}. Generations cancelled after `close()` are not aborted on the server.
   */
  close(): Promise<void> {
    this.closing ??= (async () => {
      await Promise.allSettled([...this.pendingAborts]);
      await Promise.all([this.pool.close(), this.controlPool.close()]);
    })();
    return this.closing;
  }

  /** Closes both pools at once; requests in flight reject with `CancelledError`. */
  async destroy(): Promise<void> {
    this.closing ??= Promise.resolve();
    await Promise.all([this.pool.destroy(), this.controlPool.destroy()]);
  }

  // -------------------------------------------------------------------------------------------

  private async sendGeneration(options: {
    path: string;
    body: unknown;
    signal: AbortSignal | undefined;
    rid: string;
    onEvent?: (data: string) => void;
  }): Promise<RawResponse> {
    this.generationsInFlight += 1;
    // Per-endpoint latency and errors for the dashboard and /metrics (request-stats.ts).
    const startedMs = Date.now();
    recordRequestStarted(this.endpoint);
    let res: RawResponse | undefined;
    try {
      res = await this.send({
        pool: this.pool,
        method: 'POST',
        path: options.path,
        body: options.body,
        timeoutMs: this.requestTimeoutMs,
        signal: options.signal,
        rid: options.rid,
        ...(options.onEvent === undefined ? {} : { onEvent: options.onEvent }),
      });
      const error = classifyResponse(res.status, res.text, res.context);
      if (error instanceof EndpointMisconfiguredError && !this.accessCheckNeeded) {
        // Once per episode, not once per request in the window.
        this.accessCheckNeeded = true;
        this.log.error({ status: error.status, route: error.route }, error.message);
      }
      if (error !== null) throw error;
      return res;
    } catch (e: unknown) {
      if (res === undefined) {
        const failure =
          e instanceof CancelledError ? 'cancelled' : e instanceof TimeoutError ? 'timeout' : 'connection';
        recordGenerationRequest(this.endpoint, { failure }, Date.now() - startedMs);
      }
      throw e;
    } finally {
      if (res !== undefined) recordGenerationRequest(this.endpoint, { status: res.status }, Date.now() - startedMs);
      this.generationsInFlight -= 1;
    }
  }

  /**
   * One HTTP exchange under a deadline and an optional caller signal. Resolves with any status;
   * rejects with a typed error when no complete response arrived.
   */
  private async send(options: SendOptions): Promise<RawResponse> {
    const context: SglangRequestContext = { endpoint: this.endpoint, route: `${options.method} ${options.path}` };
    if (options.signal?.aborted === true) {
      throw new CancelledError(`${context.route} cancelled before it was sent`, { cause: options.signal.reason });
    }
    const controller = new RequestAbort();
    let outcome: 'timeout' | 'cancelled' | undefined;
    const timer = setTimeout(() => {
      outcome ??= 'timeout';
      controller.abort();
    }, options.timeoutMs);
    const onCancel = (): void => {
      outcome ??= 'cancelled';
      controller.abort();
    };
    const unsubscribe = options.signal === undefined ? undefined : this.onCallerAbort(options.signal, onCancel);

    try {
      const headers: Record<string, string> = { accept: 'application/json' };
      if (options.body !== undefined) headers['content-type'] = 'application/json';
      if (this.authorization !== undefined) headers['authorization'] = this.authorization;
      const res = await options.pool.request({
        path: `${this.basePath}${options.path}`,
        method: options.method,
        headers,
        body: options.body === undefined ? null : JSON.stringify(options.body),
        signal: controller,
      });
      const text =
        options.onEvent !== undefined && res.statusCode === 200
          ? await readEvents(res.body, options.onEvent)
          : await res.body.text();
      return { status: res.statusCode, text, context };
    } catch (e: unknown) {
      throw this.failure(e, outcome, options, context);
    } finally {
      clearTimeout(timer);
      unsubscribe?.();
    }
  }

  private failure(
    e: unknown,
    outcome: 'timeout' | 'cancelled' | undefined,
    options: SendOptions,
    context: SglangRequestContext,
  ): AppError {
    if (outcome === 'cancelled') {
      if (options.rid !== undefined) this.abortInBackground(options.rid);
      return new CancelledError(`${context.route} to ${context.endpoint} cancelled`, {
        cause: options.signal?.reason ?? e,
      });
    }
    if (outcome === 'timeout') {
      if (options.rid !== undefined) this.abortInBackground(options.rid);
      return new TimeoutError(
        `${context.route} to ${context.endpoint} got no complete response within ${options.timeoutMs} ms`,
        { cause: e },
      );
    }
    const error = classifyTransportError(e, context);
    if (error instanceof TimeoutError && options.rid !== undefined) this.abortInBackground(options.rid);
    return error;
  }

  /**
   * Calls `callback` when `signal` aborts; returns the unsubscribe function. A worker passes
   * one shutdown signal to every request: a listener each would pile up (and trip Node's
   * max-listeners warning), so each signal gets a single listener that fans out.
   */
  private onCallerAbort(signal: AbortSignal, callback: () => void): () => void {
    let callbacks = this.signalCallbacks.get(signal);
    if (callbacks === undefined) {
      const set = new Set<() => void>();
      callbacks = set;
      this.signalCallbacks.set(signal, set);
      signal.addEventListener(
        'abort',
        () => {
          for (const cb of [...set]) cb();
          set.clear();
        },
        { once: true },
      );
    }
    const set = callbacks;
    set.add(callback);
    return () => {
      set.delete(callback);
    };
  }

  /** Sends `/abort_request` without making the caller wait; {@link close} waits for it. */
  private abortInBackground(rid: string): void {
    if (this.closing !== undefined) return;
    const p = this.abort(rid).finally(() => this.pendingAborts.delete(p));
    this.pendingAborts.add(p);
  }

  private parseBody<T>(res: RawResponse, parse: (body: unknown) => ParseOutcome<T>): T {
    let body: unknown;
    try {
      body = JSON.parse(res.text);
    } catch (e: unknown) {
      const head = res.text.length > 80 ? `${res.text.slice(0, 80)}…` : res.text;
      throw new SglangResponseFormatError(
        `body is not JSON (${errorMessage(e)}): ${JSON.stringify(head)}`,
        {
          ...res.context,
          status: res.status,
        },
        { cause: e },
      );
    }
    const parsed = parse(body);
    if (!parsed.ok) {
      throw new SglangResponseFormatError(parsed.problem, { ...res.context, status: res.status });
    }
    return parsed.value;
  }

  private async probe(path: string): Promise<HealthResult> {
    try {
      const res = await this.send({ pool: this.controlPool, method: 'GET', path, timeoutMs: this.controlTimeoutMs });
      if (res.status >= 200 && res.status < 300) return { ok: true, status: res.status };
      if (isEndpointLevelStatus(res.status)) {
        this.accessCheckNeeded = true;
        const e = new EndpointMisconfiguredError(res.status, res.context, sglangErrorMessage(res.text));
        return { ok: false, status: res.status, error: e.message, misconfigured: true };
      }
      const said = sglangErrorMessage(res.text);
      return {
        ok: false,
        status: res.status,
        error: `${res.context.route} on ${this.endpoint} answered ${res.status}${said === undefined ? '' : `: ${said}`}`,
      };
    } catch (e: unknown) {
      return { ok: false, error: errorMessage(e) };
    }
  }

  /** GETs the first path that exists (404 moves on to the next), parsed. */
  private async getInfo<T>(paths: readonly string[], parse: (body: unknown) => ParseOutcome<T>): Promise<T> {
    const [first = '/', ...fallbacks] = paths;
    let last = await this.send({
      pool: this.controlPool,
      method: 'GET',
      path: first,
      timeoutMs: this.controlTimeoutMs,
    });
    for (const path of fallbacks) {
      if (last.status !== 404) break;
      last = await this.send({ pool: this.controlPool, method: 'GET', path, timeoutMs: this.controlTimeoutMs });
    }
    const error = classifyResponse(last.status, last.text, last.context);
    if (error !== null) throw error;
    return this.parseBody(last, parse);
  }
}

/**
 * Reads a server-sent event stream, telling each `data:` payload (but `[DONE]`) to `onEvent`;
 * returns the last one. Holds one event at a time: SGLang repeats the cumulative output in
 * every event, so keeping the whole stream would grow with the square of the length.
 */
async function readEvents(
  body: AsyncIterable<Buffer | string> & { setEncoding(e: BufferEncoding): unknown },
  onEvent: (data: string) => void,
): Promise<string> {
  body.setEncoding('utf8');
  let pending = '';
  let last = '';
  for await (const chunk of body) {
    pending += typeof chunk === 'string' ? chunk : chunk.toString('utf8');
    let nl = pending.indexOf('\n');
    while (nl >= 0) {
      const line = pending.slice(0, nl).replace(/\r$/, '');
      pending = pending.slice(nl + 1);
      if (line.startsWith('data:')) {
        const data = line.slice(5).trim();
        if (data !== '[DONE]' && data !== '') {
          last = data;
          onEvent(data);
        }
      }
      nl = pending.indexOf('\n');
    }
  }
  const tail = pending.trim();
  if (tail.startsWith('data:')) {
    const data = tail.slice(5).trim();
    if (data !== '[DONE]' && data !== '') last = data;
  } else if (last === '' && tail !== '') {
    last = tail;
  }
  return last;
}

/** Finds `meta_info.completion_tokens` in a streamed event without parsing the whole output. */
function reportCompletionTokens(data: string, onProgress: (completionTokens: number) => void): void {
  const at = data.lastIndexOf('"completion_tokens"');
  if (at < 0) return;
  const m = /^"completion_tokens"\s*:\s*(\d+)/.exec(data.slice(at, at + 40));
  if (m?.[1] !== undefined) onProgress(Number(m[1]));
}

/**
 * What undici watches to abort one request (it takes an EventEmitter as well as an
 * AbortSignal): a request's deadline and cancellation cost a listener on an emitter, not an
 * AbortController's EventTarget, several times dearer per request.
 */
class RequestAbort extends EventEmitter {
  aborted = false;
  reason: Error | undefined;

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = new Error('request aborted');
    this.emit('abort');
  }
}

function parseEndpoint(endpoint: string): URL {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch (e: unknown) {
    throw new ConfigError([
      { path: 'endpoint', message: `not a URL: ${JSON.stringify(endpoint)} (${errorMessage(e)})` },
    ]);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ConfigError([{ path: 'endpoint', message: `expected an http(s) URL, got ${JSON.stringify(endpoint)}` }]);
  }
  if (url.search !== '' || url.hash !== '') {
    throw new ConfigError([
      { path: 'endpoint', message: `expected no query or fragment, got ${JSON.stringify(endpoint)}` },
    ]);
  }
  return url;
}
