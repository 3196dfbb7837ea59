/**
 * Tokenizing a conversation dataset on every core: the main thread reads the file's lines and
 * hands them, in batches, to worker threads (tokenize-pool-thread.ts), each with its own
 * tokenizer and template loaded once; the batches' outcomes come back and are counted and
 * yielded in file order by the same {@link ConversationTally} as the one-thread path, so the
 * rows, their order and the counters are the same as {@link rowsFromConversations} gives.
 *
 * Memory is bounded: at most `2 × threads` batches are out (sent, or done and not yet
 * yielded); the file is read no further until the oldest is yielded. A thread that stops
 * (crash, out of memory) fails the read with an error naming the file and the lines it held.
 * Small files, one thread, server-side tokenization, and tokenizers a thread cannot load the
 * same way (a setting only the main thread knows, such as `tokenizer.pattern`: checked with a
 * probe on start) take the one-thread path.
 */
import { stat } from 'node:fs/promises';
import os from 'node:os';
import type { Worker } from 'node:worker_threads';

import { AppError, errorMessage, logger as componentLogger } from '../../shared/index.js';
import { startModuleThread } from '../../shared/index.js';
import type { TokenizeContext, TokenizedRow } from './tokenize-context.js';
import {
  ConversationTally,
  assertConversationFile,
  emptyConversationStats,
  rowsFromConversations,
  type ConversationTokenizeStats,
  type RowsFromConversationsOptions,
} from './tokenize-conversations.js';
import { jsonLines } from './tokenize-lines.js';
import {
  contextFingerprint,
  unpackOutcome,
  type BatchRequest,
  type PackedOutcomes,
  type ThreadInit,
  type ThreadReply,
} from './tokenize-pool-messages.js';

/** A batch is sent once it holds this many lines… */
const BATCH_LINES = 256;
/** …or this many characters. */
const BATCH_CHARS = 1 << 20;
/** Files smaller than this are tokenized on the calling thread: starting threads costs more. */
export const POOL_MIN_BYTES = 4 * 1024 * 1024;

function startThread(workerData: ThreadInit): Worker {
  return startModuleThread(import.meta.url, 'tokenize-pool-thread', workerData);
}

interface PendingBatch {
  firstLine: number;
  lastLine: number;
  resolve(result: PackedOutcomes): void;
  reject(error: Error): void;
}

interface PoolThread {
  index: number;
  worker: Worker;
  pending: Map<number, PendingBatch>;
}

export interface TokenizePoolOptions {
  threads: number;
  ctx: TokenizeContext;
  /** The file being tokenized, for error messages. */
  file: string;
}

/** Worker threads that tokenize batches of conversation lines (see the module comment). */
export class TokenizePool {
  readonly #threads: PoolThread[] = [];
  readonly #file: string;
  #nextBatch = 0;
  #failure: AppError | undefined;
  #closing = false;

  private constructor(opts: TokenizePoolOptions) {
    this.#file = opts.file;
  }

