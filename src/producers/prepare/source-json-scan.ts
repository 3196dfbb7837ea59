/**
 * A byte-level scanner of a JSON file that finds the elements of one list without parsing the
 * rest: each element's bytes are handed out as they end, so a `.json` source of any size is read
 * with one element in memory at a time. It follows only what it must (strings, escapes, nesting
 * depth, and at the top of an object its keys), and leaves the parsing of each element to
 * `JSON.parse`.
 */
import { createReadStream } from 'node:fs';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const NL = 0x0a;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const COMMA = 0x2c;
const COLON = 0x3a;
const BOM = [0xef, 0xbb, 0xbf];

function isSpace(b: number): boolean {
  return b === 0x20 || b === NL || b === 0x0d || b === 0x09;
}

/** What a file's top level is: a list, an object (with its keys and whether each holds a list), or something else. */
export type JsonTop =
  | { kind: 'array' }
  | {
      kind: 'object';
      keys: { key: string; list: boolean }[];
      /** Another value follows the object: JSON Lines. */ more: boolean;
    }
  | { kind: 'other'; first: string }
  | { kind: 'empty' };

/** One element of the list: its bytes and the 1-based line it starts on; `truncated` when the file ends inside it. */
export interface JsonElement {
  bytes: Buffer;
  line: number;
  truncated: boolean;
}

/** The scanner's state between bytes; the same for both uses (describing the top, streaming a list). */
class Scanner {
  depth = 0;
  inString = false;
  escape = false;
  line = 1;
  /** Depth inside the list being streamed (its elements start there); 0 = not in it. */
  listDepth = 0;
  listClosed = false;
  /** Bytes of the element or key being collected, over chunks. */
  parts: Buffer[] = [];
  collectFrom = -1;
  collectLine = 0;
  /** Top-level object: where the scan is between keys and values. */
  objState: 'key' | 'colon' | 'value' | 'comma' = 'key';
  collectingKey = false;
  currentKey = '';
  keys: { key: string; list: boolean }[] = [];
  /** The top-level value has closed. */
  topClosed = false;
  /** Non-space bytes after the top-level value. */
  after = false;
  top: number | undefined;
  private nextBackslash = -1;

  /**
   * Scans one chunk; `onElement` gets each element that ends in it. `listKey`: the key of the
   * top-level object whose list to stream, or undefined to stream a top-level list.
   */
  scan(chunk: Buffer, listKey: string | undefined, onElement: ((e: JsonElement) => void) | undefined): void {
    const n = chunk.length;
    let i = 0;
    this.nextBackslash = -1;
    if (this.collectFrom >= 0) this.collectFrom = 0;
    while (i < n) {
      if (this.inString) {
        i = this.skipString(chunk, i);
        continue;
      }
      const b = chunk[i] as number;
      if (isSpace(b)) {
        if (b === NL) this.line += 1;
        i += 1;
        continue;
      }
      if (this.topClosed) {
        this.after = true;
        return;
      }
      if (this.top === undefined) this.top = b;
      if (this.depth === 1 && this.top === OPEN_OBJECT) this.objectTop(b, i, listKey);
      const elementAt = this.listDepth > 0 && this.depth === this.listDepth && this.collectFrom < 0;
      if (elementAt && b !== COMMA && b !== CLOSE_ARRAY) this.startCollect(i);
      switch (b) {
        case QUOTE:
          this.inString = true;
          break;
        case OPEN_ARRAY:
        case OPEN_OBJECT:
          this.depth += 1;
          if (this.depth === 1 && b === OPEN_ARRAY && listKey === undefined) this.listDepth = 1;
          break;
        case CLOSE_ARRAY:
        case CLOSE_OBJECT:
          if (this.listDepth > 0 && this.depth === this.listDepth) {
            if (this.collectFrom >= 0) onElement?.(this.endCollect(chunk, i, false));
            this.listDepth = 0;
            this.listClosed = true;
          }
          this.depth -= 1;
          if (this.depth === 0) this.topClosed = true;
          break;
        case COMMA:
          if (this.listDepth > 0 && this.depth === this.listDepth && this.collectFrom >= 0)
            onElement?.(this.endCollect(chunk, i, false));
          break;
        default:
          if (this.depth === 0) this.topClosed = true;
      }
      i += 1;
    }
    if (this.collectFrom >= 0) {
      this.parts.push(chunk.subarray(this.collectFrom));
    }
  }

