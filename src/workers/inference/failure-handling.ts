import { UpstreamHttpError, errorMessage, type Logger, type RunKeys, type ScriptedRedis } from '../../shared/index.js';
import type { DispatchQueue, Task } from './dispatch-queue.js';
import type { Endpoint, EndpointPool } from './endpoint-pool.js';
import { triage } from './error-triage.js';
import { recordFailure, type FailureInfo } from './sample-records.js';

/** A request out to SGLang, from acquire to its recorded outcome. */
export interface Running {
  task: Task;
  dataset: string;
  rid: string;
  endpoint: Endpoint;
  leaseKey: string;
  abort: AbortController;
  /** Sent on probation: it holds the endpoint's probation key. */
  probation: boolean;
  /** Its endpoint slot was taken by others after a stall, or past the fence: aborted, to be sent again. */
  leaseLost: boolean;
  /** When (this process's monotonic clock, `performance.now()`) the last acquire or renewal Redis confirmed this lease with was sent. */
  leaseSentMs: number;
  /** The request ended and its outcome is being recorded (which releases its leases): not renewed. */
  settling: boolean;
}

/** What the failure handling needs from the dispatcher. */
export interface FailureContext {
  redis: ScriptedRedis;
  keys: RunKeys;
  pool: EndpointPool;
  queue: DispatchQueue;
  log: Logger;
  /** Base of the exponential backoff before a sample is sent again. */
  retryDelayMs: number;
  isStopping(): boolean;
  /** Releases a request's budget reservation and endpoint slot. */
  release(dataset: string, rid: string, leaseKey: string): Promise<void>;
}

/**
 * What happens to a sample whose request failed (docs/design.md, invariant 7): outages and
 * misconfigured endpoints cost nothing, a server crash is counted toward probation, a failure
 * on a healthy server spends an attempt, the prompt's own error fails it.
 */
export class FailureHandler {
  constructor(private readonly ctx: FailureContext) {}

  /** Puts a sample back in line, or hands it back when stopping. */
  requeue(task: Task, where: 'front' | 'back', notBeforeMs = 0): void {
    if (this.ctx.isStopping()) this.ctx.queue.settle(task, { kind: 'handed-back' });
    else this.ctx.queue.requeue(task, where, notBeforeMs);
  }

  async handleError(r: Running, e: unknown): Promise<void> {
    const { task, rid, endpoint, leaseKey } = r;
    const { req } = task;
    const { keys, redis, pool } = this.ctx;
    const log = this.ctx.log.child({
      dataset: req.dataset,
      sampleId: req.sample.id,
      line: req.sample.line,
      endpoint: endpoint.url,
    });
    try {
      const verdict = await triage(endpoint, e);
      switch (verdict) {
        case 'cancelled':
          await this.ctx.release(req.dataset, rid, leaseKey);
          if (r.leaseLost && !this.ctx.isStopping())
            log.warn(
              'request aborted: its endpoint slot was taken while this process or Redis stalled; sending it again',
            );
          this.requeue(task, 'front');
          return;
        case 'outage':
        case 'endpoint-misconfigured':
          // Not the prompt's fault: no attempt spent, it waits for a healthy endpoint.
          await this.ctx.release(req.dataset, rid, leaseKey);
          if (verdict === 'outage') pool.markDown(endpoint, errorMessage(e));
          else pool.markMisconfigured(endpoint, errorMessage(e));
          this.requeue(task, 'front');
          return;
        case 'connection-dropped': {
          // The server cut a request it had accepted: a crash. Not an attempt yet (every
          // request in flight died with it); the sample is counted, and one in flight at two
          // crashes is sent on probation next.
          await this.ctx.release(req.dataset, rid, leaseKey);
          pool.markDown(endpoint, errorMessage(e));
          task.crashes = await redis.hincrby(keys.crashes(req.dataset), req.sample.id, 1);
          if (r.probation) task.chargeOnRecovery = true;
          this.requeue(task, 'front');
          return;
        }
        case 'retry':
        case 'fail':
          break;
      }
      if (verdict === 'retry') {
        const spent = await redis.spendAttempt(
          keys.attempts(req.dataset),
          keys.inflight(req.dataset),
          leaseKey,
          req.sample.id,
          rid,
        );
        req.attemptsSpent = spent;
        if (spent < req.maxAttempts) {
          log.warn({ err: e, attempt: spent }, 'request failed; will retry');
          req.onAttemptFailed?.(spent, errorMessage(e));
          this.requeue(task, 'back', Date.now() + this.ctx.retryDelayMs * 2 ** (spent - 1));
          return;
        }
      }
      const retryable = verdict === 'retry';
      const reason = retryable ? `failed after ${req.maxAttempts} attempts: ${errorMessage(e)}` : errorMessage(e);
      await this.fail(task, reason, {
        status: e instanceof UpstreamHttpError ? e.status : undefined,
        attempts: req.attemptsSpent + (retryable ? 0 : 1),
        endpoint: endpoint.url,
        rid,
        leaseKey,
      });
    } catch (inner: unknown) {
      // Redis itself failed: hand the sample back so the job is retried, never lose it.
      log.error({ err: inner }, 'could not record the outcome of a request');
      this.ctx.queue.settle(task, { kind: 'handed-back' });
    }
  }

