import { mkdir, open, readFile, stat, truncate, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { AppError, ProcessLock, logger as componentLogger, writeFileAtomic, type Logger, type RunKeys } from '../shared/index.js';

/** Points at which a sink can be made to crash, to test recovery with real process kills. */
export type SinkCrashPoint = 'after-write' | 'after-checkpoint';

export interface ResultsSinkOptions {
  /** A dedicated `worker`-role connection: the sink blocks on XREAD. */
  redis: Redis;
  keys: RunKeys;
  dataset: string;
  /** `<runDir>/<dataset>/generations`. */
  dir: string;
  /** A part file is closed and a new one started past this size. */
  maxPartBytes?: number;
  /** Entries read per XREAD. */
  readCount?: number;
  /** Test hook: SIGKILL this process at that point of the first write. */
  crashAt?: SinkCrashPoint;
  logger?: Logger;
}

interface Checkpoint {
  /** Current part file name. */
  part: string;
  /** Bytes of that part that are durably written and accounted for. */
  bytes: number;
  /** Id of the last stream entry written to disk. */
  lastId: string;
  /** Records written so far, over all parts. */
  records: number;
}

const CHECKPOINT = '.sink-checkpoint.json';
const LOCK_TTL_MS = 15_000;

/**
 * Drains one dataset's results stream into `generations/part-NNNNN.jsonl` (DESIGN invariant 5),
 * exactly once across crashes:
 *
 * 1. append the entries' lines to the part file and fsync it;
 * 2. write the checkpoint (part, byte length, last entry id) atomically (temp file + rename);
 * 3. delete the entries from Redis.
 *
 * On start, a part longer than its checkpoint is cut back to it (a crash between 1 and 2:
 * those entries are still in Redis and are written again), and entries up to the checkpoint's
 * id are deleted (a crash between 2 and 3). One sink per dataset runs at a time (a Redis lock).
 */
export class ResultsSink {
  private readonly log: Logger;
  private readonly lock: ProcessLock;
  private checkpoint: Checkpoint = { part: partName(0), bytes: 0, lastId: '0-0', records: 0 };
  private file: FileHandle | undefined;
  private stopping = false;
  private loop: Promise<void> | undefined;
  private idleWaiters: (() => void)[] = [];

  constructor(private readonly options: ResultsSinkOptions) {
    this.log = options.logger ?? componentLogger('results-sink', { dataset: options.dataset });
    this.lock = new ProcessLock(options.redis, options.keys.sinkLock(options.dataset), LOCK_TTL_MS, this.log);
  }

  /** Records written to disk so far. */
  get records(): number {
    return this.checkpoint.records;
  }

  async start(): Promise<void> {
    await mkdir(this.options.dir, { recursive: true });
    await this.acquireLock();
    await this.recover();
    this.loop = this.run();
  }

  /** Resolves once the stream has been read to its end (at the time of the call) and written. */
  async drained(): Promise<void> {
    const { redis, keys, dataset } = this.options;
    for (;;) {
      const len = await redis.xlen(keys.results(dataset));
      if (len === 0 || this.stopping) return;
      await new Promise<void>((r) => this.idleWaiters.push(r));
    }
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await this.loop;
    await this.file?.close();
    this.file = undefined;
    await this.lock.release();
  }

  private async acquireLock(): Promise<void> {
    const ok = await this.lock.acquire({
      onWait: (holder) => this.log.info({ holder }, 'another sink holds this dataset; waiting for it'),
    });
    if (!ok) throw new AppError('sink stopped before it could start');
  }

  private async recover(): Promise<void> {
    const { redis, keys, dataset, dir } = this.options;
    try {
      this.checkpoint = JSON.parse(await readFile(join(dir, CHECKPOINT), 'utf8')) as Checkpoint;
    } catch (e: unknown) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    const path = join(dir, this.checkpoint.part);
    const size = await stat(path).then((s) => s.size, () => -1);
    if (size > this.checkpoint.bytes) {
      this.log.warn({ part: this.checkpoint.part, size, checkpoint: this.checkpoint.bytes }, 'cutting unconfirmed tail of part file; its entries are still in Redis');
      await truncate(path, this.checkpoint.bytes);
    }
    // Entries written and checkpointed but not yet deleted.
    const stale = await redis.xrange(keys.results(dataset), '-', this.checkpoint.lastId);
    if (stale.length > 0) await redis.xdel(keys.results(dataset), ...stale.map(([id]) => id));
    this.file = await open(path, 'a');
  }

  private async run(): Promise<void> {
    const { redis, keys, dataset } = this.options;
    try {
      while (!this.stopping) {
        const res = (await redis.xread('COUNT', this.options.readCount ?? 1_000, 'BLOCK', 200, 'STREAMS', keys.results(dataset), this.checkpoint.lastId)) as
          | [string, [string, string[]][]][]
          | null;
        const entries = res?.[0]?.[1] ?? [];
        if (entries.length === 0) {
          for (const w of this.idleWaiters.splice(0)) w();
          continue;
        }
        await this.write(entries);
        for (const w of this.idleWaiters.splice(0)) w();
      }
    } catch (e: unknown) {
      if (!this.stopping) {
        this.log.error({ err: e }, 'results sink failed');
        throw e;
      }
    } finally {
      for (const w of this.idleWaiters.splice(0)) w();
    }
  }

  private async write(entries: [string, string[]][]): Promise<void> {
    const { redis, keys, dataset, dir } = this.options;
    const file = this.file;
    if (file === undefined) throw new AppError('sink not started');
    let text = '';
    for (const [, fields] of entries) {
      const i = fields.indexOf('r');
      const record = i >= 0 ? fields[i + 1] : undefined;
      if (record !== undefined) text += `${record}\n`;
    }
    const bytes = Buffer.byteLength(text);
    // 1. data, durably
    await file.write(text);
    await file.sync();
    if (this.options.crashAt === 'after-write') process.kill(process.pid, 'SIGKILL');
    // 2. checkpoint, atomically
    const lastEntry = entries[entries.length - 1];
    const next: Checkpoint = {
      part: this.checkpoint.part,
      bytes: this.checkpoint.bytes + bytes,
      lastId: lastEntry?.[0] ?? this.checkpoint.lastId,
      records: this.checkpoint.records + entries.length,
    };
    await writeCheckpoint(dir, next);
    this.checkpoint = next;
    if (this.options.crashAt === 'after-checkpoint') process.kill(process.pid, 'SIGKILL');
    // 3. the entries leave Redis
    await redis.xdel(keys.results(dataset), ...entries.map(([id]) => id));
    if (next.bytes >= (this.options.maxPartBytes ?? 256 * 1024 * 1024)) await this.rotate();
  }

  private async rotate(): Promise<void> {
    await this.file?.close();
    const n = Number(/(\d+)/.exec(this.checkpoint.part)?.[1] ?? 0) + 1;
    this.checkpoint = { ...this.checkpoint, part: partName(n), bytes: 0 };
    await writeCheckpoint(this.options.dir, this.checkpoint);
    this.file = await open(join(this.options.dir, this.checkpoint.part), 'a');
  }
}

function partName(n: number): string {
  return `part-${String(n).padStart(5, '0')}.jsonl`;
}

function writeCheckpoint(dir: string, cp: Checkpoint): Promise<void> {
  return writeFileAtomic(join(dir, CHECKPOINT), JSON.stringify(cp));
}
