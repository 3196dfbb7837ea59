import { open, readFile, readdir, stat, truncate } from 'node:fs/promises';
import { join } from 'node:path';
import {
  AppError,
  EnvironmentError,
  countNewlines,
  errorCode,
  removeTempFiles,
  writeFileAtomic,
  type Logger,
} from '../shared/index.js';

/** What the sink has written: a hint for where to resume in the stream. The part files are the truth. */
export interface Checkpoint {
  /** Current part file name. */
  part: string;
  /** Bytes of that part that are durably written and accounted for. */
  bytes: number;
  /** Id of the last stream entry written to disk. */
  lastId: string;
  /** Records written so far, over all parts. */
  records: number;
}

export const CHECKPOINT_FILE = '.sink-checkpoint.json';

export function partName(n: number): string {
  return `part-${String(n).padStart(5, '0')}.jsonl`;
}

export function partNumber(name: string): number {
  return Number(/^part-(\d+)\.jsonl$/.exec(name)?.[1] ?? 0);
}

/** Part files in `dir`, oldest first. */
export async function listParts(dir: string): Promise<string[]> {
  const names = await readdir(dir).catch(() => [] as string[]);
  return names.filter((n) => /^part-\d+\.jsonl$/.test(n)).sort((a, b) => partNumber(a) - partNumber(b));
}

export function writeCheckpoint(dir: string, cp: Checkpoint): Promise<void> {
  return writeFileAtomic(join(dir, CHECKPOINT_FILE), JSON.stringify(cp));
}

/** Removes the `.tmp-` files a killed sink left in its folder (call while holding its lock). */
export async function removeSinkTempFiles(dir: string, log: Logger): Promise<void> {
  const removed = await removeTempFiles(dir);
  if (removed.length > 0) log.info({ dir, removed }, 'removed temporary files an earlier sink left behind');
}

const DISK_FAILURES: Record<string, string> = {
  ENOSPC: 'no space left on the device',
  EDQUOT: 'the disk quota is exceeded',
  EROFS: 'the file system is read-only',
  EIO: 'the disk reported an I/O error',
};

/**
 * A write of the sink's files that failed for the disk's sake (full, over quota, read-only,
 * I/O error), as one clear error naming the file and what to do; undefined for anything else.
 * Nothing is lost: the results stay in Redis until they are on disk, and the next run
 * recovers the part file's end.
 */
export function sinkDiskError(e: unknown, file: string): EnvironmentError | undefined {
  const code = errorCode(e);
  const what = code === undefined ? undefined : DISK_FAILURES[code];
  if (what === undefined) return undefined;
  return new EnvironmentError(
    `cannot write ${file}: ${what} (${code}). Free space on that disk (or change output.dir), then run the same command again: ` +
      'the results not yet on disk are kept in Redis and written then, none is lost or generated again',
    { cause: e },
  );
}

async function readCheckpoint(dir: string): Promise<Checkpoint | undefined> {
  const path = join(dir, CHECKPOINT_FILE);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e: unknown) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  try {
    const cp = JSON.parse(text) as Partial<Checkpoint>;
    if (
      typeof cp.part === 'string' &&
      typeof cp.bytes === 'number' &&
      typeof cp.lastId === 'string' &&
      typeof cp.records === 'number'
    )
      return cp as Checkpoint;
  } catch {
    // reported below
  }
  throw new AppError(
    `${path}: not a sink checkpoint ({"part","bytes","lastId","records"}); delete it to have the sink rebuild it from the part files`,
  );
}

/** Where a stream entry's sample stands, asked about the incomplete last line of a part. */
export interface TornLineOracle {
  /** Whether an entry of the results stream holds this sample's result. */
  inStream(sampleId: string): Promise<boolean>;
  /** Whether the dataset's done set records this sample as committed. */
  isDone(sampleId: string): Promise<boolean>;
}

export interface RecoveredFiles {
  checkpoint: Checkpoint;
  /** Complete lines of the current part past the old checkpoint (kept, not cut): from this byte on. */
  adoptedFrom: number | undefined;
}

/**
 * Brings the part files and the checkpoint into agreement before the sink writes, trusting the
 * files and never cutting a complete line:
 *
 * - no checkpoint (e.g. a copy that skipped dotfiles): rebuilt from the files — the newest
 *   part, its size up to its last complete line, its records counted; resuming from stream
 *   id 0, lines already on disk are recognised by the sink's reconciliation and not written again;
 * - complete lines past the checkpoint (a crash between fsync and checkpoint) are kept and
 *   counted; their stream entries, still in Redis, are recognised the same way;
 * - an incomplete last line (a crash mid-write) is cut, only when its result is still in the
 *   stream, or its sample is not done (it will be generated again), or it lies past the
 *   checkpoint (its entry was never trimmed); otherwise the sink refuses to start;
 * - a part shorter than its checkpoint, or part files newer than it: the sink refuses to
 *   start, naming the file (something outside the sink changed them).
 */
