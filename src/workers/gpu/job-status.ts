import type { Redis } from 'ioredis';
import type { RunKeys } from '../../shared/index.js';

/** A phase's state, as the phases hash holds it. */
export type JobPhase = 'pending' | 'in_progress' | 'completed' | 'failed';

/** Where a stage keeps the state of its latest job: its status hash, and its name in the run's phases hash. */
export interface StatusPlace {
  key: string;
  phase: string;
}

/**
 * Writes fields of a stage's status hash (`status.key`) for job `jobId`, and that stage's entry
 * (`status.phase`) in the run's phases hash: the train and the eval status alike. With `reset`,
 * the status is started afresh for that job; otherwise a job that no longer owns it writes nothing.
 */
export async function writeJobStatus(
  redis: Redis,
  keys: RunKeys,
  status: StatusPlace,
  jobId: string,
  fields: Record<string, string | number>,
  phase?: JobPhase,
  reset = false,
): Promise<void> {
  if (!reset && (await redis.hget(status.key, 'jobId')) !== jobId) return;
  const m = redis.multi();
  if (reset) m.del(status.key);
  m.hset(status.key, { ...fields, jobId, updatedAt: new Date().toISOString() });
  if (phase !== undefined) m.hset(keys.phases(), status.phase, phase);
  await m.exec();
}

/** {@link writeJobStatus} for the stage whose status is `placeOf(keys)`. */
export type StatusWriter = (
  redis: Redis,
  keys: RunKeys,
  jobId: string,
  fields: Record<string, string | number>,
  phase?: JobPhase,
  reset?: boolean,
) => Promise<void>;

/** The status writer of one stage (train, eval). */
export function statusWriter(placeOf: (keys: RunKeys) => StatusPlace): StatusWriter {
  return (redis, keys, jobId, fields, phase, reset = false) =>
    writeJobStatus(redis, keys, placeOf(keys), jobId, fields, phase, reset);
}
