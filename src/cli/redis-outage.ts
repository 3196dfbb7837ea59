import { errorMessage, formatDuration, newIoredis, redactRedisUrl, withTimeout } from '../shared/index.js';

/** Options of {@link watchRedisOutage}. */
export interface RedisOutageOptions {
  /** How often Redis is asked (ms). Default 1 s. */
  probeIntervalMs?: number;
  /** How long a PING may take before Redis counts as not answering (ms). Default 3 s. */
  probeTimeoutMs?: number;
  /** While Redis stays away, the reminder's period (ms). Default 30 s. */
  remindEveryMs?: number;
  /** What the process does meanwhile, said in the first line. */
  waiting?: string;
  /** Where the lines go. Default stderr. */
  write?: (line: string) => void;
}

/**
 * Watches the run's Redis from its own connection and tells a person when it is gone: one line
 * when it stops answering, one every `remindEveryMs` while it stays away, one when it is back.
 * Everything else of the process waits for Redis on its own connections; this only reports.
 * Returns the stop function.
 */
export function watchRedisOutage(url: string, options: RedisOutageOptions = {}): () => Promise<void> {
  const probeIntervalMs = options.probeIntervalMs ?? 1_000;
  const probeTimeoutMs = options.probeTimeoutMs ?? 3_000;
  const remindEveryMs = options.remindEveryMs ?? 30_000;
  const write = options.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const shown = redactRedisUrl(url);
  const conn = newIoredis(url, {
    lazyConnect: true,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    connectTimeout: probeTimeoutMs,
    retryStrategy: () => probeIntervalMs,
    connectionName: 'tokenmill:outage-watch',
  });
  let lastError: unknown;
  conn.on('error', (e: unknown) => {
    lastError = e;
  });
  conn.connect().catch(() => undefined);

  let downSince: number | undefined;
  let remindedAt = 0;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;

  const probe = async (): Promise<void> => {
    let answered = false;
    let reason = '';
    try {
      if ((await withTimeout(conn.ping(), probeTimeoutMs)) === 'timeout') {
        throw new Error(`no answer within ${formatDuration(probeTimeoutMs / 1000)}`);
      }
      answered = true;
    } catch (e: unknown) {
      reason = errorMessage(lastError ?? e);
    }
    if (stopped) return;
    const now = Date.now();
    if (answered) {
      if (downSince !== undefined)
        write(`tokenmill: Redis at ${shown} is back after ${formatDuration((now - downSince) / 1000)}; carrying on`);
      downSince = undefined;
      lastError = undefined;
      return;
    }
    if (downSince === undefined) {
      downSince = now;
      remindedAt = now;
      write(
        `tokenmill: Redis at ${shown} is not answering (${reason}); ${options.waiting ?? 'waiting for it to come back'} (stop with Ctrl-C or SIGTERM)`,
      );
    } else if (now - remindedAt >= remindEveryMs) {
      remindedAt = now;
      write(
        `tokenmill: Redis at ${shown} still not answering after ${formatDuration((now - downSince) / 1000)} (${reason})`,
      );
    }
  };

  const loop = (): void => {
    timer = setTimeout(() => {
      void probe().finally(() => {
        if (!stopped) loop();
      });
    }, probeIntervalMs);
    timer.unref();
  };
  loop();

  return async () => {
    stopped = true;
    clearTimeout(timer);
    conn.disconnect();
  };
}
