/**
 * The frame every GPU job runs in (a training, an evaluation): checks before the GPUs, the
 * preflight (start now, or wait), the work watched (the cancel flag polled, the worker's shutdown
 * heard), then what its end means, each written to the job's status. A kind of job gives one short
 * function per phase ({@link GpuJobPhases}); {@link runGpuJob} calls them in order.
 */
import type { Logger } from '../../shared/index.js';
import type { GpuProbe } from './gpus.js';
import type { JobPhase } from './job-status.js';

/** How a GPU job ends: done (its result), not startable yet (wait, then again), or handed back (the worker stops). */
export type GpuJobOutcome<R> =
  { kind: 'done'; result: R } | { kind: 'wait'; reason: string } | { kind: 'requeue'; reason: string };

/** What every GPU job needs from its worker: Redis, BullMQ and the machine, as functions. */
export interface GpuJobDeps {
  jobId: string;
  workerId: string;
  /** GPU indices this worker may use (`--gpus`); all when omitted. */
  allowedGpus?: readonly number[];
  probeGpus(): Promise<GpuProbe>;
  /** Writes fields of the run's status of this kind of job (and its phase when `phase` is given). */
  setStatus(fields: Record<string, string | number>, phase?: JobPhase): Promise<void>;
  isCancelled(): Promise<boolean>;
  /** Appends a line to the job's log in Bull Board (the worker bounds it). */
  jobLog(line: string): void;
  /** The return value of the job's child in its flow. */
  childResult(): Promise<unknown>;
  /** Aborted when the worker stops (SIGTERM): the work is stopped too. */
  shutdown: AbortSignal;
  logger: Logger;
  /** How often the cancel flag is read while the work runs (ms). Default 500. */
  cancelPollMs?: number;
}

/** Why watched work was stopped: `tokenmill train --cancel`, the worker's shutdown, or not. */
export type Stopping = 'cancel' | 'shutdown' | null;

/** What the work is told: aborted on cancel or shutdown, and which of the two came first. */
export interface StopSignal {
  signal: AbortSignal;
  why(): Stopping;
}

/** How watched work ended: its value or its error, and whether it was stopped. */
export type Watched<T> = { stopping: Stopping } & ({ ok: true; value: T } | { ok: false; error: unknown });

/** A phase's answer: go on with `value`, or end the job with this outcome. */
export type Next<T, R> = { kind: 'go'; value: T } | GpuJobOutcome<R>;

/** The phases of one kind of GPU job, in the order {@link runGpuJob} calls them. */
export interface GpuJobPhases<Ready, Started, Ran, R> {
  /** The kind's error for a job cancelled before it started (never retried). */
  cancelled(message: string): Error;
  /** Before the GPUs: what the job's child left, earlier runs of it; a job with nothing to do ends here. */
  prepare(): Promise<Next<Ready, R>>;
  /** Whether this machine can take the job now (GPUs, memory, disk) and what it runs; or wait. */
  preflight(ready: Ready): Promise<Next<Started, R>>;
  /** The work, watched: `stop` aborts on `tokenmill train --cancel` and on the worker's shutdown. */
  run(started: Started, stop: StopSignal): Promise<Ran>;
  /** What the work's end means, written to the status: done, wait, handed back, or thrown. */
  finish(started: Started, watched: Watched<Ran>): Promise<GpuJobOutcome<R>>;
}

/** Runs one GPU job through its phases (see the module comment). */
export async function runGpuJob<Ready, Started, Ran, R>(
  deps: GpuJobDeps,
  phases: GpuJobPhases<Ready, Started, Ran, R>,
): Promise<GpuJobOutcome<R>> {
  if (await deps.isCancelled()) throw phases.cancelled('cancelled by `tokenmill train --cancel` before it started');
  const ready = await phases.prepare();
  if (ready.kind !== 'go') return ready;
  const started = await phases.preflight(ready.value);
  if (started.kind !== 'go') return started;
  const watched = await watch(deps, (stop) => phases.run(started.value, stop));
  return phases.finish(started.value, watched);
}

/**
 * Runs `work` while the cancel flag is polled (every `cancelPollMs`) and the worker's shutdown
 * is listened to: the first of them aborts the work's signal and names why.
 */
export async function watch<T>(
  deps: Pick<GpuJobDeps, 'isCancelled' | 'shutdown' | 'cancelPollMs'>,
  work: (stop: StopSignal) => Promise<T>,
): Promise<Watched<T>> {
  const abort = new AbortController();
  let stopping: Stopping = null;
  const onShutdown = (): void => {
    stopping ??= 'shutdown';
    abort.abort();
  };
  deps.shutdown.addEventListener('abort', onShutdown, { once: true });
  if (deps.shutdown.aborted) onShutdown();
  const poll = setInterval(() => {
    if (stopping !== null) return;
    void deps.isCancelled().then(
      (c) => {
        if (c && stopping === null) {
          stopping = 'cancel';
          abort.abort();
        }
      },
      () => undefined,
    );
  }, deps.cancelPollMs ?? 500);
  try {
    const value = await work({ signal: abort.signal, why: () => stopping });
    return { stopping, ok: true, value };
  } catch (error: unknown) {
    return { stopping, ok: false, error };
  } finally {
    clearInterval(poll);
    deps.shutdown.removeEventListener('abort', onShutdown);
  }
}