  /** At depth 1 of the top-level object: follows keys and values, and opens the list of `listKey`. */
  private objectTop(b: number, i: number, listKey: string | undefined): void {
    switch (this.objState) {
      case 'key':
        if (b === QUOTE) {
          this.collectingKey = true;
          this.startCollect(i);
        }
        break;
      case 'colon':
        if (b === COLON) this.objState = 'value';
        break;
      case 'value':
        this.keys.push({ key: this.currentKey, list: b === OPEN_ARRAY });
        if (b === OPEN_ARRAY && listKey !== undefined && this.currentKey === listKey && !this.listClosed)
          this.listDepth = 2;
        this.objState = 'comma';
        break;
      case 'comma':
        if (b === COMMA) this.objState = 'key';
        break;
    }
  }

  /** Moves past string bytes from `i`; returns where to go on. */
  private skipString(chunk: Buffer, i: number): number {
    const n = chunk.length;
    if (this.escape) {
      this.escape = false;
      return i + 1;
    }
    const q = chunk.indexOf(QUOTE, i);
    if (this.nextBackslash !== n && this.nextBackslash < i) {
      const k = chunk.indexOf(BACKSLASH, i);
      this.nextBackslash = k === -1 ? n : k;
    }
    if (this.nextBackslash < n && (q === -1 || this.nextBackslash < q)) {
      const next = this.nextBackslash + 2;
      if (next > n) this.escape = true;
      return Math.min(next, n);
    }
    if (q === -1) return n;
    this.inString = false;
    if (this.collectingKey) {
      this.collectingKey = false;
      const key = this.endCollect(chunk, q + 1, false);
      this.currentKey = JSON.parse(key.bytes.toString('utf8')) as string;
      this.objState = 'colon';
    }
    return q + 1;
  }

  private startCollect(i: number): void {
    this.collectFrom = i;
    this.collectLine = this.line;
    this.parts = [];
  }

  private endCollect(chunk: Buffer, end: number, truncated: boolean): JsonElement {
    const last = chunk.subarray(this.collectFrom, end);
    const bytes = this.parts.length === 0 ? last : Buffer.concat([...this.parts, last]);
    this.parts = [];
    this.collectFrom = -1;
    return { bytes, line: this.collectLine, truncated };
  }

  /** At the end of the file: the element the file ends inside, if any. */
  finish(): JsonElement | undefined {
    if (this.collectFrom < 0 || this.collectingKey) return undefined;
    this.collectFrom = 0;
    return this.endCollect(Buffer.alloc(0), 0, true);
  }
}

async function* chunksOf(file: string): AsyncGenerator<Buffer> {
  let first = true;
  for await (const c of createReadStream(file, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) {
    let chunk = c;
    if (first) {
      first = false;
      if (chunk[0] === BOM[0] && chunk[1] === BOM[1] && chunk[2] === BOM[2]) chunk = chunk.subarray(3);
    }
    yield chunk;
  }
}

/**
 * What the top level of a JSON file is. For an object, scans to its end (without parsing its
 * values) to list its keys and which hold a list, and says whether another value follows it
 * (JSON Lines saved as `.json`).
 */
export async function describeJsonTop(file: string): Promise<JsonTop> {
  const s = new Scanner();
  for await (const chunk of chunksOf(file)) {
    s.scan(chunk, '\u0000no list', undefined);
    if (s.top !== undefined && s.top !== OPEN_OBJECT && s.top !== OPEN_ARRAY)
      return { kind: 'other', first: String.fromCharCode(s.top) };
    if (s.top === OPEN_ARRAY) return { kind: 'array' };
    if (s.after) break;
  }
  if (s.top === undefined) return { kind: 'empty' };
  return { kind: 'object', keys: s.keys, more: s.after };
}

/**
 * The elements of the file's top-level list (`listKey` undefined) or of the list under
 * `listKey` in its top-level object, as they end; a file that ends inside an element gives it
 * last, `truncated`. `unclosed` is set when the file ends before the list closes.
 */
export async function* scanJsonList(
  file: string,
  listKey: string | undefined,
  state: { unclosed: boolean } = { unclosed: false },
): AsyncGenerator<JsonElement> {
  const s = new Scanner();
  for await (const chunk of chunksOf(file)) {
    const out: JsonElement[] = [];
    s.scan(chunk, listKey, (e) => out.push(e));
    yield* out;
    if (s.listClosed) return;
  }
  const partial = s.finish();
  if (partial !== undefined) yield partial;
  state.unclosed = !s.listClosed;
}
