/**
 * Error events of BullMQ queues and workers repeat every connection error of their Redis
 * connection, several times a second while Redis is away. {@link throttledErrorLog} keeps them
 * to one line per interval at warn (the rest at debug), so an outage is a line a person reads,
 * not a flood.
 */
import type { Logger } from '../logger.js';

/** A handler for `error` events that logs `msg` at warn at most once per `intervalMs`, otherwise at debug. */
export function throttledErrorLog(
  log: Logger,
  msg: string,
  fields: Record<string, unknown> = {},
  intervalMs = 10_000,
): (err: unknown) => void {
  let lastAt = 0;
  let skipped = 0;
  return (err: unknown) => {
    const now = Date.now();
    if (now - lastAt >= intervalMs) {
      log.warn({ ...fields, err, ...(skipped > 0 ? { repeatedSinceLast: skipped } : {}) }, msg);
      lastAt = now;
      skipped = 0;
    } else {
      skipped += 1;
      log.debug({ ...fields, err }, msg);
    }
  };
}
