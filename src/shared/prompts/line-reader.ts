import { isUtf8 } from 'node:buffer';
import { createReadStream } from 'node:fs';

/**
 * One non-blank line of a prompt file (1-based line number): its text, or, for a line whose
 * bytes are not UTF-8, why it cannot be read (`unreadable`) — such a line is a reject, never
 * a prompt decoded with replacement characters.
 */
export type RawPromptLine =
  { line: number; text: string; unreadable?: undefined } | { line: number; text?: undefined; unreadable: string };

const NL = 0x0a;
const CR = 0x0d;
const BOM = Buffer.from([0xef, 0xbb, 0xbf]);
const REPLACEMENT = '\uFFFD';

/**
 * Streams a file's non-blank lines with their 1-based numbers (blank lines still count), in
 * arrays of a few thousand: one await per chunk rather than per line keeps a 20M-line file a
 * matter of seconds. Lines end at `\n`; a `\r` before it is dropped; a UTF-8 byte order mark
 * at the start of the file is skipped.
 *
 * Bytes are decoded a chunk of whole lines at a time. A chunk whose text has no U+FFFD is
 * valid UTF-8 as it stands (the common case: one `indexOf` per chunk); otherwise each line
 * with a U+FFFD has its bytes checked, and a line that is not UTF-8 comes back `unreadable`,
 * naming the first bad byte and its column (in bytes, from 1).
 */
export async function* readRawLineChunks(file: string): AsyncGenerator<RawPromptLine[]> {
  const stream = createReadStream(file, { highWaterMark: 1 << 20 });
  /** The bytes of the line in progress, when a chunk ended inside it. */
  let carry: Buffer[] = [];
  let line = 0;
  let atStart = true;
  for await (const bytes of stream as AsyncIterable<Buffer>) {
    let chunk = bytes;
    if (atStart) {
      // A file shorter than its first chunk is read whole here; a BOM is always in it.
      atStart = false;
      if (chunk.subarray(0, BOM.length).equals(BOM)) chunk = chunk.subarray(BOM.length);
    }
    const lastNl = chunk.lastIndexOf(NL);
    if (lastNl === -1) {
      if (chunk.length > 0) carry.push(chunk);
      continue;
    }
    let whole = chunk.subarray(0, lastNl + 1);
    if (carry.length > 0) {
      whole = Buffer.concat([...carry, whole]);
      carry = [];
    }
    if (lastNl + 1 < chunk.length) carry.push(chunk.subarray(lastNl + 1));
    const out: RawPromptLine[] = [];
    line = splitLines(whole, line, out);
    if (out.length > 0) yield out;
  }
  if (carry.length > 0) {
    const out: RawPromptLine[] = [];
    splitLines(Buffer.concat([...carry, Buffer.from([NL])]), line, out);
    if (out.length > 0) yield out;
  }
}

/** Streams a file's non-blank lines one by one (see {@link readRawLineChunks}). */
export async function* readRawLines(file: string): AsyncGenerator<RawPromptLine> {
  for await (const chunk of readRawLineChunks(file)) yield* chunk;
}

/**
 * Appends the non-blank lines of `whole` (bytes that end with `\n`) to `out`, numbered after
 * `line`; returns the number of the last line.
 */
function splitLines(whole: Buffer, line: number, out: RawPromptLine[]): number {
  const data = whole.toString('utf8');
  // Kept apart: the per-line checks, even never run, make V8 compile this loop far slower.
  if (data.includes(REPLACEMENT)) return splitLossyLines(whole, data, line, out);
  let start = 0;
  for (let nl = data.indexOf('\n'); nl !== -1; nl = data.indexOf('\n', start)) {
    line += 1;
    const end = nl > start && data.charCodeAt(nl - 1) === CR ? nl - 1 : nl;
    const text = data.slice(start, end);
    start = nl + 1;
    if (text.trim() !== '') out.push({ line, text });
  }
  return line;
}

/**
 * {@link splitLines} for a chunk whose text has a U+FFFD: a line whose bytes are not UTF-8 is
 * `unreadable` (a U+FFFD written in the file as its three bytes is valid). A byte that is not
 * UTF-8 decodes to U+FFFD and never swallows a `\n`, so the string's lines and the buffer's
 * lines stay in step.
 */
function splitLossyLines(whole: Buffer, data: string, line: number, out: RawPromptLine[]): number {
  let start = 0;
  let byteStart = 0;
  for (let nl = data.indexOf('\n'); nl !== -1; nl = data.indexOf('\n', start)) {
    line += 1;
    const end = nl > start && data.charCodeAt(nl - 1) === CR ? nl - 1 : nl;
    const text = data.slice(start, end);
    start = nl + 1;
    const byteNl = whole.indexOf(NL, byteStart);
    const lineBytes = whole.subarray(byteStart, byteNl);
    byteStart = byteNl + 1;
    if (text.includes(REPLACEMENT) && !isUtf8(lineBytes))
      out.push({ line, unreadable: notUtf8Reason(lineBytes, line) });
    else if (text.trim() !== '') out.push({ line, text });
  }
  return line;
}

/** Why `bytes` (one line, known not to be UTF-8) cannot be read: its first bad byte. */
export function notUtf8Reason(bytes: Uint8Array, line: number): string {
  const at = firstInvalidUtf8(bytes);
  const byte = bytes[at] ?? 0;
  const hex = `0x${byte.toString(16).padStart(2, '0')}`;
  const utf16 = line === 1 && at === 0 && (byte === 0xff || byte === 0xfe) && bytes[1] === (byte ^ 0x01);
  const hint = utf16 ? '; the file looks like UTF-16: save it as UTF-8' : '';
  return `not valid UTF-8 (byte ${hex} at column ${at + 1}${hint})`;
}

/** The offset of the first byte that does not start a valid UTF-8 sequence (RFC 3629). */
export function firstInvalidUtf8(bytes: Uint8Array): number {
  const n = bytes.length;
  let i = 0;
  while (i < n) {
    const b = bytes[i] ?? 0;
    if (b < 0x80) {
      i += 1;
      continue;
    }
    let need: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b === 0xe0) lo = 0xa0; // overlong
      if (b === 0xed) hi = 0x9f; // surrogates
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b === 0xf0) lo = 0x90; // overlong
      if (b === 0xf4) hi = 0x8f; // beyond U+10FFFF
    } else return i;
    for (let k = 1; k <= need; k += 1) {
      const c = bytes[i + k];
      if (c === undefined || c < (k === 1 ? lo : 0x80) || c > (k === 1 ? hi : 0xbf)) return i;
    }
    i += need + 1;
  }
  return n;
}
