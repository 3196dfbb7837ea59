/**
 * tiktoken split patterns, written for Rust's `regex` / `fancy-regex` (what tiktoken compiles
 * them with), turned into an equivalent JavaScript `v`-flag regular expression.
 *
 * The two dialects differ where it matters for tokenization, so the pattern is rewritten, not
 * passed through:
 *
 * - `\s`, `\d`, `\w` are Unicode-aware in Rust (`White_Space`, `Nd`, the Unicode word class);
 *   JavaScript's are ASCII (`\d`, `\w`) or a different set (`\s` holds U+FEFF): they become the
 *   Unicode properties Rust uses;
 * - a bare script name (`\p{Han}`) is the script (not its extensions) in tiktoken's engine;
 *   JavaScript needs `\p{sc=Han}` (a bare general category or binary property is kept);
 * - `.` excludes only `\n` in Rust;
 * - Rust's class set operations (`[\p{L}\p{M}&&[^\p{Han}]]`, union binding tighter than `&&`
 *   and `--`) become `v`-flag nested classes;
 * - scoped case-insensitivity (`(?i:'s|'t)`) is expanded into classes with Rust's simple case
 *   folding (`s` also matches `ſ`, `k` also matches the Kelvin sign);
 * - `(?P<name>` becomes `(?<name>`, `\x{..}` / `\U........` become `\u{..}`, characters the
 *   `v` flag reserves are escaped.
 *
 * - possessive quantifiers (`\p{L}++`, as in tiktoken's `cl100k_base`) and atomic groups
 *   (`(?>...)`) become the atomic idiom `(?=(?<aN>X))\k<aN>`: the lookahead matches greedily
 *   once, and the backreference consumes exactly that, with no backtracking into it.
 *
 * What has no exact JavaScript equivalent (other inline flags, symmetric difference `~~`,
 * backreferences, `\b` / `\B`) is refused with an {@link EnvironmentError} naming the
 * construct and its offset.
 */
import { EnvironmentError } from '../errors.js';

/** Rust `\w`: Alphabetic, marks, decimal digits, connector punctuation, join controls. */
const WORD = '\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}';

/** Characters that must be escaped inside a `v`-flag class (syntax characters and reserved punctuators). */
const CLASS_ESCAPE = new Set('()[]{}/-\\|&!#%,:;<=>@`~^$.*+?'.split(''));
/** Characters that must be escaped outside a class in `u`/`v` mode. */
const SYNTAX = new Set('^$\\.*+?()[]{}|/'.split(''));

/** Extra members of the simple case-folding orbit of ASCII letters (Rust `(?i)`). */
const FOLD_EXTRA: Record<string, string> = { s: '\u017f', k: '\u212a' };

/** The Kimi K2 family's split pattern (from its `tokenization_kimi.py`). */
export const KIMI_K2_PATTERN = [
  '[\\p{Han}]+',
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  '\\p{N}{1,3}',
  ' ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*',
  '\\s*[\\r\\n]+',
  '\\s+(?!\\S)',
  '\\s+',
].join('|');

/** OpenAI's `o200k_base` split pattern, as tiktoken writes it. */
export const O200K_PATTERN = [
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  '\\p{N}{1,3}',
  ' ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*',
  '\\s*[\\r\\n]+',
  '\\s+(?!\\S)',
  '\\s+',
].join('|');

function isValidV(source: string): boolean {
  try {
    new RegExp(source, 'v');
    return true;
  } catch {
    return false;
  }
}

function hex(cp: number): string {
  return `\\u{${cp.toString(16)}}`;
}

/** Converts one pattern; see the module comment. */
class PatternConverter {
  #i = 0;
  /** Depth of `(?i:` groups we are in, and the group depth at which each was opened. */
  readonly #caseless: number[] = [];
  #depth = 0;
  /** Output offset where each open group starts, and whether it is atomic. */
  readonly #groups: { start: number; atomic: boolean }[] = [];
  /** Output offset where the last complete atom starts (what a quantifier applies to). */
  #atomStart = -1;
  #atomics = 0;
  #out = '';

  constructor(
    private readonly src: string,
    private readonly where: string,
  ) {}

  fail(what: string, at = this.#i): never {
    throw new EnvironmentError(
      `${this.where}: the split pattern uses ${what} at offset ${at}, which has no exact JavaScript equivalent; ` +
        'set tokenizer.pattern to an equivalent pattern without it',
    );
  }

