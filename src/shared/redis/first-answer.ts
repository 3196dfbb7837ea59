/**
 * The server's first answer, bounded. A port that accepts TCP but never answers (a frozen Redis,
 * a TLS-only port, another service) would otherwise leave a process waiting in silence: ioredis's
 * `connectTimeout` ends at the TCP handshake and its ready check has no deadline.
 *
 * - {@link openAnswering}: a PING with a deadline whose failure names the URL and what to
 *   check (every process opens its Redis through it, in `openRedis`);
 * - {@link reportSilentServer}: long-lived connections that wait for Redis by design say so in a
 *   log line, once and then every minute, while a connected server does not answer.
 */
import type { Redis } from 'ioredis';
import { UnavailableError, errorMessage } from '../errors.js';
import type { Logger } from '../logger.js';
import { delay, withTimeout } from '../util/index.js';
import { redactRedisUrl } from './target.js';

/** How long the first PING may take before the server counts as not answering. */
export const FIRST_ANSWER_TIMEOUT_MS = 10_000;
/** A connected server silent this long is reported, then every {@link SILENT_REPORT_INTERVAL_MS}. */
const SILENT_REPORT_AFTER_MS = 15_000;
const SILENT_REPORT_INTERVAL_MS = 60_000;
/** While Redis loads its data set it answers `LOADING`: that is reported this often. */
const LOADING_REPORT_INTERVAL_MS = 30_000;
/** Pause between PINGs whose connection closed before the server said anything. */
const RETRY_PAUSE_MS = 250;

/** `Protocol error, got "<" as reply type byte. Please report this.` → `Protocol error, got "<"`. */
function protocolError(e: unknown): string | undefined {
  if (!(e instanceof Error) || e.name !== 'ParserError') return undefined;
  const m = /^Protocol error, got (".*?") as reply type byte/.exec(e.message);
  return m === null ? e.message.replace(/\. Please report this\.$/, '') : `Protocol error, got ${m[1]}`;
}

/** What one connection's attempts learned, carried over to the next connection. */
interface AnswerState {
  connected: boolean;
  protocol: string | undefined;
  lastError: unknown;
}

/**
 * Opens connections with `open` until the server answers a PING, within `timeoutMs` in all, and
 * returns the one that did. An error reply other than a refused password counts as an answer (it
 * speaks RESP); `LOADING` is waited out with a line every 30 s. A server that accepts connections
 * and closes them before saying anything (one that resets them, or answers and closes before its
 * bytes arrive) is tried on a fresh connection until the deadline: ioredis's connection is not
 * usable again after its retry limit, and the retry limit is not what the user should read.
 * Throws {@link UnavailableError} naming the URL (password masked) when the server cannot be
 * reached, stays silent, or is not Redis.
 */
export async function openAnswering(
  open: () => Redis,
  url: string,
  log: Logger,
  timeoutMs = FIRST_ANSWER_TIMEOUT_MS,
): Promise<Redis> {
  const deadline = Date.now() + timeoutMs;
  const state: AnswerState = { connected: false, protocol: undefined, lastError: undefined };
  for (;;) {
    const conn = open();
    let answered = false;
    try {
      answered = await awaitFirstAnswer(conn, url, log, deadline, timeoutMs, state);
    } finally {
      if (!answered) conn.disconnect();
    }
    if (answered) return conn;
    await delay(RETRY_PAUSE_MS);
  }
}

/**
 * PINGs until the server behind `conn` answers (true), or it closed every connection before a
 * byte and there is time left for a fresh one (false); throws as {@link openAnswering} says.
 */