  /**
   * Starts `opts.threads` threads and waits until each has loaded its tokenizer. Resolves to the
   * pool, or to the reason the threads cannot be used (their tokenizer differs from
   * `opts.ctx`'s); rejects when a thread cannot start.
   */
  static async start(opts: TokenizePoolOptions): Promise<TokenizePool | { unusable: string }> {
    const kind = opts.ctx.tokenizer.encoderKind;
    // Server-side tokenization gives no local ids to conversation datasets.
    if (kind === 'server') return { unusable: 'tokenizer.kind server' };
    const pool = new TokenizePool(opts);
    const init: ThreadInit = {
      tokenizerDir: opts.ctx.tokenizer.dir,
      kind,
      ...opts.ctx.tokenizer.tiktokenOverrides,
      keepTruncated: opts.ctx.keepTruncated,
      fingerprint: contextFingerprint(opts.ctx),
    };
    if (opts.ctx.templateKwargs !== undefined) init.templateKwargs = opts.ctx.templateKwargs;
    const ready: Promise<ThreadReply>[] = [];
    for (let index = 0; index < opts.threads; index++) {
      const worker = startThread(init);
      const thread: PoolThread = { index, worker, pending: new Map() };
      pool.#threads.push(thread);
      ready.push(pool.#watch(thread));
    }
    let replies: ThreadReply[];
    try {
      replies = await Promise.all(ready);
    } catch (e: unknown) {
      await pool.close();
      throw e;
    }
    const unusable = replies.find((r) => r.type !== 'ready');
    if (unusable !== undefined) {
      await pool.close();
      if (unusable.type === 'mismatch') return { unusable: unusable.detail };
      throw new AppError(
        `tokenize threads for ${opts.file} could not start: ${unusable.type === 'failed' ? unusable.message : unusable.type}`,
      );
    }
    return pool;
  }

  /** Number of threads. */
  get size(): number {
    return this.#threads.length;
  }

  /** Wires a thread's events; resolves with its first reply (ready, mismatch or failed). */
  #watch(thread: PoolThread): Promise<ThreadReply> {
    return new Promise<ThreadReply>((resolveStart, rejectStart) => {
      let started = false;
      const stopped = (why: string): void => {
        if (this.#closing) return;
        const held = [...thread.pending.values()];
        const lines =
          held.length === 0
            ? 'no lines in hand'
            : `lines ${Math.min(...held.map((b) => b.firstLine))}–${Math.max(...held.map((b) => b.lastLine))}`;
        const error = new AppError(
          `tokenize thread ${thread.index + 1} of ${this.#threads.length} stopped (${why}) while tokenizing ${this.#file}, ${lines}`,
          { retryable: true },
        );
        this.#failure ??= error;
        for (const b of held) b.reject(error);
        thread.pending.clear();
        if (!started) rejectStart(error);
      };
      thread.worker.on('message', (reply: ThreadReply) => {
        if (reply.type !== 'result') {
          started = true;
          resolveStart(reply);
          return;
        }
        const batch = thread.pending.get(reply.result.batch);
        if (batch === undefined) return;
        thread.pending.delete(reply.result.batch);
        batch.resolve(reply.result);
      });
      thread.worker.on('error', (e: Error) => stopped(errorMessage(e)));
      thread.worker.on('messageerror', (e: Error) => stopped(`unreadable message: ${errorMessage(e)}`));
      thread.worker.on('exit', (code) => stopped(`exit code ${code}`));
    });
  }

  /** Tokenizes lines `firstLine..lastLine` (`numbers`, `lines`: the non-blank ones) on the least busy thread. */
  submit(lines: string[], numbers: readonly number[]): Promise<PackedOutcomes> {
    if (this.#failure !== undefined) return Promise.reject(this.#failure);
    let thread = this.#threads[0];
    for (const t of this.#threads) if (thread === undefined || t.pending.size < thread.pending.size) thread = t;
    if (thread === undefined) return Promise.reject(new AppError('tokenize pool has no threads'));
    const chosen = thread;
    const batch = this.#nextBatch++;
    const request: BatchRequest = { batch, lines };
    return new Promise<PackedOutcomes>((resolve, reject) => {
      chosen.pending.set(batch, {
        firstLine: numbers[0] ?? 0,
        lastLine: numbers[numbers.length - 1] ?? 0,
        resolve,
        reject,
      });
      chosen.worker.postMessage(request);
    });
  }

  /** Stops a thread abruptly, as a crash would; the pool then fails as it does for one (fault tests). */
  async crashThread(index: number): Promise<void> {
    await this.#threads[index]?.worker.terminate();
  }

  /** Stops every thread. */
  async close(): Promise<void> {
    this.#closing = true;
    await Promise.all(this.#threads.map((t) => t.worker.terminate()));
  }
}

export interface RowsFromConversationsPooledOptions extends RowsFromConversationsOptions {
  /** Threads (`postprocess.tokenizeThreads`); default one per core. 1 = no threads. */
  threads?: number | undefined;
  /** Files smaller than this (bytes) are read on this thread; default {@link POOL_MIN_BYTES}. */
  minPoolBytes?: number;
  /** Lines a batch holds at most; default 256. */
  batchLines?: number;
  /** Called with the pool once it has started (fault tests). */
  onPoolStarted?: (pool: TokenizePool) => void;
}

/** Default thread count: one per core. */
export function defaultTokenizeThreads(): number {
  return os.availableParallelism();
}

/**
 * The rows of a conversation dataset, as {@link rowsFromConversations} gives them (same rows,
 * order, counters, invalid-line handling), tokenized by `threads` worker threads when the file
 * is large enough (see the module comment).
 */
export async function* rowsFromConversationsPooled(
  file: string,
  opts: RowsFromConversationsPooledOptions,
): AsyncGenerator<TokenizedRow, ConversationTokenizeStats, undefined> {
  const stats = opts.stats ?? emptyConversationStats();
  const log = opts.logger ?? componentLogger('tokenize', { dataset: opts.dataset, file });
  const single = { ...opts, stats, logger: log };
  const threads = opts.threads ?? defaultTokenizeThreads();
  await assertConversationFile(file);
  const bytes = (await stat(file)).size;
  if (threads <= 1 || bytes < (opts.minPoolBytes ?? POOL_MIN_BYTES)) return yield* rowsFromConversations(file, single);

  const started = await TokenizePool.start({ threads, ctx: opts.ctx, file });
  if (!(started instanceof TokenizePool)) {
    log.warn({ reason: started.unusable }, 'tokenize threads not used: tokenizing on one thread');
    return yield* rowsFromConversations(file, single);
  }
  const pool = started;
  log.info({ threads, bytes }, 'tokenizing the conversation file on threads');
  opts.onPoolStarted?.(pool);
  const tally = new ConversationTally(stats, file, opts.dataset, log);
  const maxOut = 2 * threads;
  const batchLines = opts.batchLines ?? BATCH_LINES;
  const out: { numbers: number[]; result: Promise<PackedOutcomes> }[] = [];
  try {
    let lines: string[] = [];
    let numbers: number[] = [];
    let chars = 0;
    const send = (): void => {
      const result = pool.submit(lines, numbers);
      // Awaited in order below; a rejection before then is not unhandled.
      result.catch(() => undefined);
      out.push({ numbers, result });
      lines = [];
      numbers = [];
      chars = 0;
    };
    async function* drainOldest(): AsyncGenerator<TokenizedRow> {
      const oldest = out.shift();
      if (oldest === undefined) return;
      const packed = await oldest.result;
      for (let i = 0; i < oldest.numbers.length; i++) {
        const row = tally.add(oldest.numbers[i] ?? 0, unpackOutcome(packed, i));
        if (row !== undefined) yield row;
      }
    }
    for await (const { line, text } of jsonLines(file)) {
      lines.push(text);
      numbers.push(line);
      chars += text.length;
      if (lines.length < batchLines && chars < BATCH_CHARS) continue;
      send();
      while (out.length >= maxOut) yield* drainOldest();
    }
    if (lines.length > 0) send();
    while (out.length > 0) yield* drainOldest();
    return stats;
  } finally {
    await pool.close();
  }
}
