/**
 * SGLang-specific errors, and the one place that decides what an HTTP status or a transport
 * failure means for the caller: fail the prompt, retry it, or wait for the endpoint.
 */
import { STATUS_CODES } from 'node:http';

import { type AppError, CancelledError, TimeoutError, UnavailableError, UpstreamHttpError } from '../errors.js';
import { isRecord } from '../util/index.js';

/** Where a request went, for error messages. */
export interface SglangRequestContext {
  /** The endpoint's base URL, e.g. `http://10.0.0.5:30000`. */
  endpoint: string;
  /** Method and path, e.g. `POST /generate`. */
  route: string;
}

/**
 * SGLang rejected the request itself (HTTP 400: prompt longer than the context, invalid
 * sampling parameters, …). Sending it again cannot help: never retryable.
 */
export class SglangBadRequestError extends UpstreamHttpError {
  /** SGLang's own message, e.g. `The input (40000 tokens) is longer than the model's context length (32768 tokens).` */
  readonly sglangMessage: string;
  /** Whether the message says the prompt (plus `max_new_tokens`) does not fit the context. */
  readonly contextLengthExceeded: boolean;

  constructor(sglangMessage: string, context: SglangRequestContext, options: { cause?: unknown } = {}) {
    super(`SGLang rejected ${context.route} (400): ${sglangMessage}`, {
      ...options,
      status: 400,
      endpoint: context.endpoint,
      retryable: false,
    });
    this.sglangMessage = sglangMessage;
    this.contextLengthExceeded = /context length|maximum context|longer than the model/i.test(sglangMessage);
  }
}

/**
 * SGLang answered 2xx with a body tokenmill cannot use: not JSON, or a required field missing
 * or of the wrong type (the message names it). Retryable: it is the server's fault, not the
 * prompt's.
 */
export class SglangResponseFormatError extends UpstreamHttpError {
  constructor(message: string, context: SglangRequestContext & { status: number }, options: { cause?: unknown } = {}) {
    super(`unusable response from ${context.endpoint} ${context.route}: ${message}`, {
      ...options,
      status: context.status,
      endpoint: context.endpoint,
      retryable: true,
    });
  }
}

const MAX_MESSAGE_CHARS = 500;

function truncate(s: string): string {
  return s.length > MAX_MESSAGE_CHARS ? `${s.slice(0, MAX_MESSAGE_CHARS)}…` : s;
}

/**
 * Extracts the human-readable message from an SGLang error body, whichever shape it has:
 * native `{"error":{"message"}}`, OpenAI `{"object":"error","message"}`, FastAPI
 * `{"detail": string | [{msg, loc}]}`, or `{"error": string}`. Falls back to the raw text
 * (truncated); `undefined` for an empty body.
 */
export function sglangErrorMessage(bodyText: string): string | undefined {
  const trimmed = bodyText.trim();
  if (trimmed === '') return undefined;
  let body: unknown;
  try {
    body = JSON.parse(trimmed);
  } catch {
    return truncate(trimmed);
  }
  if (isRecord(body)) {
    const o = body;
    const err = o['error'];
    if (err !== null && typeof err === 'object' && typeof (err as Record<string, unknown>)['message'] === 'string') {
      return truncate((err as Record<string, string>)['message'] ?? '');
    }
    if (typeof err === 'string') return truncate(err);
    if (typeof o['message'] === 'string') return truncate(o['message']);
    const detail = o['detail'];
    if (typeof detail === 'string') return truncate(detail);
    if (Array.isArray(detail)) {
      const parts = detail.map((d: unknown) => {
        if (d !== null && typeof d === 'object') {
          const item = d as { msg?: unknown; loc?: unknown };
          const loc = Array.isArray(item.loc) ? item.loc.join('.') : undefined;
          const msg = typeof item.msg === 'string' ? item.msg : JSON.stringify(d);
          return loc === undefined ? msg : `${loc}: ${msg}`;
        }
        return String(d);
      });
      return truncate(parts.join('; '));
    }
  }
  return truncate(trimmed);
}

/**
 * The endpoint refused the request for a reason of its own, not the prompt's: 401/403 (a
 * missing or wrong API key, a proxy in front of SGLang), 404 (a wrong base path), 405, or any
 * other 4xx except 400, 408, 413 and 429. Every request to this endpoint will get the same
 * answer: take the endpoint out of rotation and keep the prompts' attempts.
 *
 * It is an {@link UnavailableError} (retryable, never charged to a prompt), so a caller that
 * only knows "wait for the endpoint" already does the right thing; a caller that tells the two
 * apart can log it as an error, since no amount of waiting fixes a configuration.
 */
export class EndpointMisconfiguredError extends UnavailableError {
  /** The HTTP status the endpoint answered, e.g. 401. */
  readonly status: number;
  /** Method and path, e.g. `POST /generate`. */
  readonly route: string;
  /** What the endpoint said, when it said anything. */
  readonly serverMessage: string | undefined;

  constructor(status: number, context: SglangRequestContext, serverMessage?: string) {
    super(misconfiguredMessage(status, context, serverMessage), { endpoint: context.endpoint });
    this.status = status;
    this.route = context.route;
    this.serverMessage = serverMessage;
  }
}

