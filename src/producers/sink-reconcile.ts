import { open, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger, RunKeys, ScriptedRedis } from '../shared/index.js';
import { listParts, partNumber, sampleIdOfLine, type Checkpoint } from './sink-checkpoint.js';

/**
 * Reconciling the tail of the part files with Redis, so that the files and the counters agree
 * after Redis lost its last writes (docs/design.md, invariant 2, across an OS crash).
 *
 * With `appendfsync everysec`, an OS crash or power loss loses about the last second of Redis
 * writes, while the sink's lines were fsynced: a commit can vanish from Redis although its line
 * is on disk. On start the sink reads the files backwards from their end, over the records whose
 * `ts` lies within a window of the newest one (and at least a minimum number of lines), so the
 * memory and time it takes grow with the window's throughput, not with the dataset:
 *
 * - a sample on disk that the done set lacks is restored (done set and counters, one script);
 * - a result in the stream whose sample is on disk is dropped, not written again, and the
 *   counters corrected to the line on disk.
 */

/** Sample id → completion tokens of its line on disk, for the records at the end of the files. */
export type DiskTail = Map<string, number>;

export interface ReadTailOptions {
  /** Records whose `ts` is within this of the newest record are read. */
  windowMs: number;
  /** At least this many lines are read, whatever their `ts` (workers' clocks may differ). */
  minLines: number;
  /** Lines of the current part from this byte on are read, whatever their `ts`. */
  mustReadFrom?: number | undefined;
  log: Logger;
}

/** At most this many records are held (a very fast run over a long window); the rest is not checked. */
const MAX_TAIL_RECORDS = 2_000_000;

/** Reads the records at the end of the part files (the current one up to the checkpoint), newest first. */
export async function readDiskTail(dir: string, checkpoint: Checkpoint, options: ReadTailOptions): Promise<DiskTail> {
  const tail: DiskTail = new Map();
  const parts = (await listParts(dir)).filter((p) => partNumber(p) <= partNumber(checkpoint.part)).reverse();
  let newestMs = -Infinity;
  let lines = 0;
  let unreadable = 0;
  for (const part of parts) {
    const path = join(dir, part);
    const end = part === checkpoint.part ? checkpoint.bytes : await stat(path).then((s) => s.size);
    const mustFrom = part === checkpoint.part ? options.mustReadFrom : undefined;
    for await (const { line, start } of linesBackward(path, end)) {
      lines += 1;
      let rec: { id?: unknown; completion_tokens?: unknown; ts?: unknown };
      try {
        rec = JSON.parse(line) as typeof rec;
      } catch {
        unreadable += 1;
        continue;
      }
      const ts = typeof rec.ts === 'string' ? Date.parse(rec.ts) : NaN;
      if (Number.isFinite(ts)) newestMs = Math.max(newestMs, ts);
      const must = lines <= options.minLines || (mustFrom !== undefined && start >= mustFrom);
      if (!must && !(ts >= newestMs - options.windowMs)) return done();
      if (tail.size >= MAX_TAIL_RECORDS) {
        options.log.warn(
          { records: tail.size, windowMs: options.windowMs },
          'results tail too large to reconcile in full; older records are not checked',
        );
        return done();
      }
      if (typeof rec.id === 'string' && typeof rec.completion_tokens === 'number' && !tail.has(rec.id))
        tail.set(rec.id, rec.completion_tokens);
    }
  }
  return done();

  function done(): DiskTail {
    if (unreadable > 0)
      options.log.warn(
        { dir, lines: unreadable },
        'lines at the end of the part files are not JSON; they are left as they are',
      );
    return tail;
  }
}

/** Lines of `[0, end)` of a file, last first, with the byte each starts at. `end` is a line end. */
async function* linesBackward(path: string, end: number): AsyncGenerator<{ line: string; start: number }> {
  const fh = await open(path, 'r');
  try {
    const chunkBytes = 256 * 1024;
    let pos = end;
    let carry = Buffer.alloc(0); // the start of the line that spans the chunk boundary
    while (pos > 0) {
      const start = Math.max(0, pos - chunkBytes);
      const buf = Buffer.alloc(pos - start);
      await fh.read(buf, 0, buf.length, start);
      const data = carry.length === 0 ? buf : Buffer.concat([buf, carry]);
      let lineEnd = data.length;
      for (let i = data.length - 1; i >= 0; i -= 1) {
        if (data[i] !== 0x0a) continue;
        if (i + 1 < lineEnd) yield { line: data.subarray(i + 1, lineEnd).toString('utf8'), start: start + i + 1 };
        lineEnd = i;
      }
      carry = data.subarray(0, lineEnd);
      pos = start;
    }
    if (carry.length > 0) yield { line: carry.toString('utf8'), start: 0 };
  } finally {
    await fh.close();
  }
}

