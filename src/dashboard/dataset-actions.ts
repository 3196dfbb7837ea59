/**
 * What the dashboard's buttons do to one dataset: pause, resume, send its failed prompts again.
 * The same operations as the `pause`, `resume` and `retry-failed` verbs (and Bull Board's own
 * pause and "retry all failed"): src/shared/queues/dataset-pause.ts and failed-prompts.ts.
 */
import type { Redis } from 'ioredis';
import { pauseDataset, resumeDataset, retryFailedPrompts, type RunKeys } from '../shared/index.js';

/** An action the dashboard offers per dataset. */
export type DatasetAction = 'pause' | 'resume' | 'retry-failed';

export const DATASET_ACTIONS: readonly DatasetAction[] = ['pause', 'resume', 'retry-failed'];

/** What an action did, for the page to show. */
export interface ActionResult {
  dataset: string;
  action: DatasetAction;
  /** For retry-failed: prompts sent again, and failed jobs retried. */
  retried?: number;
  retriedJobs?: number;
}

/** Runs one action on one dataset (a generation dataset of the run, checked by the caller). */
export async function runDatasetAction(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
  action: DatasetAction,
): Promise<ActionResult> {
  if (action === 'retry-failed') {
    const r = await retryFailedPrompts(redis, keys, dataset);
    return { dataset, action, retried: r.prompts, retriedJobs: r.jobs };
  }
  if (action === 'pause') await pauseDataset(redis, keys, dataset);
  else await resumeDataset(redis, keys, dataset);
  return { dataset, action };
}