  get caseless(): boolean {
    return this.#caseless.length > 0;
  }

  convert(): string {
    const s = this.src;
    while (this.#i < s.length) {
      const c = s[this.#i] as string;
      if (c === '\\') {
        this.atom(this.escape(false));
      } else if (c === '[') {
        this.atom(this.klass());
      } else if (c === '(') {
        const open = this.groupOpen();
        this.#groups.push({ start: this.#out.length, atomic: open === '(?>' });
        this.#out += open === '(?>' ? '(?:' : open;
        this.#atomStart = -1;
      } else if (c === ')') {
        this.#i++;
        if (this.#caseless.at(-1) === this.#depth) this.#caseless.pop();
        this.#depth--;
        const group = this.#groups.pop();
        if (group === undefined) this.fail('an unbalanced parenthesis');
        this.#out += ')';
        if (group.atomic) this.#out = this.#out.slice(0, group.start) + this.atomic(this.#out.slice(group.start));
        this.#atomStart = group.start;
      } else if (c === '|' || c === '^' || c === '$') {
        this.#i++;
        this.#out += c;
        this.#atomStart = -1;
      } else if (c === '.') {
        this.#i++;
        this.atom('[^\\n]');
      } else if (c === '{') {
        const m = /^\{(\d+)(,(\d*))?\}/.exec(s.slice(this.#i));
        if (m === null) {
          this.#i++;
          this.atom('\\{');
        } else {
          this.#i += m[0].length;
          this.quantifier(m[0]);
        }
      } else if (c === '}') {
        this.#i++;
        this.atom('\\}');
      } else if (c === '*' || c === '+' || c === '?') {
        this.#i++;
        this.quantifier(c);
      } else {
        const cp = s.codePointAt(this.#i) ?? 0;
        const ch = String.fromCodePoint(cp);
        this.#i += ch.length;
        this.atom(this.literal(ch));
      }
    }
    if (this.#depth !== 0) this.fail('an unbalanced parenthesis');
    return this.#out;
  }

  atom(source: string): void {
    this.#atomStart = this.#out.length;
    this.#out += source;
  }

  /** `X` matched atomically (see the module comment). */
  atomic(x: string): string {
    const name = `a${this.#atomics++}`;
    return `(?=(?<${name}>${x}))\\k<${name}>`;
  }

  /** A quantifier after the last atom; a possessive one (`*+`, `++`, `?+`, `{n,m}+`) makes it atomic. */
  quantifier(q: string): void {
    const at = this.#atomStart;
    if (at < 0) this.fail(`a quantifier "${q}" with nothing to repeat`);
    const next = this.src[this.#i];
    if (next === '+') {
      this.#i++;
      const repeated = this.#out.slice(at) + q;
      this.#out = this.#out.slice(0, at) + this.atomic(repeated);
    } else if (next === '?') {
      this.#i++;
      this.#out += `${q}?`;
    } else {
      this.#out += q;
    }
    this.#atomStart = -1;
  }

  literal(ch: string): string {
    if (this.caseless && /\p{L}/u.test(ch)) {
      const folded = caseFold(ch);
      if (folded.length > 1) return `[${folded.map(classChar).join('')}]`;
    }
    return SYNTAX.has(ch) ? `\\${ch}` : ch;
  }

  groupOpen(): string {
    const s = this.src;
    const rest = s.slice(this.#i);
    this.#depth++;
    for (const keep of ['(?:', '(?=', '(?!', '(?<=', '(?<!']) {
      if (rest.startsWith(keep)) {
        this.#i += keep.length;
        return keep;
      }
    }
    const named = /^\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>/.exec(rest);
    if (named !== null) {
      this.#i += named[0].length;
      return `(?<${named[1] ?? ''}>`;
    }
    if (rest.startsWith('(?i:')) {
      this.#i += 4;
      this.#caseless.push(this.#depth);
      return '(?:';
    }
    if (rest.startsWith('(?>')) {
      this.#i += 3;
      return '(?>';
    }
    if (rest.startsWith('(?')) this.fail(`the group or flag syntax "${/^\(\?[^:)]*[:)]?/.exec(rest)?.[0] ?? '(?'}"`);
    this.#i++;
    return '(';
  }

  /** An escape outside a class (`inClass` false) or inside one; returns JS source. */
  escape(inClass: boolean): string {
    const s = this.src;
    const at = this.#i;
    const e = s[at + 1];
    if (e === undefined) this.fail('a trailing backslash', at);
    this.#i += 2;
    switch (e) {
      case 's':
        return '\\p{White_Space}';
      case 'S':
        return '\\P{White_Space}';
      case 'd':
        return '\\p{Nd}';
      case 'D':
        return '\\P{Nd}';
      case 'w':
        return `[${WORD}]`;
      case 'W':
        return `[^${WORD}]`;
      case 'n':
      case 'r':
      case 't':
      case 'f':
      case 'v':
        return `\\${e}`;
      case 'p':
      case 'P':
        return this.property(e, at);
      case 'x': {
        const m = /^\{([0-9A-Fa-f]{1,6})\}|^([0-9A-Fa-f]{2})/.exec(s.slice(this.#i));
        if (m === null) this.fail('a malformed \\x escape', at);
        this.#i += m[0].length;
        return hex(parseInt(m[1] ?? m[2] ?? '0', 16));
      }
      case 'u':
      case 'U': {
        const len = e === 'u' ? 4 : 8;
        const digits = s.slice(this.#i, this.#i + len);
        if (!new RegExp(`^[0-9A-Fa-f]{${len}}$`).test(digits)) this.fail(`a malformed \\${e} escape`, at);
        this.#i += len;
        return hex(parseInt(digits, 16));
      }
      case 'A':
        return inClass ? this.fail('\\A inside a class', at) : '^';
      case 'z':
      case 'Z':
        return inClass ? this.fail(`\\${e} inside a class`, at) : '$';
      default:
        break;
    }
    if (/[0-9bBkgGKXRhHNCQE]/.test(e)) this.fail(`the escape "\\${e}"`, at);
    if (/[A-Za-z]/.test(e)) this.fail(`the escape "\\${e}"`, at);
    // An escaped literal: re-escape only where JavaScript requires it.
    const cp = s.codePointAt(at + 1) ?? 0;
    const ch = String.fromCodePoint(cp);
    this.#i = at + 1 + ch.length;
    if (inClass) return classChar(ch);
    return this.literal(ch);
  }

  property(e: string, at: number): string {
    const s = this.src;
    let name: string;
    if (s[this.#i] === '{') {
      const close = s.indexOf('}', this.#i);
      if (close < 0) this.fail('an unclosed \\p{', at);
      name = s.slice(this.#i + 1, close);
      this.#i = close + 1;
    } else {
      name = s[this.#i] ?? '';
      this.#i++;
    }
    let negate = e === 'P';
    if (name.startsWith('^')) {
      negate = !negate;
      name = name.slice(1);
    }
    const p = negate ? 'P' : 'p';
    const norm = name.replace(/[\s_-]/g, '');
    const candidates =
      name.includes('=') || name.includes(':') ? [name.replace(':', '=')] : [name, norm, `sc=${name}`, `sc=${norm}`];
    for (const c of candidates) {
      if (isValidV(`\\${p}{${c}}`)) return `\\${p}{${c}}`;
    }
    return this.fail(`the Unicode property "${name}" (unknown to JavaScript)`, at);
  }

  /** A bracketed class at the cursor (which is on `[`); returns JS `v` source. */
  klass(): string {
    const s = this.src;
    const start = this.#i;
    this.#i++;
    let negated = false;
    if (s[this.#i] === '^') {
      negated = true;
      this.#i++;
    }
    const operands: string[][] = [[]];
    const ops: string[] = [];
    let first = true;
    for (;;) {
      const c = s[this.#i];
      if (c === undefined) this.fail('an unclosed character class', start);
      if (c === ']' && !first) {
        this.#i++;
        break;
      }
      first = false;
      const current = operands.at(-1) as string[];
      const two = s.slice(this.#i, this.#i + 2);
      if (two === '&&' || two === '--') {
        this.#i += 2;
        ops.push(two);
        operands.push([]);
        continue;
      }
      if (two === '~~') this.fail('the class symmetric difference "~~"');
      if (c === '[') {
        if (s.startsWith('[:', this.#i)) this.fail('a POSIX class "[:...:]"');
        current.push(this.klass());
        continue;
      }
      let item: string;
      let cp: number | undefined;
      if (c === '\\') {
        const before = this.#i;
        item = this.escape(true);
        const lit = this.src.slice(before, this.#i);
        cp = escapedCodePoint(lit, item);
      } else {
        cp = s.codePointAt(this.#i) ?? 0;
        this.#i += String.fromCodePoint(cp).length;
        item = classChar(String.fromCodePoint(cp));
      }
      // A range `a-z` (a `-` that is not the `--` operator, between two single characters).
      if (s[this.#i] === '-' && s[this.#i + 1] !== ']' && s[this.#i + 1] !== '-' && cp !== undefined) {
        this.#i++;
        let hiItem: string;
        if (s[this.#i] === '\\') hiItem = this.escape(true);
        else {
          const hc = s.codePointAt(this.#i) ?? 0;
          this.#i += String.fromCodePoint(hc).length;
          hiItem = classChar(String.fromCodePoint(hc));
        }
        if (this.caseless) this.fail('a range inside a case-insensitive group');
        current.push(`${item}-${hiItem}`);
        continue;
      }
      if (this.caseless && cp !== undefined) {
        const ch = String.fromCodePoint(cp);
        current.push(caseFold(ch).map(classChar).join(''));
      } else {
        current.push(item);
      }
    }
    const operand = (items: string[]): string => {
      if (items.length === 1 && /^(\[|\\[pP]\{)/.test(items[0] ?? '') && (items[0] ?? '').length > 0) {
        const only = items[0] ?? '';
        // A lone nested class or property is an operand as it is.
        if (only.startsWith('[') || /^\\[pP]\{[^}]*\}$/.test(only)) return only;
      }
      return `[${items.join('')}]`;
    };
    const body =
      ops.length === 0
        ? (operands[0] ?? []).join('')
        : operands.map((o, k) => (k === 0 ? '' : (ops[k - 1] ?? '')) + operand(o)).join('');
    if (ops.length > 0 && operands.some((o) => o.length === 0)) this.fail('an empty class set operand', start);
    if (body === '' && !negated) this.fail('an empty character class', start);
    return `[${negated ? '^' : ''}${body}]`;
  }
}

/** Rust's simple case-folding orbit of a letter (approximated beyond ASCII by upper/lower case). */
function caseFold(ch: string): string[] {
  const set = new Set<string>([ch]);
  const lower = ch.toLowerCase();
  const upper = ch.toUpperCase();
  if ([...lower].length === 1) set.add(lower);
  if ([...upper].length === 1) set.add(upper);
  const extra = FOLD_EXTRA[lower];
  if (extra !== undefined) set.add(extra);
  return [...set];
}

/** The single character an escape inside a class stands for (for ranges and case folding), if any. */
function escapedCodePoint(source: string, converted: string): number | undefined {
  const controls: Record<string, number> = { n: 10, r: 13, t: 9, f: 12, v: 11 };
  if (/^\\[^A-Za-z0-9]/u.test(source)) return source.codePointAt(1);
  const control = controls[source.slice(1)];
  if (source.length === 2 && control !== undefined) return control;
  if (/^\\u\{[0-9a-f]+\}$/.test(converted)) return parseInt(converted.slice(3, -1), 16);
  return undefined;
}

function classChar(ch: string): string {
  return CLASS_ESCAPE.has(ch) ? `\\${ch}` : ch;
}

/**
 * Converts a tiktoken split pattern (Rust `regex` / `fancy-regex` syntax, as written in
 * tokenizer code and `tokenizer.pattern`) into JavaScript `v`-flag regular-expression source
 * that matches the same pieces. `where` names the pattern's origin for errors.
 * Throws an {@link EnvironmentError} for a construct it cannot translate exactly.
 */
export function convertSplitPattern(pattern: string, where: string): string {
  const converted = new PatternConverter(pattern, where).convert();
  try {
    new RegExp(converted, 'gv');
  } catch (e: unknown) {
    throw new EnvironmentError(
      `${where}: the split pattern does not compile as a JavaScript regular expression: ${(e as Error).message}`,
      {
        cause: e,
      },
    );
  }
  return converted;
}

/** A compiled split pattern: global, `v` flag. */
export function compileSplitPattern(pattern: string, where: string): RegExp {
  return new RegExp(convertSplitPattern(pattern, where), 'gv');
}
