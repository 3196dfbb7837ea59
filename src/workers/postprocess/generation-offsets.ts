/**
 * Incremental reading of a generations folder: where each `*.jsonl` part file was read up to in the
 * last round (the offsets committed with the training dataset, see
 * src/shared/hf-dataset/merge/offsets.ts), whether those offsets still describe the files, and a
 * line reader that starts at a byte offset and says where its complete lines end.
 *
 * The sink only appends complete lines to its part files, so the bytes read once stay as they
 * were; a file that is gone, shorter than what was read, or whose first or last read bytes
 * differ was rewritten, and the whole folder is read again (the id index keeps that exact).
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import path from 'node:path';

import type { DatasetOffsets, GenerationFileOffset } from '../../shared/index.js';
import type { TokenizeContext } from './tokenize-context.js';

/** Where reading a file starts: after `bytes` bytes, which hold `lines` lines. */
export interface FileStart {
  bytes: number;
  lines: number;
}

/** Bytes fingerprinted at each end of what was read. */
const FINGERPRINT_BYTES = 4096;

/** The tokenize settings that decide which rows lines make; offsets read with others do not apply. */
export function tokenizeSettings(ctx: TokenizeContext): string {
  return JSON.stringify({
    keepTruncated: ctx.keepTruncated,
    vocabSize: ctx.tokenizer.vocabSize,
    endOfTurn: ctx.format.endOfTurnTokenId,
    suffix: ctx.format.suffixIds,
  });
}

async function sha1Of(file: string, pos: number, length: number): Promise<string> {
  const fh = await open(file, 'r');
  try {
    const buf = Buffer.alloc(length);
    let got = 0;
    while (got < length) {
      const { bytesRead } = await fh.read(buf, got, length - got, pos + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return createHash('sha1').update(buf.subarray(0, got)).digest('hex');
  } finally {
    await fh.close();
  }
}

/** The offset record of `file` read up to `end`: its fingerprints at both ends of the read bytes. */
export async function fileOffset(file: string, end: FileStart): Promise<GenerationFileOffset> {
  const n = Math.min(FINGERPRINT_BYTES, end.bytes);
  const [head, tail] = await Promise.all([sha1Of(file, 0, n), sha1Of(file, end.bytes - n, n)]);
  return { bytes: end.bytes, lines: end.lines, head, tail };
}

/** Where to start each file, or why the folder must be read from the start. */
export interface ResumePlan {
  /** By file name: where reading starts (files not here start at 0). */
  starts: Map<string, FileStart>;
  /** Set when nothing recorded can be used: why (for the log). */
  fullRead?: string;
}

/**
 * Checks the offsets recorded for a dataset against its generation files (`files`, full paths)
 * and the current tokenize `settings`: every recorded file must still be there, at least as
 * long as what was read, with the same bytes at both ends of it.
 */
export async function planResume(
  files: readonly string[],
  recorded: DatasetOffsets | undefined,
  settings: string,
): Promise<ResumePlan> {
  const full = (why: string): ResumePlan => ({ starts: new Map(), fullRead: why });
  if (recorded === undefined) return full('no offsets recorded for this dataset');
  if (recorded.settings !== settings)
    return full(`the tokenize settings changed (were ${recorded.settings}, now ${settings})`);
  const byName = new Map(files.map((f) => [path.basename(f), f]));
  const starts = new Map<string, FileStart>();
  for (const [name, off] of Object.entries(recorded.files)) {
    const file = byName.get(name);
    if (file === undefined) return full(`${name} was read before and is gone`);
    const size = (await stat(file)).size;
    if (size < off.bytes) return full(`${name} has ${size} bytes, fewer than the ${off.bytes} read before`);
    const now = await fileOffset(file, off);
    if (now.head !== off.head || now.tail !== off.tail)
      return full(`${name} differs from what was read before (rewritten)`);
    starts.set(name, { bytes: off.bytes, lines: off.lines });
  }
  return { starts };
}

/**
 * The non-blank lines of `file` from byte `start.bytes` on, numbered from `start.lines + 1`.
 * Returns where its complete (newline-terminated) lines end: a last line without a newline is
 * read but not counted as read, so the next round reads it again (rows are deduplicated by id).
 */
export async function* linesFrom(
  file: string,
  start: FileStart,
): AsyncGenerator<{ line: number; text: string }, FileStart> {
  let bytes = start.bytes;
  let lines = start.lines;
  let pending: Buffer[] = [];
  const stream = createReadStream(file, { start: start.bytes, highWaterMark: 1024 * 1024 });
  const lineOf = (buf: Buffer): string => {
    const text = buf.toString('utf8');
    return text.endsWith('\r') ? text.slice(0, -1) : text;
  };
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    let from = 0;
    for (let nl = chunk.indexOf(10, from); nl >= 0; nl = chunk.indexOf(10, from)) {
      const part = chunk.subarray(from, nl);
      const buf = pending.length === 0 ? part : Buffer.concat([...pending, part]);
      pending = [];
      bytes += buf.length + 1;
      lines += 1;
      from = nl + 1;
      const text = lineOf(buf);
      if (text.trim() !== '') yield { line: lines, text };
    }
    if (from < chunk.length) pending.push(chunk.subarray(from));
  }
  if (pending.length > 0) {
    const text = lineOf(Buffer.concat(pending));
    if (text.trim() !== '') yield { line: lines + 1, text };
  }
  return { bytes, lines };
}
