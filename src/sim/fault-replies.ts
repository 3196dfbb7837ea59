/**
 * Answers of the injected faults that need no request state: SGLang's 500 and 503 bodies, a
 * dropped connection, a status for every route (a proxy or a wrong base path), and the bad
 * answer shapes of the bad-input catalogue.
 */
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

import { isRecord } from '../shared/index.js';
import type { BadAnswer } from './faults.js';
import { sendJson, sendText } from './http-util.js';

/** SGLang's body for a full queue (`--max-queued-requests`), status 503. */
export const QUEUE_FULL_BODY = {
  object: 'error',
  message: 'The request queue is full.',
  type: '503',
  param: null,
  code: 503,
};

/** The output id the `out-of-vocab` bad answer puts first. */
export const OUT_OF_VOCAB_ID = 999_999_999;

/** What nginx in front of a dead upstream answers. */
const HTML_502 =
  '<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n';

/** Destroys the request's connection without an answer (RST when the platform can). */
export function dropConnection(req: IncomingMessage): void {
  const socket = req.socket as Socket & { resetAndDestroy?: () => Socket };
  if (typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
  else socket.destroy();
}

/** SGLang's answer when the scheduler aborts a request (500). */
export function replyServerError(res: ServerResponse): void {
  sendJson(res, 500, {
    object: 'error',
    message: 'Out of memory even after retracting all other requests in the decode batch. Aborting the request.',
    type: '500',
    param: null,
    code: 500,
  });
}

export function replyQueueFull(res: ServerResponse): void {
  sendJson(res, 503, QUEUE_FULL_BODY);
}

/**
 * `statusAll`: the status with the body a proxy or FastAPI gives it: 401
 * `{"detail":"Unauthorized"}`, 404 `{"detail":"Not Found"}`, 502 nginx's HTML page, 503
 * SGLang's full-queue body, others `{"detail": <reason>}`.
 */
export function replyStatus(res: ServerResponse, status: number): void {
  if (status === 502) {
    sendText(res, 502, HTML_502, 'text/html');
    return;
  }
  if (status === 503) {
    replyQueueFull(res);
    return;
  }
  sendJson(res, status, { detail: STATUS_CODES[status] ?? `HTTP ${status}` });
}

/** Applies a bad-answer shape to a complete, valid response body (generate or chat). */
function reshape(kind: 'wrong-shape' | 'no-output-ids' | 'negative-count' | 'out-of-vocab', body: unknown): unknown {
  const items = Array.isArray(body) ? body : [body];
  const out = items.map((item: unknown) => {
    if (!isRecord(item)) return item;
    const copy = structuredClone(item);
    const meta = isRecord(copy.meta_info) ? copy.meta_info : undefined;
    const usage = isRecord(copy.usage) ? copy.usage : undefined;
    switch (kind) {
      case 'wrong-shape':
        // An OpenAI text completion where a native /generate answer belongs.
        return {
          id: 'cmpl-0',
          object: 'text_completion',
          choices: [{ index: 0, text: String(copy.text ?? ''), finish_reason: 'stop' }],
        };
      case 'no-output-ids':
        delete copy.output_ids;
        delete copy.choices;
        return copy;
      case 'negative-count':
        if (meta !== undefined) meta.completion_tokens = -1;
        if (usage !== undefined) usage.completion_tokens = -1;
        return copy;
      case 'out-of-vocab':
        // A well-formed answer whose first output id is no token of any real vocabulary.
        if (Array.isArray(copy.output_ids) && copy.output_ids.length > 0) copy.output_ids[0] = OUT_OF_VOCAB_ID;
        return copy;
    }
  });
  return Array.isArray(body) ? out : out[0];
}

/** Answers with a bad-answer shape; `fullBody` builds the valid answer it is derived from. */
export function replyBadAnswer(res: ServerResponse, kind: BadAnswer, fullBody: () => unknown): void {
  switch (kind) {
    case 'html502':
      sendText(res, 502, HTML_502, 'text/html');
      return;
    case '413':
      sendJson(res, 413, { detail: 'Request Entity Too Large' });
      return;
    case 'truncated':
      replyTruncated(res, fullBody());
      return;
    default:
      sendJson(res, 200, reshape(kind, fullBody()));
  }
}

/** 200 with the first 60 % of a JSON body. */
export function replyTruncated(res: ServerResponse, body: unknown): void {
  const text = JSON.stringify(body);
  sendText(res, 200, text.slice(0, Math.max(1, Math.floor(text.length * 0.6))), 'application/json');
}