async function awaitFirstAnswer(
  conn: Redis,
  url: string,
  log: Logger,
  deadline: number,
  timeoutMs: number,
  state: AnswerState,
): Promise<boolean> {
  const where = redactRedisUrl(url);
  const onConnect = (): void => {
    state.connected = true;
  };
  // A reply that is not RESP ends the wait at once: ioredis may leave the PING pending.
  let notRedis: (e: unknown) => void = () => undefined;
  const protocolSeen = new Promise<unknown>((resolve) => {
    notRedis = resolve;
  });
  const onError = (e: unknown): void => {
    state.protocol ??= protocolError(e);
    state.lastError = e;
    if (state.protocol !== undefined) notRedis(e);
  };
  conn.on('connect', onConnect);
  conn.on('error', onError);
  let loadingSince: number | undefined;
  let loadingReportedAt = 0;
  try {
    for (;;) {
      let reply: unknown;
      try {
        reply = await withTimeout(
          Promise.race([conn.ping().then(() => 'ok' as const), protocolSeen]),
          Math.max(0, deadline - Date.now()),
        );
      } catch (e: unknown) {
        reply = e;
      }
      if (reply === 'ok') return true;
      const { connected, lastError } = state;
      if (
        reply instanceof Error &&
        reply.name === 'MaxRetriesPerRequestError' &&
        connected &&
        state.protocol === undefined
      ) {
        if (Date.now() + RETRY_PAUSE_MS < deadline) return false;
        reply = 'timeout';
      }
      if (reply === 'timeout') {
        throw new UnavailableError(
          connected
            ? `Redis at ${where} accepted the connection but did not answer within ${timeoutMs / 1000} s${lastError === undefined ? '' : ` (last: ${errorMessage(lastError)})`}: check that this host and port is a Redis server (not another service), that it needs no TLS (else use rediss://), and that it is not frozen or overloaded`
            : `cannot connect to Redis at ${where} within ${timeoutMs / 1000} s${lastError === undefined ? '' : ` (${errorMessage(lastError)})`}: check that Redis runs there and that the host and port are right`,
        );
      }
      state.protocol ??= protocolError(reply);
      if (state.protocol !== undefined) {
        throw new UnavailableError(
          `cannot use Redis at ${where}: ${state.protocol}: is ${where} a Redis server? (something else answers on that port)`,
          { cause: reply },
        );
      }
      const message = errorMessage(reply);
      if (reply instanceof Error && reply.name === 'ReplyError') {
        const reason = message.replace(/\.$/, '');
        if (message.startsWith('NOAUTH')) {
          throw new UnavailableError(
            `Redis at ${where} needs a password (${reason}): put it in redis.url (redis://:<password>@host:6379/0), or in redis.password with redis.sentinels`,
            { cause: reply },
          );
        }
        if (message.startsWith('WRONGPASS')) {
          throw new UnavailableError(
            `Redis at ${where} refused the password (${reason}): check the password in the config's redis section`,
            { cause: reply },
          );
        }
        if (message.startsWith('LOADING')) {
          const now = Date.now();
          loadingSince ??= now;
          if (now - loadingReportedAt >= LOADING_REPORT_INTERVAL_MS) {
            loadingReportedAt = now;
            log.warn(
              { redis: where, waitingMs: now - loadingSince },
              `Redis at ${where} is loading its data set into memory; waiting for it`,
            );
          }
          await delay(500);
          continue;
        }
        return true;
      }
      throw new UnavailableError(`cannot use Redis at ${where}: ${errorMessage(lastError ?? reply)}`, { cause: reply });
    }
  } finally {
    conn.off('connect', onConnect);
    conn.off('error', onError);
  }
}

/**
 * Logs a warning, once after 15 s and then every minute, while `conn` is connected (TCP) but the
 * server has not answered its ready check: a wait that is otherwise silent. Stops with the
 * connection.
 */
export function reportSilentServer(conn: Redis, url: string, log: Logger): void {
  const where = redactRedisUrl(url);
  let timer: NodeJS.Timeout | undefined;
  let since = 0;
  const stop = (): void => {
    clearTimeout(timer);
    timer = undefined;
  };
  const report = (): void => {
    log.warn(
      { redis: where, silentMs: Date.now() - since },
      `Redis at ${where} accepted the connection but has not answered for ${Math.round((Date.now() - since) / 1000)} s; waiting (check that it is a Redis server, not frozen or loading a large data set)`,
    );
    timer = setTimeout(report, SILENT_REPORT_INTERVAL_MS);
    timer.unref();
  };
  conn.on('connect', () => {
    stop();
    since = Date.now();
    timer = setTimeout(report, SILENT_REPORT_AFTER_MS);
    timer.unref();
  });
  conn.on('ready', stop);
  conn.on('close', stop);
  conn.on('end', stop);
}
