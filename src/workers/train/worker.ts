import { TRAIN_MAX_STALLED_COUNT, TRAIN_QUEUE, TrainKeys, type RunKeys, type TrainResult } from '../../shared/index.js';
import { GpuWorker, JOB_LOG_MAX_LINES, type GpuJobKind, type GpuWorkerOptions } from '../gpu/index.js';
import type { EnvFingerprint } from './fingerprint.js';
import { processTrain, type PreviousRun } from './processor.js';
import { keepHiddenStatesOf, recordHiddenStates, trainStatusPlace } from './train-jobs.js';

export type TrainWorkerOptions = GpuWorkerOptions;

/**
 * The train worker (`tokenmill worker --role train`): takes one train job at a time, and only
 * when this machine has the GPUs it needs with enough free memory; otherwise the job goes back
 * as delayed (not failed) and `status` says why, until memory frees. A running command gets
 * SIGTERM when the worker stops (SIGKILL after `train.cancelGraceMs`), and its job fails, or goes
 * back to the queue with `train.autoResume`.
 */
export class TrainWorker extends GpuWorker<TrainResult> {
  constructor(options: TrainWorkerOptions) {
    super(options, trainJobs(options.keys));
  }
}

/** Train jobs as the GPU worker shell runs them. */
function trainJobs(keys: RunKeys): GpuJobKind<TrainResult> {
  const tk = new TrainKeys(keys);
  return {
    queue: TRAIN_QUEUE,
    maxStalledCount: TRAIN_MAX_STALLED_COUNT,
    status: trainStatusPlace(keys),
    cancelKey: (jobId) => tk.cancel(jobId),
    logFull: `… output continues in train.log (only the first ${JOB_LOG_MAX_LINES} lines are copied here)`,
    async taken({ job, redis, seenBefore }) {
      if (seenBefore) return;
      const chain = (job.data as { chain?: unknown }).chain;
      await keepHiddenStatesOf(redis, keys, typeof chain === 'string' ? chain : null);
    },
    process: ({ job, redis, seenBefore, deps }) =>
      processTrain(job.data, {
        ...deps,
        previousRun: async () => (seenBefore ? previousRunOf(await redis.hgetall(tk.status())) : null),
        lastGoodEnv: async () => {
          const v = await redis.get(tk.lastGoodEnv());
          return v === null ? null : (JSON.parse(v) as EnvFingerprint);
        },
        saveGoodEnv: async (fp) => {
          await redis.set(tk.lastGoodEnv(), JSON.stringify(fp));
        },
        recordHiddenStates: (entry) => recordHiddenStates(redis, keys, entry),
        reportProgress: (p) => job.updateProgress(p),
      }),
  };
}

function previousRunOf(h: Record<string, string>): PreviousRun | null {
  if (h.state === undefined) return null;
  const pid = Number(h.pid);
  return {
    state: h.state as PreviousRun['state'],
    worker: h.worker ?? null,
    host: h.host ?? null,
    pid: h.pid !== undefined && h.pid !== '' && Number.isInteger(pid) ? pid : null,
    pidIdentity: h.pidIdentity === undefined || h.pidIdentity === '' ? null : h.pidIdentity,
    attempt: h.attempt ?? null,
  };
}
