import { createHash } from 'node:crypto';
import { generateQueueName } from './catalog.js';

/**
 * Every Redis key of one run, in one place. A run's keys all start with `<prefix>:<run>`,
 * so runs (and tests, each with its own prefix) never see each other's state.
 * BullMQ's own keys live under `<prefix>:<run>:q`.
 */
export class RunKeys {
  readonly base: string;
  /** BullMQ `prefix` option for every queue of the run. */
  readonly bullPrefix: string;

  constructor(prefix: string, run: string) {
    this.base = `${prefix}:${run}`;
    this.bullPrefix = `${this.base}:q`;
  }

  /** Set of dataset names the producers registered; workers discover queues from it. */
  datasets(): string {
    return `${this.base}:datasets`;
  }

  /** Hash: outputTokens, records, tokenBudget, status, firstCommitMs, lastCommitMs, rejected, total. */
  stats(dataset: string): string {
    return `${this.base}:ds:${dataset}:stats`;
  }

  done(dataset: string): string {
    return `${this.base}:ds:${dataset}:done`;
  }

  /**
   * Hash: conversation id -> its end (JSON), for datasets regenerated turn by turn;
   * finish-conversation-4.lua. Beside the done set, where commit-sample-9.lua finds it.
   */
  conversations(dataset: string): string {
    return `${this.done(dataset)}:conversations`;
  }

  /** Hash: turn -> output ids (JSON) of a conversation in progress; written by commit-sample-9.lua beside the done set. */
  conversationHistory(dataset: string, conversationId: string): string {
    return `${this.done(dataset)}:conv:${conversationId}`;
  }

  failed(dataset: string): string {
    return `${this.base}:ds:${dataset}:failed`;
  }

  skipped(dataset: string): string {
    return `${this.base}:ds:${dataset}:skipped`;
  }

  attempts(dataset: string): string {
    return `${this.base}:ds:${dataset}:attempts`;
  }

  /**
   * Hash: sample id -> times the endpoint dropped every connection while the sample was in
   * flight on it (a suspected crash of the server). Cleared when the sample commits or fails.
   */
  crashes(dataset: string): string {
    return `${this.base}:ds:${dataset}:crashes`;
  }

  /**
   * Hash: sample id → digest of the prompt's messages when it was enqueued (ids given in the
   * prompt file only; a content-hash id changes with the content anyway). A later pass that finds
   * the id committed with other messages warns that its old generation is kept.
   */
  promptDigests(dataset: string): string {
    return `${this.base}:ds:${dataset}:digests`;
  }

  inflight(dataset: string): string {
    return `${this.base}:ds:${dataset}:inflight`;
  }

  results(dataset: string): string {
    return `${this.base}:ds:${dataset}:results`;
  }

  rate(dataset: string): string {
    return `${this.base}:ds:${dataset}:rate`;
  }

  /** Hash of the producer's progress through the dataset's prompt file (line, epoch). */
  producer(dataset: string): string {
    return `${this.base}:ds:${dataset}:producer`;
  }

  sinkLock(dataset: string): string {
    return `${this.base}:ds:${dataset}:sink-lock`;
  }

  producerLock(): string {
    return `${this.base}:producer-lock`;
  }

  /** Zset of request leases on one SGLang endpoint (rid -> expiry ms). */
  endpointLeases(endpoint: string): string {
    return `${this.base}:ep:${endpointKey(endpoint)}:leases`;
  }

  /** String (a rid, with a TTL): the endpoint's prompt on probation; acquire-request.lua derives it. */
  endpointProbation(endpoint: string): string {
    return `${this.endpointLeases(endpoint)}:probation`;
  }

  /** The BullMQ key prefix of a dataset's queue (`<bull prefix>:generate-<dataset>:`); a job's hash is this plus its id. */
  queuePrefix(dataset: string): string {
    return `${this.bullPrefix}:${generateQueueName(dataset)}:`;
  }

  /**
   * The BullMQ meta hash of a dataset's queue: its field `paused` is the dataset's one pause
   * state (set by `Queue.pause()`, which the CLI, the dashboard and Bull Board call), read by
   * acquire-request.lua before every request.
   */
  queueMeta(dataset: string): string {
    return `${this.queuePrefix(dataset)}meta`;
  }

  /** Hash of pipeline phase states (prepare, generate, tokenize, merge, train). */
  phases(): string {
    return `${this.base}:phases`;
  }

  /**
   * Hash of the post-processing rounds: `round` (the current round's number), `flowId`,
   * `mergeKey`, `status` (in_progress | completed | failed), `reason`, `startedAt`, `finishedAt`.
   */
  postprocess(): string {
    return `${this.base}:postprocess`;
  }

  /** Held while a post-process round is chosen and its flow added. */
  postprocessLock(): string {
    return `${this.base}:postprocess-lock`;
  }

  /**
   * Hash of endpoint health as inference workers see it: field `<worker> <url>` -> JSON
   * {@link EndpointHealthReport}; each worker refreshes its fields and they expire on their own.
   */
  endpointHealth(): string {
    return `${this.base}:endpoint-health`;
  }

  /** Hash of datasets found stalled by the stall watchdog: field dataset -> JSON {@link StallRecord}. */
  stalls(): string {
    return `${this.base}:stalls`;
  }
}

/** A short stable key for an endpoint URL. */
export function endpointKey(endpoint: string): string {
  return createHash('sha256').update(endpoint.replace(/\/+$/, '')).digest('hex').slice(0, 12);
}