/** Restores done-set entries and counters for samples on disk that Redis lost; returns how many. */
export async function restoreDone(
  redis: ScriptedRedis,
  keys: RunKeys,
  dataset: string,
  tail: DiskTail,
): Promise<number> {
  let restored = 0;
  let args: (string | number)[] = [];
  const flush = async (): Promise<void> => {
    if (args.length === 0) return;
    restored += await redis.sinkRestore(
      keys.done(dataset),
      keys.stats(dataset),
      keys.failed(dataset),
      keys.skipped(dataset),
      keys.attempts(dataset),
      ...args,
    );
    args = [];
  };
  for (const [id, tokens] of tail) {
    args.push(id, tokens);
    if (args.length >= 1_000) await flush();
  }
  await flush();
  return restored;
}

/**
 * The samples on disk at the end of the files, checked against stream entries up to `until`
 * (the stream's newest entry once the done set was restored: after it, no commit of those
 * samples can enter the stream). Forgotten once the sink wrote past `until`.
 */
export class DiskTailFilter {
  constructor(
    private tail: DiskTail,
    private readonly until: string | undefined,
  ) {
    if (until === undefined) this.tail = new Map();
  }

  /** Tokens of the line on disk when this entry's sample is already there; else undefined. */
  onDisk(entryId: string, record: string): number | undefined {
    if (this.tail.size === 0 || this.until === undefined || compareStreamIds(entryId, this.until) > 0) return undefined;
    const id = sampleIdOfLine(record) ?? (JSON.parse(record) as { id?: string }).id;
    return id === undefined ? undefined : this.tail.get(id);
  }

  /** The sink wrote (or dropped) every entry up to `entryId`. */
  passed(entryId: string): void {
    if (this.until !== undefined && this.tail.size > 0 && compareStreamIds(entryId, this.until) >= 0)
      this.tail = new Map();
  }
}

/** Orders stream ids (`<ms>-<seq>`). */
export function compareStreamIds(a: string, b: string): number {
  const [am = 0n, as = 0n] = a.split('-').map((x) => BigInt(x));
  const [bm = 0n, bs = 0n] = b.split('-').map((x) => BigInt(x));
  if (am !== bm) return am < bm ? -1 : 1;
  return as === bs ? 0 : as < bs ? -1 : 1;
}

/** What {@link rebuildFromFiles} found and put back. */
export interface RebuildResult {
  /** Records read from the part files. */
  records: number;
  /** Samples Redis lacked, now committed again (done set and counters). */
  restored: number;
  /** Completion tokens of the restored samples. */
  tokens: number;
}

/**
 * Redis holds no committed sample of a dataset that has part files (a new, empty server; a
 * deleted or lost AOF): the files are the truth. Reads every record of the parts (the current one up to
 * the checkpoint) and commits again, as `sink-restore-5.lua` does, each sample Redis lacks:
 * the done set (so the producer never sends it again) and the counters (records, output tokens,
 * the budget). Streams the files in batches; memory does not grow with the dataset.
 */
export async function rebuildFromFiles(
  redis: ScriptedRedis,
  keys: RunKeys,
  dataset: string,
  dir: string,
  checkpoint: Checkpoint,
): Promise<RebuildResult> {
  const result: RebuildResult = { records: 0, restored: 0, tokens: 0 };
  const parts = (await listParts(dir)).filter((p) => partNumber(p) <= partNumber(checkpoint.part));
  const tokensNow = async (): Promise<number> => Number((await redis.hget(keys.stats(dataset), 'outputTokens')) ?? 0);
  const tokensBefore = await tokensNow();
  let batch = new Map<string, number>();
  const flush = async (): Promise<void> => {
    if (batch.size === 0) return;
    result.restored += await restoreDone(redis, keys, dataset, batch);
    batch = new Map();
  };
  for (const part of parts) {
    const path = join(dir, part);
    const end = part === checkpoint.part ? checkpoint.bytes : await stat(path).then((s) => s.size);
    for await (const line of linesForward(path, end)) {
      let rec: { id?: unknown; completion_tokens?: unknown };
      try {
        rec = JSON.parse(line) as typeof rec;
      } catch {
        continue;
      }
      if (typeof rec.id !== 'string' || typeof rec.completion_tokens !== 'number') continue;
      result.records += 1;
      batch.set(rec.id, rec.completion_tokens);
      if (batch.size >= 500) await flush();
    }
  }
  await flush();
  result.tokens = (await tokensNow()) - tokensBefore;
  return result;
}

/** Lines of `[0, end)` of a file, first first. */
async function* linesForward(path: string, end: number): AsyncGenerator<string> {
  const fh = await open(path, 'r');
  try {
    const chunkBytes = 256 * 1024;
    let pos = 0;
    let carry = Buffer.alloc(0); // the start of the line that spans the chunk boundary
    while (pos < end) {
      const buf = Buffer.alloc(Math.min(chunkBytes, end - pos));
      const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
      if (bytesRead === 0) break;
      pos += bytesRead;
      const data = Buffer.concat([carry, buf.subarray(0, bytesRead)]);
      let lineStart = 0;
      for (let i = 0; i < data.length; i += 1) {
        if (data[i] !== 0x0a) continue;
        if (i > lineStart) yield data.subarray(lineStart, i).toString('utf8');
        lineStart = i + 1;
      }
      carry = data.subarray(lineStart);
    }
    if (carry.length > 0) yield carry.toString('utf8');
  } finally {
    await fh.close();
  }
}