/** What to check for a status that means the endpoint, not the prompt, is wrong. */
function misconfiguredHint(status: number): string {
  switch (status) {
    case 401:
      return 'check sglang.apiKey (or SGLANG_API_KEY): the server was started with --api-key and did not accept the key sent';
    case 403:
      return 'check sglang.apiKey and any proxy in front of the server';
    case 404:
      return "check the endpoint's base path in sglang.endpoints (it should be the server's root, e.g. http://host:30000)";
    case 405:
      return "check the endpoint's base path in sglang.endpoints: the route exists but not for this method, so the URL may point at another service";
    default:
      return 'check sglang.endpoints and the server version: this endpoint does not accept the request';
  }
}

function misconfiguredMessage(
  status: number,
  context: SglangRequestContext,
  serverMessage: string | undefined,
): string {
  const reason = STATUS_CODES[status];
  const said = serverMessage === undefined ? '' : ` (${serverMessage})`;
  return `SGLang endpoint ${context.endpoint} answered ${status}${reason === undefined ? '' : ` ${reason}`} to ${context.route}${said}: ${misconfiguredHint(status)}`;
}

/**
 * Whether a status says the endpoint, not the request, is wrong: every 4xx except 400 (the
 * prompt), 408 and 429 (transient) and 413 (the prompt is too large).
 */
export function isEndpointLevelStatus(status: number): boolean {
  return status >= 401 && status < 500 && status !== 408 && status !== 413 && status !== 429;
}

/**
 * What an HTTP status from SGLang means for the caller. `null` for 2xx (the body still has to
 * be parsed). Otherwise:
 * - 400 → {@link SglangBadRequestError}, never retried (the prompt itself is bad);
 * - 413 → non-retryable `UpstreamHttpError` (the request body, i.e. the prompt, is too large
 *   for the server or a proxy in front of it);
 * - 408, 429 → retryable `UpstreamHttpError` (transient, whoever sent it);
 * - other 4xx (401, 403, 404, 405, 422, …) → {@link EndpointMisconfiguredError}: the endpoint
 *   is wrong, not the prompt;
 * - 5xx, including 503 (queue full, starting, shutting down) → retryable `UpstreamHttpError`;
 * - anything else (1xx/3xx) → retryable `UpstreamHttpError`.
 */
export function classifyResponse(status: number, bodyText: string, context: SglangRequestContext): AppError | null {
  if (status >= 200 && status < 300) return null;
  const serverMessage = sglangErrorMessage(bodyText);
  const message = serverMessage ?? '(empty body)';
  if (status === 400) return new SglangBadRequestError(message, context);
  if (isEndpointLevelStatus(status)) return new EndpointMisconfiguredError(status, context, serverMessage);
  const base = { status, endpoint: context.endpoint };
  const text = `${context.endpoint} ${context.route} returned ${status}: ${message}`;
  if (status === 413) {
    return new UpstreamHttpError(
      `${text} (the request is too large for the server or a proxy in front of it: the prompt is too long to send)`,
      { ...base, retryable: false },
    );
  }
  if (status === 408 || status === 429) return new UpstreamHttpError(text, { ...base, retryable: true });
  return new UpstreamHttpError(text, { ...base, retryable: true });
}

/** Socket-level failures that mean "the endpoint cannot be reached right now". */
const UNAVAILABLE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EAI_FAIL',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'ETIMEDOUT',
  'UND_ERR_SOCKET', // "other side closed": connection dropped mid-request
  'UND_ERR_CONNECT_TIMEOUT',
]);
const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT']);
/** The client was closed or destroyed under the request: the caller is shutting down. */
const CLOSED_CODES = new Set(['UND_ERR_CLOSED', 'UND_ERR_DESTROYED']);

/** The first error code found on `err`, its `cause` chain, or an AggregateError's members. */
export function errorCode(err: unknown, depth = 0): string | undefined {
  if (depth > 5 || err === null || typeof err !== 'object') return undefined;
  const code = (err as { code?: unknown }).code;
  if (typeof code === 'string') return code;
  if (err instanceof AggregateError) {
    for (const inner of err.errors) {
      const c = errorCode(inner, depth + 1);
      if (c !== undefined) return c;
    }
  }
  return errorCode((err as { cause?: unknown }).cause, depth + 1);
}

/**
 * What a failure before any HTTP status (connect, socket, parser) means for the caller:
 * unreachable endpoint → `UnavailableError` (wait for it, do not spend the prompt's attempts);
 * undici's header/body timeout → `TimeoutError`; client closed → `CancelledError`; anything
 * else → retryable `UpstreamHttpError`.
 */
export function classifyTransportError(err: unknown, context: SglangRequestContext): AppError {
  const code = errorCode(err);
  const detail = err instanceof Error && err.message !== '' ? err.message : String(err);
  const text = `${context.route} to ${context.endpoint} failed: ${code === undefined ? '' : `${code} `}${detail}`;
  if (code !== undefined && UNAVAILABLE_CODES.has(code)) {
    return new UnavailableError(text, { endpoint: context.endpoint, cause: err });
  }
  if (code !== undefined && TIMEOUT_CODES.has(code)) return new TimeoutError(text, { cause: err });
  if (code !== undefined && CLOSED_CODES.has(code)) return new CancelledError(text, { cause: err });
  return new UpstreamHttpError(text, { endpoint: context.endpoint, retryable: true, cause: err });
}
