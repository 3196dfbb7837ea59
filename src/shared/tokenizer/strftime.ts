import { Environment } from '@huggingface/jinja';

import { AppError } from '../errors.js';

/**
 * `strftime_now` for chat templates that write the date (Llama 3.2's `Today Date: 26 Jul 2024`),
 * rendering a given moment instead of the clock's: a record's prompt rendered again (export)
 * must show the date it was generated on, not today's. Same codes and output as
 * `@huggingface/jinja`'s own `strftime_now`, which rendered the prompt when it was sent: local
 * time, `%Y %m %d %b %B %H %M %%`, any other code left as written.
 */

/** `date` formatted as `@huggingface/jinja`'s `strftime_now(format)` formats the current time. */
export function strftime(date: Date, format: string): string {
  const pad2 = (n: number): string => (n < 10 ? `0${n}` : String(n));
  return format.replace(/%[YmdbBHM%]/g, (code) => {
    switch (code) {
      case '%Y':
        return String(date.getFullYear());
      case '%m':
        return pad2(date.getMonth() + 1);
      case '%d':
        return pad2(date.getDate());
      case '%b':
        return new Intl.DateTimeFormat(undefined, { month: 'short' }).format(date);
      case '%B':
        return new Intl.DateTimeFormat(undefined, { month: 'long' }).format(date);
      case '%H':
        return pad2(date.getHours());
      case '%M':
        return pad2(date.getMinutes());
      default:
        return '%';
    }
  });
}

/** The `strftime_now` of the render in progress, when it is fixed ({@link renderingAt}). */
let fixed: ((format: unknown) => string) | undefined;
let installed = false;

/**
 * @huggingface/jinja (0.5.11) declares `strftime_now` as a global of every render, and a render's
 * variables cannot redeclare it: its `Environment.set` is wrapped once per process so that, while
 * {@link renderingAt} runs, the global it declares is the fixed one.
 */
function install(): void {
  if (installed) return;
  const proto = Environment.prototype as unknown as { set?: (name: string, value: unknown) => unknown };
  const set = proto.set;
  if (typeof set !== 'function')
    throw new AppError('@huggingface/jinja changed: Environment.set not found; tokenmill cannot fix strftime_now');
  proto.set = function (this: unknown, name: string, value: unknown): unknown {
    return set.call(this, name, name === 'strftime_now' && fixed !== undefined ? fixed : value);
  };
  installed = true;
}

/**
 * Runs `render` (a synchronous template render) with the template's `strftime_now` rendering
 * `now` instead of the clock's time; with `now` undefined, as it is.
 */
export function renderingAt<T>(now: Date | undefined, render: () => T): T {
  if (now === undefined) return render();
  install();
  const before = fixed;
  fixed = (format: unknown) => strftime(now, typeof format === 'string' ? format : String(format));
  try {
    return render();
  } finally {
    fixed = before;
  }
}
