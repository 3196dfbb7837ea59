import { pino, type Logger, type LoggerOptions } from 'pino';

export type { Logger };

const redact: LoggerOptions['redact'] = {
  paths: [
    'redisUrl',
    '*.redisUrl',
    'password',
    '*.password',
    'authorization',
    '*.authorization',
    'headers.authorization',
    'apiKey',
    '*.apiKey',
    'sglang.apiKey',
    '*.sglang.apiKey',
  ],
  censor: '[redacted]',
};

let root: Logger | undefined;

/**
 * The process-wide root logger. Level from `createRootLogger` (CLI flags / config), JSON to
 * stderr so that stdout stays free for command output such as `status --json`.
 */
export function rootLogger(): Logger {
  root ??= createRootLogger({ level: 'info' });
  return root;
}

/** Creates (and installs) the root logger. Call once at process start. */
export function createRootLogger(options: { level?: string; destination?: number } = {}): Logger {
  root = pino(
    { level: options.level ?? 'info', base: { pid: process.pid }, ...(redact === undefined ? {} : { redact }) },
    pino.destination({ dest: options.destination ?? 2, sync: true }),
  );
  return root;
}

/** A child logger for one component, e.g. `logger('inference-worker')`. */
export function logger(component: string, bindings: Record<string, unknown> = {}): Logger {
  return rootLogger().child({ component, ...bindings });
}
