import { hostname } from 'node:os';
import {
  EVAL_QUEUE,
  EvalKeys,
  type ChatTokenizer,
  type Config,
  type EvalJobResult,
  type Logger,
} from '../../shared/index.js';
import {
  GpuWorker,
  groupAlive,
  killLeftGroup,
  parseIdentity,
  type GpuJobKind,
  type GpuWorkerOptions,
} from '../gpu/index.js';
import { evalStatusPlace, recordEvalReport } from './eval-jobs.js';
import { processEvalJob } from './processor.js';
import type { EvalRunConfig } from './run.js';
import type { RetryPolicy } from './servers.js';

export interface EvalWorkerOptions extends GpuWorkerOptions {
  /** The run's config (datasets, tokenizer, train steps); each job brings its own `eval` section. */
  config: Config;
  /** The run's tokenizer, checked against the servers measured. */
  loadTokenizer(config: EvalRunConfig): Promise<ChatTokenizer>;
  retry?: RetryPolicy;
}

/**
 * The eval queue's worker, run beside the train worker (`tokenmill worker --role train`,
 * `tokenmill train`): one eval job at a time, after each completed training attempt. When it
 * stops, a running eval stops its servers and goes back to the queue.
 */
export class EvalWorker extends GpuWorker<EvalJobResult> {
  constructor(options: EvalWorkerOptions) {
    super(options, evalJobs(options));
  }
}

/** Eval jobs as the GPU worker shell runs them. */
function evalJobs(o: EvalWorkerOptions): GpuJobKind<EvalJobResult> {
  const keys = o.keys;
  return {
    queue: EVAL_QUEUE,
    status: evalStatusPlace(keys),
    cancelKey: (jobId) => new EvalKeys(keys).cancel(jobId),
    clearedOnFailure: { servers: '' },
    async taken({ seenBefore, before }, log) {
      if (seenBefore && before.host === hostname()) await killLeftServers(before, log);
    },
    process: ({ job, redis, deps }) =>
      processEvalJob(job.data, {
        ...deps,
        config: o.config,
        loadTokenizer: o.loadTokenizer,
        recordReport: (report) => recordEvalReport(redis, keys, report),
        ...(o.retry === undefined ? {} : { retry: o.retry }),
      }),
  };
}

/**
 * A worker that died while measuring left its servers behind: they hold the GPUs and ports.
 * Killed only when each pid is still the server recorded (a restart may have given it to another process).
 */
async function killLeftServers(before: Record<string, string>, log: Logger): Promise<void> {
  const identities = new Map(
    (before.serverGroups ?? '').split('\n').flatMap((l) => {
      const rec = parseIdentity(l);
      return rec === null ? [] : [[rec.pid, l] as const];
    }),
  );
  for (const pid of (before.servers ?? '').split('\n').map((l) => Number(/pid (\d+)$/.exec(l)?.[1]))) {
    if (!Number.isInteger(pid) || pid <= 1 || !groupAlive(pid)) continue;
    const left = await killLeftGroup(pid, identities.get(pid));
    if (left.killed) log.warn({ pgid: pid }, 'killed an eval server left by a train worker that died');
    else log.warn({ pgid: pid }, `an eval server left by a train worker that died: ${left.reason}`);
  }
}
