/**
 * Finding a generation's prompt again: generation records hold the prompt's token ids, not its
 * messages, so `export --format specforge` looks each record's sample id up in the dataset's
 * prompt file. The index maps sample ids to byte offsets of their lines, for one hash partition
 * of the ids at a time, so memory is bounded by {@link PARTITION_MAX_LINES} whatever the size of
 * the file (a bigger file is read once per partition).
 */
import { createReadStream } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';

import {
  EnvironmentError,
  errorMessage,
  fastPromptId,
  parsePromptLine,
  type PromptParseOptions,
  type PromptRecord,
} from '../../shared/index.js';

/** How a dataset names its samples (its config): what {@link promptIdOf} reads off a sample id. */
export interface SampleIdScheme {
  /** `datasets[].samplesPerPrompt`: above 1, sample j of prompt `<id>` is `<id>#s<j>`. */
  samplesPerPrompt: number;
  /** `datasets[].turns`: with `all`, turn k of a conversation (sample) `<c>` is `<c>#t<k>`. */
  turns: 'last' | 'all';
}

/**
 * The prompt line's id of sample id `id` (a record's `id`, or a conversation's `conversation_id`
 * with `conversation: true`): with `turns: all`, a record's id less its `#t<k>`; with
 * `samplesPerPrompt: n > 1`, less its `#s<j>` (1 ≤ j ≤ n). Only what the dataset's config says
 * its ids carry is taken off: an id that merely ends like a suffix is left whole.
 */
export function promptIdOf(id: string, scheme: SampleIdScheme, opts: { conversation?: boolean } = {}): string {
  let rest = id;
  if (scheme.turns === 'all' && opts.conversation !== true) {
    const m = /#t([1-9]\d*)$/.exec(rest);
    if (m !== null) rest = rest.slice(0, m.index);
  }
  if (scheme.samplesPerPrompt > 1) {
    const m = /#s([1-9]\d*)$/.exec(rest);
    if (m !== null && Number(m[1]) <= scheme.samplesPerPrompt) rest = rest.slice(0, m.index);
  }
  return rest;
}

/** Most prompt lines indexed at once (~80 bytes each in memory). */
export const PARTITION_MAX_LINES = 1_000_000;

const NL = 0x0a;
const BOM = Buffer.from([0xef, 0xbb, 0xbf]);

/** A 32-bit FNV-1a hash of a sample id: which partition it belongs to. */
export function partitionOf(id: string, partitions: number): number {
  if (partitions <= 1) return 0;
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193);
  return (h >>> 0) % partitions;
}

/** How many partitions a prompt file of `lines` lines needs. */
export function partitionsFor(lines: number, maxLines = PARTITION_MAX_LINES): number {
  return Math.max(1, Math.ceil(lines / maxLines));
}

/** Each line of a file with the byte offset where it starts (a UTF-8 BOM at the start skipped). */
async function* linesWithOffsets(file: string): AsyncGenerator<{ offset: number; bytes: Buffer }> {
  let carry: Buffer | undefined;
  let carryStart = 0;
  let pos = 0;
  let first = true;
  for await (const raw of createReadStream(file, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) {
    let chunk = raw;
    let chunkStart = pos;
    pos += raw.length;
    if (first) {
      first = false;
      if (chunk.subarray(0, BOM.length).equals(BOM)) {
        chunk = chunk.subarray(BOM.length);
        chunkStart += BOM.length;
      }
    }
    let start = 0;
    for (let nl = chunk.indexOf(NL); nl !== -1; nl = chunk.indexOf(NL, start)) {
      if (carry !== undefined) {
        yield { offset: carryStart, bytes: Buffer.concat([carry, chunk.subarray(0, nl)]) };
        carry = undefined;
      } else {
        yield { offset: chunkStart + start, bytes: chunk.subarray(start, nl) };
      }
      start = nl + 1;
    }
    if (start < chunk.length) {
      if (carry === undefined) {
        carry = Buffer.from(chunk.subarray(start));
        carryStart = chunkStart + start;
      } else {
        carry = Buffer.concat([carry, chunk.subarray(start)]);
      }
    }
  }
  if (carry !== undefined && carry.length > 0) yield { offset: carryStart, bytes: carry };
}

function textOf(bytes: Buffer): string {
  const end = bytes.length > 0 && bytes[bytes.length - 1] === 0x0d ? bytes.length - 1 : bytes.length;
  return bytes.toString('utf8', 0, end);
}

/** The sample id the producer gives a line, or undefined for a line it rejects. */
function sampleIdOf(text: string, file: string, parse: PromptParseOptions): string | undefined {
  const fast = fastPromptId(text);
  if (fast !== undefined) return fast;
  const parsed = parsePromptLine(text, file, 0, parse);
  return parsed.ok ? parsed.record.id : undefined;
}

/**
 * The prompt lines of one partition of a prompt file, by sample id (the first line of an id
 * wins, as in the producer). Open with {@link PromptIndex.build}; read a record with
 * {@link get}; {@link close} when done.
 */
export class PromptIndex {
  private constructor(
    readonly file: string,
    private readonly offsets: Map<string, number>,
    private readonly fh: FileHandle,
    private readonly parse: PromptParseOptions = {},
  ) {}

  /** Reads `file` once, indexing the ids of partition `partition` of `partitions`. */
  static async build(
    file: string,
    partition: number,
    partitions: number,
    parse: PromptParseOptions = {},
  ): Promise<PromptIndex> {
    const offsets = new Map<string, number>();
    let fh: FileHandle;
    try {
      fh = await open(file, 'r');
      for await (const { offset, bytes } of linesWithOffsets(file)) {
        const text = textOf(bytes);
        if (text.trim() === '') continue;
        const id = sampleIdOf(text, file, parse);
        if (id === undefined || partitionOf(id, partitions) !== partition || offsets.has(id)) continue;
        offsets.set(id, offset);
      }
    } catch (e: unknown) {
      throw new EnvironmentError(`prompt file ${file} cannot be read: ${errorMessage(e)}`, { cause: e });
    }
    return new PromptIndex(file, offsets, fh, parse);
  }

  /** Sample ids indexed. */
  get size(): number {
    return this.offsets.size;
  }

  /**
   * The prompt record of sample `id` as the producer read it (normalized messages), undefined
   * when the file has no line with that id; `{ error }` when the line no longer parses.
   */
  async get(id: string): Promise<PromptRecord | { error: string } | undefined> {
    const offset = this.offsets.get(id);
    if (offset === undefined) return undefined;
    const text = textOf(await this.#lineAt(offset));
    const parsed = parsePromptLine(text, this.file, 0, this.parse);
    if (!parsed.ok) return { error: `${this.file} at byte ${offset}: ${parsed.reject.reason}` };
    return parsed.record;
  }

  async close(): Promise<void> {
    await this.fh.close();
  }

  async #lineAt(offset: number): Promise<Buffer> {
    const parts: Buffer[] = [];
    let pos = offset;
    let size = 1 << 16;
    for (;;) {
      const buf = Buffer.allocUnsafe(size);
      const { bytesRead } = await this.fh.read(buf, 0, size, pos);
      if (bytesRead === 0) return Buffer.concat(parts);
      const got = buf.subarray(0, bytesRead);
      const nl = got.indexOf(NL);
      if (nl !== -1) {
        parts.push(got.subarray(0, nl));
        return Buffer.concat(parts);
      }
      parts.push(got);
      pos += bytesRead;
      size = Math.min(size * 2, 1 << 24);
    }
  }
}
