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
  const [first] = await redis.commitSample(...commitArgs(keys, f));
  return commitOutcome(first, f);
}

/** The keys and arguments of commit-sample.lua for one finished request. */
function commitArgs(keys: RunKeys, f: FinishedRequest): (string | number)[] {
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
  return [
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
  ];
}

function commitOutcome(first: number | undefined, f: FinishedRequest): SampleOutcome {
  return first === 1 ? { kind: 'committed', completionTokens: f.result.completionTokens } : { kind: 'duplicate' };
}

/**
 * Adds commands to a commit group's pipeline, after its commits (which free `freed` slots),
 * and returns what to do with their replies (null: the pipeline failed as a whole).
 */
export type CommitRider = (pipeline: ScriptedRedis, freed: number) => ((replies: readonly [Error | null, unknown][] | null) => void) | undefined;

interface QueuedCommit {
  f: FinishedRequest;
  resolve(o: SampleOutcome): void;
  reject(e: unknown): void;
}

/**
 * Commits finished requests in groups, one round trip per group: the results that arrive
 * while a group is on its way to Redis go out together in the next one (a pipeline: one
 * write, one read). Each result is still its own commit-sample.lua call, atomic and exactly
 * once; a group only saves the round trips and system calls of one call per request.
 */
export class CommitBatcher {
  private queued: QueuedCommit[] = [];
  private inFlight = false;
  private scheduled = false;

  constructor(
    private readonly redis: ScriptedRedis,
    private readonly keys: RunKeys,
    private readonly rider?: CommitRider,
    private readonly maxGroup = 256,
  ) {}

  /** Resolves with the sample's outcome once its group has been committed. */
  commit(f: FinishedRequest): Promise<SampleOutcome> {
    return new Promise<SampleOutcome>((resolve, reject) => {
      this.queued.push({ f, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.inFlight || this.scheduled) return;
    this.scheduled = true;
    // After the current I/O phase: responses read in the same turn of the event loop join one group.
    setImmediate(() => {
      this.scheduled = false;
      void this.flush();
    });
  }

  private async flush(): Promise<void> {
    if (this.inFlight) return;
    const group = this.queued.splice(0, this.maxGroup);
    if (group.length === 0) return;
    this.inFlight = true;
    try {
      const pipeline = this.redis.pipeline() as unknown as ScriptedRedis & { exec(): Promise<[Error | null, unknown][] | null> };
      const built: QueuedCommit[] = [];
      for (const c of group) {
        try {
          void pipeline.commitSample(...commitArgs(this.keys, c.f));
          built.push(c);
        } catch (e: unknown) {
          c.reject(e);
        }
      }
      if (built.length === 0) return;
      let ride: ReturnType<CommitRider>;
      try {
        ride = this.rider?.(pipeline, built.length);
      } catch {
        ride = undefined;
      }
      let replies: [Error | null, unknown][] | null;
      try {
        replies = await pipeline.exec();
      } catch (e: unknown) {
        ride?.(null);
        throw e;
      }
      built.forEach((c, i) => {
        const reply = replies?.[i];
        if (reply === undefined) c.reject(new Error('Redis sent no reply to a commit of a pipeline'));
        else if (reply[0] !== null) c.reject(reply[0]);
        else c.resolve(commitOutcome((reply[1] as [number, number])[0], c.f));
      });
      ride?.(replies === null ? null : replies.slice(built.length));
    } catch (e: unknown) {
      for (const c of group) c.reject(e);
    } finally {
      this.inFlight = false;
      if (this.queued.length > 0) this.schedule();
    }
  }
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