export async function recoverFiles(dir: string, oracle: TornLineOracle, log: Logger): Promise<RecoveredFiles> {
  const parts = await listParts(dir);
  const saved = await readCheckpoint(dir);
  const cpPath = join(dir, CHECKPOINT_FILE);
  if (saved === undefined) {
    const newest = parts[parts.length - 1];
    if (newest === undefined)
      return { checkpoint: { part: partName(0), bytes: 0, lastId: '0-0', records: 0 }, adoptedFrom: undefined };
    const path = join(dir, newest);
    const { complete, size } = await completeLength(path);
    if (complete < size) await cutTornLine(path, complete, size, false, oracle, log);
    let records = 0;
    for (const p of parts) records += await countNewlines(join(dir, p));
    const checkpoint: Checkpoint = { part: newest, bytes: complete, lastId: '0-0', records };
    log.warn(
      { checkpoint: cpPath, ...checkpoint },
      'no sink checkpoint: rebuilt it from the part files (they are kept as they are)',
    );
    await writeCheckpoint(dir, checkpoint);
    return { checkpoint, adoptedFrom: undefined };
  }
  const newer = parts.filter((p) => partNumber(p) > partNumber(saved.part));
  if (newer.length > 0) {
    throw new AppError(
      `${dir}: part files newer than the sink checkpoint's ${saved.part} (${newer.join(', ')}): they were not written by this run's sink as recorded in ${cpPath}. ` +
        `Move them away, or delete ${cpPath} to have it rebuilt from the files`,
    );
  }
  const path = join(dir, saved.part);
  const size = await stat(path).then(
    (s) => s.size,
    () => -1,
  );
  if (size < saved.bytes) {
    throw new AppError(
      `${path} is ${size < 0 ? 'missing' : `${size} bytes`} but the sink checkpoint ${cpPath} says ${saved.bytes} bytes were written to it: the file was truncated or replaced, ` +
        `and the lines missing from it are no longer in Redis. Restore the file; or, to accept the loss, delete ${cpPath} (the sink then rebuilds it from the files, and the missing samples stay recorded as done)`,
    );
  }
  if (size === saved.bytes) return { checkpoint: saved, adoptedFrom: undefined };
  const { complete } = await completeLength(path);
  // Checkpoints end on a line boundary: an incomplete line past one belongs to an untrimmed batch.
  if (complete < size) await cutTornLine(path, Math.max(complete, saved.bytes), size, true, oracle, log);
  if (complete <= saved.bytes) return { checkpoint: saved, adoptedFrom: undefined };
  const adopted = await countNewlines(path, saved.bytes, complete);
  log.warn(
    { part: saved.part, checkpoint: saved.bytes, size: complete, lines: adopted },
    'keeping complete lines written after the last checkpoint; their stream entries will not be written again',
  );
  const checkpoint: Checkpoint = { ...saved, bytes: complete, records: saved.records + adopted };
  await writeCheckpoint(dir, checkpoint);
  return { checkpoint, adoptedFrom: saved.bytes };
}

/** Cuts `[from, size)`, an incomplete last line, if its result can be had again; else refuses. */
async function cutTornLine(
  path: string,
  from: number,
  size: number,
  pastCheckpoint: boolean,
  oracle: TornLineOracle,
  log: Logger,
): Promise<void> {
  const fh = await open(path, 'r');
  const head = Buffer.alloc(Math.min(size - from, 4096));
  try {
    await fh.read(head, 0, head.length, from);
  } finally {
    await fh.close();
  }
  const id = sampleIdOfLine(head.toString('utf8'));
  const recoverable =
    pastCheckpoint || (id !== undefined && ((await oracle.inStream(id)) || !(await oracle.isDone(id))));
  if (!recoverable) {
    throw new AppError(
      `${path} ends with an incomplete line (bytes ${from}–${size}, sample ${id ?? 'unknown'}) whose result is no longer in Redis: ` +
        `the sink will not cut it. Repair or remove that line by hand${id === undefined ? '' : ` (and remove ${id} from the dataset's done set so it is generated again)`}, then start again`,
    );
  }
  log.warn(
    { path, from, size, sample: id },
    'cutting an incomplete last line; its result is written again from Redis or generated again',
  );
  await truncate(path, from);
}

/** The sample id at the start of a result line (`{"id":"…",…`), without parsing the rest. */
export function sampleIdOfLine(text: string): string | undefined {
  const m = /^\{"id":("(?:[^"\\]|\\.)*")/.exec(text);
  if (m?.[1] !== undefined) return JSON.parse(m[1]) as string;
  return undefined;
}

/** Size of the file and the length of its prefix that ends with '\n' (or is empty). */
async function completeLength(path: string): Promise<{ complete: number; size: number }> {
  const fh = await open(path, 'r');
  try {
    const { size } = await fh.stat();
    const chunk = Buffer.alloc(64 * 1024);
    let end = size;
    while (end > 0) {
      const start = Math.max(0, end - chunk.length);
      const { bytesRead } = await fh.read(chunk, 0, end - start, start);
      const i = chunk.subarray(0, bytesRead).lastIndexOf(0x0a);
      if (i >= 0) return { complete: start + i + 1, size };
      end = start;
    }
    return { complete: 0, size };
  } finally {
    await fh.close();
  }
}