  /** Charges the crash of a prompt that was alone on probation; fails it when its attempts are spent. */
  async chargeCrash(task: Task): Promise<void> {
    const { req } = task;
    const { keys, redis } = this.ctx;
    task.chargeOnRecovery = false;
    try {
      const rid = `${req.dataset}/${req.sample.id}#crash`;
      const spent = await redis.spendAttempt(
        keys.attempts(req.dataset),
        keys.inflight(req.dataset),
        keys.inflight(req.dataset),
        req.sample.id,
        rid,
      );
      req.attemptsSpent = spent;
      if (spent < req.maxAttempts) {
        this.ctx.log.warn(
          { dataset: req.dataset, sampleId: req.sample.id, line: req.sample.line, attempt: spent },
          'the server crashed while this prompt was on probation; attempt charged',
        );
        req.onAttemptFailed?.(
          spent,
          'the server dropped the connection while this prompt was on probation (sent alone)',
        );
        this.requeue(task, 'back', Date.now() + this.ctx.retryDelayMs * 2 ** (spent - 1));
        return;
      }
      const reason = `the server dropped the connection ${spent} times while this prompt was on probation (sent alone): it appears to crash SGLang`;
      await this.fail(task, reason, {
        status: undefined,
        attempts: spent,
        endpoint: undefined,
        rid,
        leaseKey: keys.inflight(req.dataset),
      });
    } catch (e: unknown) {
      this.ctx.log.error({ err: e }, 'could not charge a crash; handing the sample back');
      this.ctx.queue.settle(task, { kind: 'handed-back' });
    }
  }

  private async fail(task: Task, reason: string, info: Omit<FailureInfo, 'reason'>): Promise<void> {
    const { req } = task;
    const recorded = await recordFailure(this.ctx.redis, this.ctx.keys, req, { ...info, reason });
    if (task.crashes > 0) await this.ctx.redis.hdel(this.ctx.keys.crashes(req.dataset), req.sample.id);
    if (!recorded) {
      // Another delivery committed the sample first: its answer stands (a conversation goes on
      // with it), nothing failed.
      this.ctx.log.info(
        { dataset: req.dataset, sampleId: req.sample.id, reason },
        'sample committed by another delivery; this one failed',
      );
      this.ctx.queue.settle(task, { kind: 'duplicate' });
      return;
    }
    this.ctx.log.warn(
      { dataset: req.dataset, sampleId: req.sample.id, line: req.sample.line, reason },
      'sample failed',
    );
    this.ctx.queue.settle(task, { kind: 'failed', reason, status: info.status, attempts: info.attempts });
  }
}
