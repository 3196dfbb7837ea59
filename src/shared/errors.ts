/**
 * tokenmill's error hierarchy. Every error says whether retrying can help, so the worker
 * boundary can turn non-retryable ones into BullMQ's `UnrecoverableError`.
 */

export interface AppErrorOptions {
  cause?: unknown;
  /** Whether the same operation may succeed if tried again. */
  retryable?: boolean;
}

/** Base class of every error tokenmill throws on purpose. */
export class AppError extends Error {
  readonly retryable: boolean;

  constructor(message: string, options: AppErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.retryable = options.retryable ?? false;
  }
}

/** One problem in a config file: where it is and what was expected. */
export interface ConfigIssue {
  /** Dotted path with indices, e.g. `datasets[2].tokenBudget`; empty for the root. */
  path: string;
  message: string;
  /** 1-based line in the config file, when known. */
  line?: number;
}

/** The config is invalid; lists every problem found, each with its path. */
export class ConfigError extends AppError {
  readonly issues: readonly ConfigIssue[];
  readonly file: string | undefined;

  constructor(issues: readonly ConfigIssue[], file?: string) {
    super(ConfigError.format(issues, file));
    this.issues = issues;
    this.file = file;
  }

  static format(issues: readonly ConfigIssue[], file?: string): string {
    const where = (i: ConfigIssue): string => {
      const loc = file === undefined ? '' : i.line === undefined ? `${file}: ` : `${file}:${i.line}: `;
      return `${loc}${i.path === '' ? '(root)' : i.path}: ${i.message}`;
    };
    const head = issues.length === 1 ? 'invalid config' : `invalid config (${issues.length} problems)`;
    return `${head}\n${issues.map((i) => `  ${where(i)}`).join('\n')}`;
  }
}

/** A job payload or an input record does not match its schema: never retried. */
export class PayloadError extends AppError {
  constructor(message: string, options: Omit<AppErrorOptions, 'retryable'> = {}) {
    super(message, { ...options, retryable: false });
  }
}

/** An HTTP upstream (SGLang) answered with an error status or an unusable body. */
export class UpstreamHttpError extends AppError {
  readonly status: number | undefined;
  readonly endpoint: string;

  constructor(message: string, options: AppErrorOptions & { status?: number; endpoint: string }) {
    super(message, options);
    this.status = options.status;
    this.endpoint = options.endpoint;
  }
}

/** An operation ran past its deadline. Retryable. */
export class TimeoutError extends AppError {
  constructor(message: string, options: Omit<AppErrorOptions, 'retryable'> = {}) {
    super(message, { ...options, retryable: true });
  }
}

/**
 * A dependency cannot be reached at all (connection refused/reset, endpoint unhealthy).
 * Retryable, and it says nothing about the request itself: callers wait rather than
 * spend a prompt's attempts.
 */
export class UnavailableError extends AppError {
  readonly endpoint: string | undefined;

  constructor(message: string, options: Omit<AppErrorOptions, 'retryable'> & { endpoint?: string } = {}) {
    super(message, { ...options, retryable: true });
    this.endpoint = options.endpoint;
  }
}

/** The operation was cancelled by its caller (abort signal, shutdown). */
export class CancelledError extends AppError {
  constructor(message = 'cancelled', options: Omit<AppErrorOptions, 'retryable'> = {}) {
    super(message, { ...options, retryable: true });
  }
}

/** A required program or environment piece is missing (e.g. `redis-server` not on PATH). */
export class EnvironmentError extends AppError {
  constructor(message: string, options: Omit<AppErrorOptions, 'retryable'> = {}) {
    super(message, { ...options, retryable: false });
  }
}

/** Whether retrying the failed operation may help. Unknown errors count as retryable. */
export function isRetryable(err: unknown): boolean {
  return err instanceof AppError ? err.retryable : true;
}

/** A readable one-line message for any thrown value. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
