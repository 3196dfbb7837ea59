/**
 * The config's error messages: each zod issue becomes a {@link ConfigIssue} with its path
 * (`datasets[2].tokenBudget`), what was expected, what was there and, for YAML, its line; an
 * unknown key names the nearest allowed one.
 */
import type { z } from 'zod';
import type { ConfigIssue } from '../errors.js';

/** A segment of a path into the config. */
export type PathSegment = string | number;

/** Every problem of a failed parse, sorted by line. */
export function configIssues(
  root: z.core.$ZodType,
  issues: readonly z.core.$ZodIssue[],
  raw: unknown,
  lineOf: ((path: readonly PathSegment[]) => number | undefined) | undefined,
): ConfigIssue[] {
  return sortIssues(issues.flatMap((issue) => toConfigIssues(root, issue, raw, lineOf)));
}

/** `['datasets', 2, 'tokenBudget']` → `datasets[2].tokenBudget`. */
export function formatConfigPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else {
      const key = String(seg);
      if (/^[A-Za-z_$][\w$-]*$/.test(key)) out += out === '' ? key : `.${key}`;
      else out += `[${JSON.stringify(key)}]`;
    }
  }
  return out;
}

/** The value at `path` in `root`, and whether it is there at all. */
function valueAt(root: unknown, path: readonly PropertyKey[]): { present: boolean; value: unknown } {
  let cur: unknown = root;
  for (const seg of path) {
    if (typeof cur !== 'object' || cur === null || typeof seg === 'symbol' || !Object.hasOwn(cur, seg)) {
      return { present: false, value: undefined };
    }
    cur = (cur as Record<string | number, unknown>)[seg];
  }
  return { present: true, value: cur };
}

/** A short rendering of a value for "got …". */
function showValue(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null (an empty value)';
  if (typeof value === 'string') return JSON.stringify(value.length > 60 ? `${value.slice(0, 57)}...` : value);
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return String(value);
  if (Array.isArray(value)) return value.length === 0 ? 'an empty list' : `a list (${clip(JSON.stringify(value))})`;
  if (value instanceof Date) return `a date (${value.toISOString()})`;
  if (typeof value === 'object') return `a mapping (${clip(JSON.stringify(value))})`;
  return typeof value;
}

