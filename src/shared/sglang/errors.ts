/**
 * SGLang-specific errors, and the one place that decides what an HTTP status or a transport
 * failure means for the caller: fail the prompt, retry it, or wait for the endpoint.
 */
import {
  type AppError,
  CancelledError,
  TimeoutError,
  UnavailableError,
  UpstreamHttpError,
} from '../errors.js';

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
  if (body !== null && typeof body === 'object' && !Array.isArray(body)) {
    const o = body as Record<string, unknown>;
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
 * What an HTTP status from SGLang means for the caller. `null` for 2xx (the body still has to
 * be parsed). Otherwise:
 * - 400 → {@link SglangBadRequestError}, never retried (the prompt itself is bad);
 * - 408, 429 → retryable `UpstreamHttpError` (transient, whoever sent it);
 * - other 4xx (404, 405, 422, …) → non-retryable `UpstreamHttpError` (a client/server mismatch
 *   that repeating will not fix);
 * - 5xx, including 503 (queue full, starting, shutting down) → retryable `UpstreamHttpError`;
 * - anything else (1xx/3xx) → retryable `UpstreamHttpError`.
 */
export function classifyResponse(status: number, bodyText: string, context: SglangRequestContext): AppError | null {
  if (status >= 200 && status < 300) return null;
  const message = sglangErrorMessage(bodyText) ?? '(empty body)';
  if (status === 400) return new SglangBadRequestError(message, context);
  const base = { status, endpoint: context.endpoint };
  const text = `${context.endpoint} ${context.route} returned ${status}: ${message}`;
  if (status === 408 || status === 429) return new UpstreamHttpError(text, { ...base, retryable: true });
  if (status >= 400 && status < 500) return new UpstreamHttpError(text, { ...base, retryable: false });
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
