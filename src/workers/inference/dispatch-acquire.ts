import { randomBytes } from 'node:crypto';
import { AppError, budgetMarginOf, type BudgetMargins, type RunKeys, type ScriptedRedis } from '../../shared/index.js';
import type { Task } from './dispatch-queue.js';
import type { Endpoint } from './endpoint-pool.js';

/**
 * Request ids end in `#<this process's random tag><a counter>`: unique across processes and
 * restarts without a random draw per request.
 */
const RID_TAG = randomBytes(4).toString('hex');
let ridCounter = 0;

/** A fresh request id for a sample: `<dataset>/<sample id>#<tag><n>`. */
export function newRid(dataset: string, sampleId: string): string {
  ridCounter += 1;
  return `${dataset}/${sampleId}#${RID_TAG}${ridCounter.toString(36)}`;
}

/** Crashes a sample must have been in flight for before it is sent on probation. */
const CRASHES_BEFORE_PROBATION = 2;

/** One sample's acquire in a batch: its request id, the endpoint group asked last, and the script's answer. */
export interface AcquireAttempt {
  task: Task;
  rid: string;
  probation: boolean;
  /** acquire-request.lua's code (see `decodeAcquire`). */
  code: number;
  group: Endpoint[];
  leaseKeys: string[];
  /** When (this process's monotonic clock, `performance.now()`) the acquire was put on its way: the lease holds at least until then plus the TTL. */
  sentMs: number;
  error?: unknown;
}

/** A pipeline of this connection, with the scripts as commands. */
export type RedisPipeline = ScriptedRedis & { exec(): Promise<[Error | null, unknown][] | null> };

/** What one pass over the samples in line has found so far. */
export interface PumpPass {
  /** Datasets found budget-reserved or paused: the rest of their samples wait for the next pass. */
  blocked: Set<string>;
  /** Datasets blocked in the last pass that got their one probe in this one. */
  probed: Set<string>;
  retryInMs: number;
  noSlot: boolean;
  failure: unknown;
}

export function newPass(): PumpPass {
  return { blocked: new Set(), probed: new Set(), retryInMs: Infinity, noSlot: false, failure: undefined };
}

/** One attempt per task, each with a fresh request id; the tasks are marked acquiring. */
export function newAttempts(batch: readonly Task[]): AcquireAttempt[] {
  return batch.map((task) => {
    task.state = 'acquiring';
    return {
      task,
      rid: newRid(task.req.dataset, task.req.sample.id),
      probation: task.crashes >= CRASHES_BEFORE_PROBATION,
      code: -1,
      group: [],
      leaseKeys: [],
      sentMs: performance.now(),
    };
  });
}

/**
 * Puts each reply of a pipeline into its attempts: the script's code, or the error. `calls`
 * are the attempts of each acquire-request.lua call, as {@link addAcquires} returned them;
 * `replies` start with the first of these calls.
 */
export function readAcquires(
  calls: readonly AcquireAttempt[][],
  replies: readonly [Error | null, unknown][] | null,
): void {
  calls.forEach((call, i) => {
    const reply = replies?.[i];
    const error = reply === undefined ? new AppError('Redis sent no reply to an acquire of a pipeline') : reply[0];
    const codes = reply?.[1];
    call.forEach((a, j) => {
      if (error !== null) a.error = error;
      else a.code = Number(Array.isArray(codes) ? codes[j] : codes);
    });
  });
}

export interface AcquireSettings {
  keys: RunKeys;
  leaseTtlMs: number;
  minCommitsForMean: number;
  crashProbationMs: number;
  /** `datasets[].budgetMarginSd` (acquire-request.lua ARGV[10]). */
  budgetMarginSd: BudgetMargins;
  /** Datasets in `budget: strict`: their progress is streamed, so it is not scaled by {@link TIMED_PROGRESS_FACTOR}. */
  strictDatasets: ReadonlySet<string>;
}

/**
 * Factor on the progress acquire-request.lua estimates from a request's running time (ARGV[11])
 * when nothing is streamed: the decode rate it multiplies is a whole-life average of recent
 * requests (queueing, prefill and lag included), and the requests left at a dataset's end decode
 * faster as the batch empties. Taken too low, progress under-reserves (the 8 x 150 benchmark
 * ended 4-6 % over at sigma 1.0 without it); taken too high, it only holds back more.
 */
export const TIMED_PROGRESS_FACTOR = 1.25;

/**
 * Adds acquire-request.lua calls for `attempts` to `pipeline`, for the endpoints of one cap
 * group: one call per run of consecutive attempts of the same dataset, so the script decides
 * them in the order given, each as if alone. Returns the attempts of each call, for
 * {@link readAcquires}.
 */
export function addAcquires(
  pipeline: RedisPipeline,
  attempts: readonly AcquireAttempt[],
  group: Endpoint[],
  cap: number,
  s: AcquireSettings,
): AcquireAttempt[][] {
  const { keys } = s;
  const leaseKeys = group.map((e) => keys.endpointLeases(e.url));
  const calls: AcquireAttempt[][] = [];
  for (const a of attempts) {
    a.group = group;
    a.leaseKeys = leaseKeys;
    const last = calls[calls.length - 1];
    if (last !== undefined && last[0]?.task.req.dataset === a.task.req.dataset) last.push(a);
    else calls.push([a]);
  }
  for (const call of calls) {
    const [first, ...more] = call;
    if (first === undefined) continue;
    const { dataset } = first.task.req;
    const args: (string | number)[] = [
      4 + leaseKeys.length,
      keys.stats(dataset),
      keys.inflight(dataset),
      keys.done(dataset),
      keys.queueMeta(dataset),
      ...leaseKeys,
      first.rid,
      s.leaseTtlMs,
      first.task.req.priorExpectedTokens,
      cap,
      s.minCommitsForMean,
      first.probation ? 1 : 0,
      s.crashProbationMs,
      first.task.req.sample.id,
      first.task.req.sample.maxNewTokens,
      budgetMarginOf(s.budgetMarginSd, dataset),
      s.strictDatasets.has(dataset) ? 1 : TIMED_PROGRESS_FACTOR,
    ];
    for (const a of more)
      args.push(
        a.rid,
        a.task.req.priorExpectedTokens,
        a.probation ? 1 : 0,
        a.task.req.sample.id,
        a.task.req.sample.maxNewTokens,
      );
    const [numKeys, ...keysAndArgs] = args as [number, ...(string | number)[]];
    void pipeline.acquireRequest(numKeys, ...keysAndArgs);
  }
  return calls;
}