function clip(s: string | undefined): string {
  if (s === undefined) return '?';
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

const TYPE_NAMES: Record<string, string> = {
  string: 'a string',
  number: 'a number',
  int: 'an integer',
  boolean: 'true or false',
  array: 'a list',
  object: 'a mapping (key: value)',
  null: 'null',
};

/** The message for one zod issue, before "got …" is added; our schema's own messages start with "expected". */
function expectation(issue: z.core.$ZodIssue): string {
  if (issue.message.startsWith('expected ') || issue.message.startsWith('missing')) return issue.message;
  switch (issue.code) {
    case 'invalid_type':
      return `expected ${TYPE_NAMES[issue.expected] ?? issue.expected}`;
    case 'too_small': {
      const min = String(issue.minimum);
      if (issue.origin === 'array' || issue.origin === 'set')
        return `expected at least ${min} item${min === '1' ? '' : 's'}`;
      if (issue.origin === 'string') return `expected at least ${min} character${min === '1' ? '' : 's'}`;
      return `expected a number ${issue.inclusive === false ? '>' : '>='} ${min}`;
    }
    case 'too_big': {
      const max = String(issue.maximum);
      if (issue.origin === 'array' || issue.origin === 'set') return `expected at most ${max} items`;
      if (issue.origin === 'string') return `expected at most ${max} characters`;
      return `expected a number ${issue.inclusive === false ? '<' : '<='} ${max}`;
    }
    case 'invalid_value':
      return `expected ${issue.values.length === 1 ? '' : 'one of '}${issue.values.map((v) => JSON.stringify(v)).join(', ')}`;
    case 'invalid_format':
      if (issue.format === 'regex' && 'pattern' in issue) return `expected a string matching ${String(issue.pattern)}`;
      return `expected a valid ${issue.format}`;
    case 'not_multiple_of':
      return `expected a multiple of ${String(issue.divisor)}`;
    case 'invalid_union':
      return 'expected one of the allowed forms';
    default:
      return issue.message;
  }
}

function toConfigIssues(
  root: z.core.$ZodType,
  issue: z.core.$ZodIssue,
  raw: unknown,
  lineOf: ((path: readonly PathSegment[]) => number | undefined) | undefined,
): ConfigIssue[] {
  const segs = issue.path.filter((s): s is PathSegment => typeof s !== 'symbol');
  const withLine = (path: readonly PathSegment[], message: string): ConfigIssue => {
    const line = lineOf?.(path);
    return line === undefined
      ? { path: formatConfigPath(path), message }
      : { path: formatConfigPath(path), message, line };
  };

  if (issue.code === 'unrecognized_keys') {
    const allowed = allowedKeysAt(root, segs);
    return issue.keys.map((key) => {
      const near = allowed.length > 0 ? closest(key, allowed) : undefined;
      const hint =
        near !== undefined
          ? `did you mean "${near}"?`
          : allowed.length > 0
            ? `allowed keys: ${allowed.join(', ')}`
            : undefined;
      return withLine([...segs, key], `unknown key${hint === undefined ? '' : ` (${hint})`}`);
    });
  }

  if (issue.code === 'custom') return [withLine(segs, issue.message)];

  const { present, value } = valueAt(raw, segs);
  const expected = expectation(issue);
  if (!present || value === undefined) {
    return [withLine(segs, expected.startsWith('missing') ? expected : `missing: ${expected}`)];
  }
  return [withLine(segs, `${expected}, got ${showValue(value)}`)];
}

function sortIssues(issues: ConfigIssue[]): ConfigIssue[] {
  return issues
    .map((issue, i) => ({ issue, i }))
    .sort((a, b) => (a.issue.line ?? Infinity) - (b.issue.line ?? Infinity) || a.i - b.i)
    .map(({ issue }) => issue);
}

// ---------------------------------------------------------------------------------------------
// Schema introspection (unknown-key hints)
// ---------------------------------------------------------------------------------------------

/** Unwraps optional/default/prefault/nullable/pipe layers down to the schema that parses. */
function unwrapSchema(schema: z.core.$ZodType): z.core.$ZodType {
  let s = schema;
  for (;;) {
    const def = s._zod.def as { type: string; innerType?: z.core.$ZodType; in?: z.core.$ZodType };
    if (def.innerType !== undefined) s = def.innerType;
    else if (def.type === 'pipe' && def.in !== undefined) s = def.in;
    else return s;
  }
}

function allowedKeysAt(root: z.core.$ZodType, path: readonly PathSegment[]): string[] {
  let s: z.core.$ZodType = root;
  for (const seg of path) {
    s = unwrapSchema(s);
    const def = s._zod.def as { type: string; shape?: Record<string, z.core.$ZodType>; element?: z.core.$ZodType };
    if (def.type === 'object' && typeof seg === 'string' && def.shape?.[seg] !== undefined) s = def.shape[seg];
    else if (def.type === 'array' && typeof seg === 'number' && def.element !== undefined) s = def.element;
    else return [];
  }
  const def = unwrapSchema(s)._zod.def as { type: string; shape?: Record<string, unknown> };
  return def.type === 'object' && def.shape !== undefined ? Object.keys(def.shape) : [];
}

/** The allowed key nearest to `key` by edit distance, when it is near enough to be a typo. */
function closest(key: string, candidates: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDist = Infinity;
  for (const c of candidates) {
    const d = editDistance(key.toLowerCase(), c.toLowerCase());
    if (d < bestDist) {
      best = c;
      bestDist = d;
    }
  }
  return best !== undefined && bestDist <= Math.max(1, Math.floor(best.length / 3)) ? best : undefined;
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      const sub = (prev[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1);
      cur.push(Math.min((prev[j] ?? 0) + 1, (cur[j - 1] ?? 0) + 1, sub));
    }
    prev = cur;
  }
  return prev[b.length] ?? 0;
}

// ---------------------------------------------------------------------------------------------
// JSON Schema and the config reference
// ---------------------------------------------------------------------------------------------
