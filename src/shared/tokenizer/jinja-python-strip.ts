// Python string semantics for chat templates rendered with @huggingface/jinja.
import { Environment, Interpreter } from '@huggingface/jinja';
import { AppError } from '../errors.js';

/** What Python's `str.strip()` removes without an argument (`str.isspace()`). */
const PY_WHITESPACE: ReadonlySet<string> = new Set(
  '\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000',
);

function pythonStrip(value: string, chars: unknown, left: boolean, right: boolean): string {
  const arg = chars as { type?: string; value?: unknown } | undefined;
  const set =
    arg === undefined || arg.type === 'NullValue' || arg.type === 'UndefinedValue'
      ? PY_WHITESPACE
      : new Set(String(arg.value));
  const cps = [...value];
  let a = 0;
  let b = cps.length;
  if (left) while (a < b && set.has(cps[a] ?? '')) a++;
  if (right) while (b > a && set.has(cps[b - 1] ?? '')) b--;
  return cps.slice(a, b).join('');
}

let installed = false;

/** The slice of @huggingface/jinja's interpreter that the `trim` filter goes through. */
interface FilterApplier {
  applyFilter(operand: unknown, filterNode: { type?: string; value?: unknown }, environment: unknown): unknown;
}

/**
 * @huggingface/jinja (0.5.11) implements `str.strip/lstrip/rstrip` as JS `trim`, ignoring the
 * `chars` argument; Qwen3's template calls `content.lstrip('\n')` and `reasoning.strip('\n')`.
 * Its `trim` filter is JS `trim()` too, which strips what Python's does not (U+FEFF) and keeps
 * what Python strips (U+0085, U+001C..U+001F); Llama 3 and Gemma 3 write every message as
 * `content | trim`. Gives all four Python's semantics (Jinja's `trim` is `str.strip()`), once
 * per process, so rendered prompts match transformers. Remove once the engine does this itself.
 */
export function installPythonStrip(): void {
  if (installed) return;
  const env = new Environment();
  const sample = env.set('s', '') as object;
  type Ctor = new (arg: unknown) => object;
  const StringValue = sample.constructor as Ctor;
  const FunctionValue = (env.set('f', () => undefined) as object).constructor as Ctor;
  let proto = Object.getPrototypeOf(sample) as object | null;
  let getter: (() => unknown) | undefined;
  while (proto !== null && getter === undefined) {
    getter = Object.getOwnPropertyDescriptor(proto, 'builtins')?.get;
    if (getter === undefined) proto = Object.getPrototypeOf(proto) as object | null;
  }
  if (proto === null || getter === undefined)
    throw new AppError(
      '@huggingface/jinja changed: string builtins not found; tokenmill cannot give strip() Python semantics',
    );
  const original = getter;
  Object.defineProperty(proto, 'builtins', {
    configurable: true,
    get(this: { value: string }): unknown {
      const map = original.call(this) as Map<string, unknown>;
      const value = this.value;
      map.set(
        'strip',
        new FunctionValue((args: unknown[]) => new StringValue(pythonStrip(value, args[0], true, true))),
      );
      map.set(
        'lstrip',
        new FunctionValue((args: unknown[]) => new StringValue(pythonStrip(value, args[0], true, false))),
      );
      map.set(
        'rstrip',
        new FunctionValue((args: unknown[]) => new StringValue(pythonStrip(value, args[0], false, true))),
      );
      return map;
    },
  });
  const interpreter = Interpreter.prototype as unknown as FilterApplier;
  const applyFilter = interpreter.applyFilter;
  if (typeof applyFilter !== 'function')
    throw new AppError(
      '@huggingface/jinja changed: Interpreter.applyFilter not found; tokenmill cannot give trim Python semantics',
    );
  interpreter.applyFilter = function (this: FilterApplier, operand, filterNode, environment): unknown {
    if (filterNode.type === 'Identifier' && filterNode.value === 'trim' && operand instanceof StringValue) {
      return new StringValue(pythonStrip((operand as { value: string }).value, undefined, true, true));
    }
    return applyFilter.call(this, operand, filterNode, environment);
  };
  installed = true;
}
