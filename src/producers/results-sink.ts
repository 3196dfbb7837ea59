import { mkdir, open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import {
  AppError,
  LockLostError,
  ProcessLock,
  describeLockHolder,
  logger as componentLogger,
  withScripts,
  type Logger,
  type RunKeys,
  type ScriptedRedis,
} from '../shared/index.js';
import {
  CHECKPOINT_FILE,
  partName,
  partNumber,
  recoverFiles,
  removeSinkTempFiles,
  sampleIdOfLine,
  sinkDiskError,
  writeCheckpoint,
  type Checkpoint,
} from './sink-checkpoint.js';
import { DiskTailFilter, compareStreamIds, readDiskTail, rebuildFromFiles, restoreDone } from './sink-reconcile.js';

/** Points at which a sink can be made to crash, to test recovery with real process kills. */
export type SinkCrashPoint = 'after-write' | 'after-checkpoint';

export interface ResultsSinkOptions {
  /** A dedicated `worker`-role connection: the sink blocks on XREAD. */
  redis: Redis;
  /**
   * A connection that never blocks, for {@link ResultsSink.drained}'s check of the stream
   * (one sent on `redis` waits behind the XREAD in progress, up to its 200 ms block).
   * Default: `redis`.
   */
  probe?: Redis;
  keys: RunKeys;
  dataset: string;
  /** `<runDir>/<dataset>/generations`. */
  dir: string;
  /** A part file is closed and a new one started past this size. */
  maxPartBytes?: number;
  /** Entries read per XREAD. */
  readCount?: number;
  /** The sink lock's time to live; default 15 s. */
  lockTtlMs?: number;
  /** While another sink holds the lock, who holds it is logged this often; default 10 s. */
  waitReportMs?: number;
  /** On start, records within this of the newest on disk are reconciled with Redis; default 5 min. */
  reconcileWindowMs?: number;
  /** Test hook: SIGKILL this process at that point of the first write. */
  crashAt?: SinkCrashPoint;
  /** Lines for a person (the state rebuilt from the files after Redis lost it). */
  notify?: (line: string) => void;
  logger?: Logger;
}

const LOCK_TTL_MS = 15_000;
const RECONCILE_WINDOW_MS = 5 * 60_000;

/**
 * Drains one dataset's results stream into `generations/part-NNNNN.jsonl` (docs/design.md,
 * invariant 5), exactly once across crashes:
 *
 * 1. append the entries' lines to the part file and fsync it;
 * 2. write the checkpoint (part, byte length, last entry id) atomically (temp file + rename);
 * 3. delete the entries from Redis.
 *
 * On start the part files are the truth ({@link recoverFiles}): complete lines are never cut; a
 * missing checkpoint is rebuilt from them; a part shorter than its checkpoint stops the sink
 * with a message. The end of the files is then reconciled with Redis (sink-reconcile.ts): a
 * result whose sample is already on disk is dropped instead of written again, so a crash
 * between 1 and 3, or Redis losing its last second of writes in an OS crash, neither
 * duplicates nor loses a line, and the counters equal the files. A running sink does the same
 * when Redis restarts under it: each read names the server's run id, and a new one is
 * reconciled with before anything more is written.
 *
 * **Guarantee:** every committed result is written once, and the dataset's counters equal the
 * sum over its lines, across kills of any process, Redis restarts on its AOF, and an OS crash
 * losing its last writes (`appendfsync everysec`: about a second; anything within the
 * reconcile window, 5 min, is covered). Not covered: a part file losing fsynced data, or
 * workers' clocks differing by more than the window. `WAITAOF` (Redis >= 7.2) is not used.
 *
 * **One writer (fencing):** one sink per dataset holds a Redis lock whose value is its token.
 * Each batch first confirms the lock (compare-and-extend) and trims Redis only while holding it
 * (one script). A sink that finds its lock lost — it lapsed during a Redis outage or a freeze
 * longer than its TTL, and another sink took over — writes nothing more and stops: the sink
 * fails ({@link failed} rejects), the process that runs it ends with that error, and the other
 * sink carries on. A second sink waits, logging who holds the lock. Limit: a sink frozen in
 * the middle of one batch (after its lock check, before its fsync) for longer than the TTL can
 * still append that batch; the holder then finds the part changed under it, logs an error and
 * recovers from the files.
 */
export class ResultsSink {
  private readonly log: Logger;
  private readonly redis: ScriptedRedis;
  private readonly lock: ProcessLock;
  private checkpoint: Checkpoint = { part: partName(0), bytes: 0, lastId: '0-0', records: 0 };
  private file: FileHandle | undefined;
  private tail = new DiskTailFilter(new Map(), undefined);
  private stopping = false;
  private failure: Error | undefined;
  private rejectFailed: (e: Error) => void = () => undefined;
  private loop: Promise<void> | undefined;
  private idleWaiters: (() => void)[] = [];
  /** The Redis server instance (INFO `run_id`) the sink last reconciled with. */
  private serverRunId: string | undefined;
  /** Counts closes of the sink's connection: a read that spans one may come from another server. */
  private connectionEpoch = 0;
  private readonly onConnectionClose = (): void => {
    this.connectionEpoch += 1;
  };
  /** Rejects when the sink stops on an error of its own (e.g. its lock was lost); never resolves. */
  readonly failed: Promise<never>;

  constructor(private readonly options: ResultsSinkOptions) {
    this.log = options.logger ?? componentLogger('results-sink', { dataset: options.dataset });
    this.redis = withScripts(options.redis);
    this.lock = new ProcessLock(
      options.redis,
      options.keys.sinkLock(options.dataset),
      options.lockTtlMs ?? LOCK_TTL_MS,
      this.log,
    );
    this.lock.onLost((e) => this.fail(e));
    this.failed = new Promise<never>((_, reject) => {
      this.rejectFailed = reject;
    });
    this.failed.catch(() => undefined);
    options.redis.on('close', this.onConnectionClose);
  }

  /** Records written to disk so far. */
  get records(): number {
    return this.checkpoint.records;
  }

  async start(): Promise<void> {
    await mkdir(this.options.dir, { recursive: true });
    await this.acquireLock();
    try {
      await removeSinkTempFiles(this.options.dir, this.log);
      await this.recover();
    } catch (e: unknown) {
      await this.file?.close();
      await this.lock.release();
      throw e;
    }
    this.loop = this.run();
  }

  /** Resolves once the stream has been read to its end (at the time of the call) and written; rejects if the sink failed. */
  async drained(): Promise<void> {
    const { redis, keys, dataset } = this.options;
    for (;;) {
      if (this.failure !== undefined) throw this.failure;
      const len = await (this.options.probe ?? redis).xlen(keys.results(dataset));
      if (len === 0 || this.stopping) {
        if (this.failure !== undefined) throw this.failure;
        return;
      }
      await new Promise<void>((r) => this.idleWaiters.push(r));
    }
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await this.loop;
    await this.file?.close();
    this.file = undefined;
    this.options.redis.off('close', this.onConnectionClose);
    await this.lock.release();
  }

  private fail(e: Error): void {
    if (this.failure !== undefined) return;
    this.failure = e;
    this.stopping = true;
    this.log.error({ err: e }, 'results sink stopped');
    this.rejectFailed(e);
    for (const w of this.idleWaiters.splice(0)) w();
  }

  private async acquireLock(): Promise<void> {
    const key = this.options.keys.sinkLock(this.options.dataset);
    const ok = await this.lock.acquire({
      waitReportMs: this.options.waitReportMs ?? 10_000,
      onWait: (holder) =>
        this.log.warn(
          { lock: key, holder: holder?.token ?? null },
          `dataset ${this.options.dataset}: another process writes its results (${holder === undefined ? 'holder unknown' : describeLockHolder(holder)}); ` +
            `waiting until it stops or its lock lapses (${this.lock.ttl / 1000} s after it dies). If it is running, stop one of the two`,
        ),
    });
    if (!ok) throw new AppError('sink stopped before it could start');
  }

  /** Files first (they are the truth), then Redis: lost commits restored, trimmed entries found again. */
  private async recover(): Promise<void> {
    const { redis, keys, dataset, dir } = this.options;
    const stream = keys.results(dataset);
    // First: a restart during the reconciliation is then seen at the next read.
    this.serverRunId = await this.redisRunId();
    await this.file?.close();
    this.file = undefined;
    const { checkpoint, adoptedFrom } = await recoverFiles(
      dir,
      {
        inStream: (id) => this.streamHolds(id),
        isDone: async (id) => (await redis.sismember(keys.done(dataset), id)) === 1,
      },
      this.log,
    );
    this.checkpoint = checkpoint;
    await this.rebuildIfLost(checkpoint);
    const tail = await readDiskTail(dir, checkpoint, {
      windowMs: this.options.reconcileWindowMs ?? RECONCILE_WINDOW_MS,
      minLines: 2 * (this.options.readCount ?? 1_000),
      mustReadFrom: adoptedFrom,
      log: this.log,
    });
    const restored = await restoreDone(this.redis, keys, dataset, tail);
    if (restored > 0)
      this.log.warn(
        { restored },
        'restored samples on disk that Redis had lost (its last writes before a crash); they are not generated again',
      );
    // From here on a commit of a sample in `tail` is refused, so only entries up to the newest can repeat one.
    const newest = await redis.xrevrange(stream, '+', '-', 'COUNT', 1);
    this.tail = new DiskTailFilter(tail, newest[0]?.[0]);
    this.file = await open(join(dir, this.checkpoint.part), 'a');
    // Entries up to the checkpoint were written but not trimmed (a crash before the trim):
    // passed through write(), which drops those on disk and writes any that are not.
    const stale = (await redis.xrange(stream, '-', this.checkpoint.lastId)) as [string, string[]][];
    if (stale.length > 0) await this.write(stale);
  }

  /**
   * Redis holds no committed sample of a dataset whose files have records (a new, empty server;
   * a deleted AOF): the files are the truth, so every sample on disk is committed again before the producer reads
   * the done set (it starts after the sinks), and none is generated twice.
   */
  private async rebuildIfLost(checkpoint: Checkpoint): Promise<void> {
    const { redis, keys, dataset, dir } = this.options;
    if (checkpoint.records === 0) return;
    // Only a Redis with no commits of the dataset at all: a Redis that lost just its last writes
    // is reconciled over the end of the files (readDiskTail), which costs the window, not the dataset.
    const held = await redis.scard(keys.done(dataset));
    if (held > 0) return;
    const r = await rebuildFromFiles(this.redis, keys, dataset, dir, checkpoint);
    if (r.restored === 0) return;
    const line =
      `dataset ${dataset}: Redis held ${held} of the ${r.records} samples written in ${dir} (a new or emptied Redis); ` +
      `rebuilt ${r.restored} committed ids and ${r.tokens} output tokens from the files, so none is generated again`;
    this.log.warn({ held, records: r.records, restored: r.restored, tokens: r.tokens }, line);
    this.options.notify?.(line);
  }

  /**
   * Redis restarted under the running sink. On its AOF it may have lost its last writes
   * (`appendfsync everysec`: a second or two, as when it is killed while an fsync is slow):
   * commits whose lines are on disk, trims of entries already written, which then reappear
   * behind the sink's read position. The same reconciliation as on start puts them right
   * before anything more is written: lost commits restored (a sample written is never
   * generated again), reappeared entries dropped, a second commit of a sample on disk dropped.
   */
  private async reconcileRestart(runId: string): Promise<void> {
    this.log.warn(
      { redisRunId: runId, previousRunId: this.serverRunId },
      'Redis restarted under this sink (it may have lost its last writes); reconciling the end of the files with it before writing on',
    );
    await this.lock.confirm();
    await this.recover();
  }

  /** The Redis server's run id (new at every start of the server). */
  private async redisRunId(): Promise<string> {
    const info = await this.options.redis.info('server');
    return /^run_id:(\S+)/m.exec(info)?.[1] ?? '';
  }

  private async streamHolds(sampleId: string): Promise<boolean> {
    const { redis, keys, dataset } = this.options;
    let from = '-';
    for (;;) {
      const batch = (await redis.xrange(keys.results(dataset), from, '+', 'COUNT', 1_000)) as [string, string[]][];
      for (const [, fields] of batch) {
        const record = recordOf(fields);
        if (record !== undefined && recordSampleId(record) === sampleId) return true;
      }
      const last = batch[batch.length - 1];
      if (last === undefined || batch.length < 1_000) return false;
      from = `(${last[0]}`;
    }
  }

  private async run(): Promise<void> {
    const { redis, keys, dataset } = this.options;
    try {
      while (!this.stopping) {
        const epoch = this.connectionEpoch;
        // Sent together on one connection: the run id names the server that answers the read.
        const [runId, res] = await Promise.all([
          this.redisRunId(),
          redis.xread(
            'COUNT',
            this.options.readCount ?? 1_000,
            'BLOCK',
            200,
            'STREAMS',
            keys.results(dataset),
            this.checkpoint.lastId,
          ) as Promise<[string, [string, string[]][]][] | null>,
        ]);
        // Reconnected mid-read (the read may have been sent again, to another server): read again.
        if (epoch !== this.connectionEpoch) continue;
        if (runId !== this.serverRunId) {
          await this.reconcileRestart(runId);
          continue;
        }
        const entries = res?.[0]?.[1] ?? [];
        if (entries.length > 0 && !this.stopping) await this.write(entries);
        for (const w of this.idleWaiters.splice(0)) w();
      }
    } catch (e: unknown) {
      // The process running the sink learns it through `failed`, and stops (see the class comment).
      if (e instanceof LockLostError || !this.stopping) this.fail(e instanceof Error ? e : new AppError(String(e)));
    } finally {
      for (const w of this.idleWaiters.splice(0)) w();
    }
  }

  private async write(entries: [string, string[]][]): Promise<void> {
    const { keys, dataset, dir } = this.options;
    const file = this.file;
    if (file === undefined) throw new AppError('sink not started');
    // Fence: this sink still holds its lock, now for a full TTL.
    await this.lock.confirm();
    const confirmedAt = Date.now();
    const path = join(dir, this.checkpoint.part);
    const size = (await file.stat()).size;
    if (size !== this.checkpoint.bytes) {
      // Only a sink that lost its lock writes here meanwhile: its trim was refused, so what it
      // wrote is still in Redis. Recovery keeps its complete lines and drops their entries.
      this.log.error(
        { path, size, expected: this.checkpoint.bytes },
        'the part file changed under this sink (a second sink wrote to it); recovering from the files',
      );
      await this.recover();
      return;
    }
    const token = this.lock.token ?? '';
    let text = '';
    let written = 0;
    const duplicates: (string | number)[] = [];
    const trimmed: string[] = [];
    for (const [entryId, fields] of entries) {
      const record = recordOf(fields);
      if (record === undefined) {
        trimmed.push(entryId);
        continue;
      }
      const onDisk = this.tail.onDisk(entryId, record);
      if (onDisk !== undefined) {
        duplicates.push(entryId, onDisk, recordTokens(record));
        continue;
      }
      text += `${record}\n`;
      written += 1;
      trimmed.push(entryId);
    }
    if (duplicates.length > 0) {
      const dropped = await this.redis.sinkDropDuplicate(
        this.lock.key,
        keys.results(dataset),
        keys.stats(dataset),
        token,
        ...duplicates,
      );
      if (dropped < 0) throw await this.lockLost();
      this.log.warn(
        { dropped },
        'results already on disk were not written again (the counters now equal the lines on disk)',
      );
    }
    const bytes = Buffer.byteLength(text);
    // 1. data, durably
    if (bytes > 0) {
      try {
        await file.write(text);
        await file.sync();
      } catch (e: unknown) {
        throw sinkDiskError(e, path) ?? e;
      }
    }
    if (this.options.crashAt === 'after-write') process.kill(process.pid, 'SIGKILL');
    // A slow disk may have outlived part of the lock's TTL: confirm it before recording the write.
    if (Date.now() - confirmedAt > this.lock.ttl / 3) await this.lock.confirm();
    // 2. checkpoint, atomically
    const lastEntry = entries[entries.length - 1]?.[0] ?? this.checkpoint.lastId;
    const next: Checkpoint = {
      part: this.checkpoint.part,
      bytes: this.checkpoint.bytes + bytes,
      lastId: compareStreamIds(lastEntry, this.checkpoint.lastId) > 0 ? lastEntry : this.checkpoint.lastId,
      records: this.checkpoint.records + written,
    };
    try {
      await writeCheckpoint(dir, next);
    } catch (e: unknown) {
      throw sinkDiskError(e, join(dir, CHECKPOINT_FILE)) ?? e;
    }
    this.checkpoint = next;
    if (this.options.crashAt === 'after-checkpoint') process.kill(process.pid, 'SIGKILL');
    // 3. the entries leave Redis, only while this sink holds the lock
    for (let i = 0; i < trimmed.length; i += 1_000) {
      const n = await this.redis.sinkTrim(this.lock.key, keys.results(dataset), token, ...trimmed.slice(i, i + 1_000));
      if (n < 0) throw await this.lockLost();
    }
    this.tail.passed(lastEntry);
    if (next.bytes >= (this.options.maxPartBytes ?? 256 * 1024 * 1024)) await this.rotate();
  }

  private async lockLost(): Promise<LockLostError> {
    return new LockLostError(this.lock.key, await this.lock.holder().catch(() => undefined));
  }

  private async rotate(): Promise<void> {
    await this.file?.close();
    this.checkpoint = { ...this.checkpoint, part: partName(partNumber(this.checkpoint.part) + 1), bytes: 0 };
    await writeCheckpoint(this.options.dir, this.checkpoint);
    this.file = await open(join(this.options.dir, this.checkpoint.part), 'a');
  }
}

function recordOf(fields: string[]): string | undefined {
  const i = fields.indexOf('r');
  return i >= 0 ? fields[i + 1] : undefined;
}

function recordSampleId(record: string): string | undefined {
  const fast = sampleIdOfLine(record);
  if (fast !== undefined) return fast;
  try {
    return (JSON.parse(record) as { id?: string }).id;
  } catch {
    return undefined;
  }
}

function recordTokens(record: string): number {
  const t = (JSON.parse(record) as { completion_tokens?: unknown }).completion_tokens;
  return typeof t === 'number' ? t : 0;
}
