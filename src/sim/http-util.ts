import type { IncomingMessage, ServerResponse } from 'node:http';

import { errorMessage } from '../shared/index.js';

/** Largest request body accepted (a 128k-token prompt as JSON is about 1 MB). */
export const MAX_BODY_BYTES = 64 * 1024 * 1024;

/** An HTTP answer decided while handling a request: status plus body. */
export class HttpReplyError extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
  ) {
    super(`HTTP ${status}`);
  }
}

/** SGLang's native error: `{"error":{"message":…}}`, status 400 (`_create_error_response`). */
export function nativeError(message: string, status = 400): HttpReplyError {
  return new HttpReplyError(status, { error: { message } });
}

/** SGLang's OpenAI-style error (`ErrorResponse`), as /v1/* and HTTPException answer. */
export function openAiError(message: string, status = 400, type = 'BadRequestError'): HttpReplyError {
  return new HttpReplyError(status, { object: 'error', message, type, param: null, code: status });
}

/** FastAPI's request-validation failure, which SGLang turns into a 400. */
export function validationError(message: string): HttpReplyError {
  return openAiError(message, 400, 'Bad Request');
}

export function readBody(req: IncomingMessage, limitBytes = MAX_BODY_BYTES): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limitBytes) {
        reject(openAiError('Request body too large', 413, '413'));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** Parses a body as JSON whatever its content type (SGLang's native routes do). */
export function parseJsonBody(body: Buffer, allowEmpty = false): unknown {
  const text = body.toString('utf8');
  if (text.trim() === '') {
    if (allowEmpty) return {};
    throw validationError(
      "1 validation error:\n  {'type': 'missing', 'loc': ('body',), 'msg': 'Field required', 'input': None}",
    );
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (e: unknown) {
    const reason = errorMessage(e);
    throw validationError(
      `1 validation error:\n  {'type': 'json_invalid', 'loc': ('body', 0), 'msg': 'JSON decode error', 'ctx': {'error': '${reason}'}}`,
    );
  }
}

/** The check SGLang's /v1/* routes run first: the media type must be application/json. */
export function requireJsonContentType(req: IncomingMessage): void {
  const mediaType = (req.headers['content-type'] ?? '').toLowerCase().split(';', 1)[0]?.trim();
  if (mediaType !== 'application/json') {
    throw validationError(
      "[{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only 'application/json' is allowed\", 'type': 'value_error'}]",
    );
  }
}

const COMMON_HEADERS = { server: 'uvicorn' } as const;

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, {
    ...COMMON_HEADERS,
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
  });
  res.end(text);
}

export function sendText(
  res: ServerResponse,
  status: number,
  text: string,
  contentType = 'text/plain; charset=utf-8',
): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { ...COMMON_HEADERS, 'content-type': contentType, 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export function sendEmpty(res: ServerResponse, status: number): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { ...COMMON_HEADERS, 'content-length': 0 });
  res.end();
}

export function startEventStream(res: ServerResponse): void {
  res.writeHead(200, {
    ...COMMON_HEADERS,
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
  });
  res.flushHeaders();
}

export function writeEvent(res: ServerResponse, data: unknown): void {
  if (res.destroyed || res.writableEnded) return;
  res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
}
