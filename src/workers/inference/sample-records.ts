import {
  RATE_BUCKETS_KEPT,
  RATE_BUCKET_MS,
  SglangResponseFormatError,
  type GenerateResult,
  type RunKeys,
  type ScriptedRedis,
} from '../../shared/index.js';
import type { SampleOutcome, SampleRequest } from './dispatch-types.js';

/** One finished request, as the dispatcher hands it to {@link CommitBatcher.commit}. */
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
 * Refuses an answer whose output ids are not all token ids of the run's tokenizer (`[0,
 * vocabSize)`), before it is committed: such a record would be counted against the budget and
 * written, then be an invalid line for post-processing. The error is a retryable unusable
 * answer (an attempt, like a negative count); after `sglang.maxAttempts` the sample ends
 * failed with this reason. Without a known vocabulary size nothing is checked.
 */
export function checkOutputVocabulary(
  result: GenerateResult,
  vocabSize: number | undefined,
  endpointUrl: string,
): void {
  if (vocabSize === undefined) return;
  const ids = result.outputIds;
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i] as number;
    if (id >= vocabSize || id < 0) {
      throw new SglangResponseFormatError(
        `output_ids[${i}] is ${id}, not a token id of the run's tokenizer (vocabulary size ${vocabSize}): the server's model and tokenizer.path disagree, or the server is faulty; nothing was committed`,
        { endpoint: endpointUrl, route: 'POST /generate', status: 200 },
      );
    }
  }
}

/** The keys and arguments of commit-sample-9.lua for one sample (more of the dataset and endpoint may be appended). */
function commitArgs(keys: RunKeys, dataset: string, leaseKey: string, sample: SampleArgs): (string | number)[] {
  return [
    keys.done(dataset),
    keys.stats(dataset),
    keys.results(dataset),
    keys.inflight(dataset),
    leaseKey,
    keys.failed(dataset),
    keys.skipped(dataset),
    keys.attempts(dataset),
    keys.rate(dataset),
    ...sample,
    RATE_BUCKET_MS,
    RATE_BUCKETS_KEPT,
  ];
}

/** One sample's four arguments of commit-sample-9.lua: id, completion tokens, record, rid. */
type SampleArgs = [string, number, string, string];

function sampleArgs(f: FinishedRequest): SampleArgs {
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
    ...conversationFields(f.req),
  });
  return [sample.id, f.result.completionTokens, record, f.rid];
}

/** A turn's record names its conversation and turn; commit-sample-9.lua keeps its output ids in the history. */
function conversationFields(req: SampleRequest): Record<string, unknown> {
  const c = req.conversation;
  if (c === undefined) return {};
  return {
    conversation_id: c.id,
    turn: c.turn,
    turns: c.turns,
    spliced: c.spliced,
    ...(c.historyOutputs === undefined ? {} : { history_outputs: c.historyOutputs }),
    ...(c.toolResults === undefined ? {} : { tool_results: c.toolResults }),
  };
}

function commitOutcome(first: number | undefined, f: FinishedRequest): SampleOutcome {
  return first === 1
    ? {
        kind: 'committed',
        completionTokens: f.result.completionTokens,
        outputIds: f.result.outputIds,
        endpoint: f.endpointUrl,
      }
    : { kind: 'duplicate' };
}

/**
 * Adds commands to a commit group's pipeline, after its commits (which free `freed` slots),
 * and returns what to do with their replies (null: the pipeline failed as a whole).
 */
export type CommitRider = (
  pipeline: ScriptedRedis,
  freed: number,
) => ((replies: readonly [Error | null, unknown][] | null) => void) | undefined;

interface QueuedCommit {
  f: FinishedRequest;
  resolve(o: SampleOutcome): void;
  reject(e: unknown): void;
}

/**
 * Commits finished requests in groups, one round trip per group: the results that arrive
 * while a group is on its way to Redis go out together in the next one. The results of one
 * dataset and endpoint in a group are one commit-sample-9.lua call (a pipeline holds one call per
 * dataset and endpoint, and the acquires that ride on it); each result in it is still
 * committed atomically and exactly once, as if alone. A group only saves the round trips,
 * system calls and script runs of one call per request.
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
      const pipeline = this.redis.pipeline() as unknown as ScriptedRedis & {
        exec(): Promise<[Error | null, unknown][] | null>;
      };
      const calls = this.scriptCalls(group);
      for (const call of calls) void pipeline.commitSample(...call.args);
      if (calls.length === 0) return;
      let ride: ReturnType<CommitRider>;
      try {
        ride = this.rider?.(
          pipeline,
          calls.reduce((n, c) => n + c.commits.length, 0),
        );
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
      calls.forEach((call, i) => {
        const reply = replies?.[i];
        const error = reply === undefined ? new Error('Redis sent no reply to a commit of a pipeline') : reply[0];
        const out = reply?.[1] as number[] | undefined;
        call.commits.forEach((c, j) => {
          if (error !== null) c.reject(error);
          else c.resolve(commitOutcome(out?.[2 * j], c.f));
        });
      });
      ride?.(replies === null ? null : replies.slice(calls.length));
    } catch (e: unknown) {
      for (const c of group) c.reject(e);
    } finally {
      this.inFlight = false;
      if (this.queued.length > 0) this.schedule();
    }
  }

  /** One commit-sample-9.lua call per dataset and endpoint of the group; a result whose record cannot be built is rejected alone. */
  private scriptCalls(group: QueuedCommit[]): { args: (string | number)[]; commits: QueuedCommit[] }[] {
    const byKey = new Map<string, { args: (string | number)[]; commits: QueuedCommit[] }>();
    for (const c of group) {
      let sample: SampleArgs;
      try {
        sample = sampleArgs(c.f);
      } catch (e: unknown) {
        c.reject(e);
        continue;
      }
      const key = `${c.f.req.dataset}\n${c.f.leaseKey}`;
      const call = byKey.get(key);
      if (call === undefined) {
        const args = commitArgs(this.keys, c.f.req.dataset, c.f.leaseKey, sample);
        byKey.set(key, { args, commits: [c] });
      } else {
        call.args.push(...sample);
        call.commits.push(c);
      }
    }
    return [...byKey.values()];
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
 * Records a sample as failed (fail-sample-6.lua), unless it was committed meanwhile. The record
 * names the batch job (`job`): a retry of that job, and only that job, claims it again. Returns
 * false when another delivery had committed the sample first (nothing was recorded).
 */
export async function recordFailure(
  redis: ScriptedRedis,
  keys: RunKeys,
  req: SampleRequest,
  info: FailureInfo,
): Promise<boolean> {
  const failure = JSON.stringify({
    reason: info.reason,
    status: info.status,
    attempts: info.attempts,
    endpoint: info.endpoint,
    line: req.sample.line,
    ...(req.jobId === undefined ? {} : { job: req.jobId }),
    ts: new Date().toISOString(),
  });
  const recorded = await redis.failSample(
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
  return recorded === 1;
}
