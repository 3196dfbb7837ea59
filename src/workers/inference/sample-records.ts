import { RATE_BUCKETS_KEPT, RATE_BUCKET_MS, type GenerateResult, type RunKeys, type ScriptedRedis } from '../../shared/index.js';
import type { SampleOutcome, SampleRequest } from './dispatch-types.js';

/** One finished request, as the dispatcher hands it to {@link commitResult}. */
export interface FinishedRequest {
  req: SampleRequest;
  rid: string;
  endpointUrl: string;
  /** The endpoint's lease zset, released by the commit. */
  leaseKey: string;
  workerId: string;
  result: GenerateResult;
}

/**
 * Commits a sample's result through commit-sample.lua (DESIGN invariant 2): the first commit
 * of a sample counts its tokens and appends its record to the results stream; any later one
 * is a duplicate that changes nothing but releasing its leases.
 */
export async function commitResult(redis: ScriptedRedis, keys: RunKeys, f: FinishedRequest): Promise<SampleOutcome> {
  const { dataset, sample } = f.req;
  const record = JSON.stringify({
    id: sample.id,
    dataset,
    prompt_ids: sample.promptIds,
    output_ids: f.result.outputIds,
    prompt_tokens: f.result.promptTokens,
    completion_tokens: f.result.completionTokens,
    finish_reason: f.result.finishReason,
    endpoint: f.endpointUrl,
    worker: f.workerId,
    attempt: f.req.attemptsSpent + 1,
    ts: new Date().toISOString(),
  });
  const [first] = await redis.commitSample(
    keys.done(dataset),
    keys.stats(dataset),
    keys.results(dataset),
    keys.inflight(dataset),
    f.leaseKey,
    keys.failed(dataset),
    keys.skipped(dataset),
    keys.attempts(dataset),
    keys.rate(dataset),
    sample.id,
    f.result.completionTokens,
    record,
    f.rid,
    RATE_BUCKET_MS,
    RATE_BUCKETS_KEPT,
  );
  return first === 1 ? { kind: 'committed', completionTokens: f.result.completionTokens } : { kind: 'duplicate' };
}

/** Why and where a sample failed; stored as JSON in the dataset's failed hash. */
export interface FailureInfo {
  reason: string;
  /** SGLang's HTTP status, when it answered one. */
  status: number | undefined;
  attempts: number;
  endpoint: string | undefined;
  /** The request whose leases the failure releases. */
  rid: string;
  leaseKey: string;
}

/**
 * Records a sample as failed (fail-sample.lua), unless it was committed meanwhile. The record
 * names the batch job (`job`): a retry of that job, and only that job, claims it again.
 */
export async function recordFailure(redis: ScriptedRedis, keys: RunKeys, req: SampleRequest, info: FailureInfo): Promise<void> {
  const failure = JSON.stringify({
    reason: info.reason,
    status: info.status,
    attempts: info.attempts,
    endpoint: info.endpoint,
    line: req.sample.line,
    ...(req.jobId === undefined ? {} : { job: req.jobId }),
    ts: new Date().toISOString(),
  });
  await redis.failSample(
    keys.done(req.dataset),
    keys.failed(req.dataset),
    keys.inflight(req.dataset),
    info.leaseKey,
    keys.attempts(req.dataset),
    keys.skipped(req.dataset),
    req.sample.id,
    failure,
    info.rid,
  );
}
