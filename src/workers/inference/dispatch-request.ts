import { UpstreamHttpError, type Logger, type RunKeys, type ScriptedRedis } from '../../shared/index.js';
import type { StrictBudget } from './budget-strict.js';
import type { EndpointAffinity } from './dispatch-affinity.js';
import type { Task } from './dispatch-queue.js';
import type { DispatchState } from './dispatch-state.js';
import type { Endpoint, EndpointPool } from './endpoint-pool.js';
import type { FailureHandler, Running } from './failure-handling.js';
import { checkOutputVocabulary, type CommitBatcher } from './sample-records.js';

/** What one sample's request needs from the dispatcher. */
export interface RequestContext {
  redis: ScriptedRedis;
  keys: RunKeys;
  pool: EndpointPool;
  /** Name written into each record's `worker` field. */
  workerId: string;
  state: DispatchState;
  log: Logger;
  /** Datasets in `budget: strict`: their requests are streamed, and aborted at the budget. */
  strictDatasets: ReadonlySet<string>;
  strict: StrictBudget;
  affinity: EndpointAffinity;
  /** Results finishing together are committed in one round trip. */
  commits: CommitBatcher;
  failures: FailureHandler;
  /** A request ended: the next samples may start. */
  schedulePump(): void;
}

/**
 * The request of one sample that got a slot: sent to its endpoint, stopped by the strict
 * budget if it comes to that, then committed, or its failure handled; its slot and budget
 * reservation are released whatever happens.
 */
export class RequestRunner {
  constructor(private readonly ctx: RequestContext) {}

  async send(
    task: Task,
    rid: string,
    endpoint: Endpoint,
    leaseKey: string,
    probation: boolean,
    leaseSentMs: number,
  ): Promise<void> {
    const { req } = task;
    const { state } = this.ctx;
    const abort = new AbortController();
    const running: Running = {
      task,
      dataset: req.dataset,
      rid,
      endpoint,
      leaseKey,
      abort,
      probation,
      leaseLost: false,
      leaseSentMs,
      settling: false,
    };
    task.state = 'running';
    state.running.set(rid, running);
    endpoint.inFlight += 1;
    if (probation)
      this.ctx.log.warn(
        {
          dataset: req.dataset,
          sampleId: req.sample.id,
          line: req.sample.line,
          crashes: task.crashes,
          endpoint: endpoint.url,
        },
        'sending a prompt on probation: it was in flight at every recent server crash',
      );
    const strict = this.ctx.strictDatasets.has(req.dataset);
    const onProgress = strict ? this.ctx.strict.track(req.dataset, rid) : undefined;
    try {
      const result = await endpoint.client.generate({
        inputIds: req.sample.promptIds,
        maxNewTokens: req.sample.maxNewTokens,
        samplingParams: req.sampling,
        rid,
        signal: abort.signal,
        ...(onProgress === undefined ? {} : { onProgress }),
      });
      running.settling = true;
      // Aborted by the strict budget: the partial output is committed as it is (finish_reason
      // abort); one stopped before it produced anything is skipped by budget instead. A
      // conversation's turn is never committed cut off: its tokens are counted, and the turn is
      // generated again, whole, when the conversation resumes (discard-aborted-turn-5.lua).
      const budgetStopped = strict && this.ctx.strict.untrack(rid) && result.finishReason.type === 'abort';
      if (budgetStopped && req.conversation !== undefined && result.completionTokens > 0) {
        const { keys, redis } = this.ctx;
        const total = await redis.discardAbortedTurn(
          keys.done(req.dataset),
          keys.stats(req.dataset),
          keys.inflight(req.dataset),
          leaseKey,
          keys.skipped(req.dataset),
          req.sample.id,
          result.completionTokens,
          rid,
        );
        state.queue.settle(task, total === -1 ? { kind: 'duplicate' } : { kind: 'skipped-budget' });
        return;
      }
      if (budgetStopped && result.completionTokens === 0) {
        await this.release(req.dataset, rid, leaseKey);
        await this.ctx.redis.skipSamples(
          this.ctx.keys.done(req.dataset),
          this.ctx.keys.skipped(req.dataset),
          req.sample.id,
        );
        state.queue.settle(task, { kind: 'skipped-budget' });
        return;
      }
      if (result.finishReason.type === 'abort' && !budgetStopped) {
        throw new UpstreamHttpError(`SGLang aborted the request: ${JSON.stringify(result.finishReason)}`, {
          retryable: true,
          endpoint: endpoint.url,
        });
      }
      checkOutputVocabulary(result, req.vocabSize, endpoint.url);
      // Before the commit frees the slot (acquires ride on it): held for the conversation's next turn.
      this.ctx.affinity.answered(req, endpoint.url);
      const outcome = await this.ctx.commits.commit({
        req,
        rid,
        endpointUrl: endpoint.url,
        leaseKey,
        workerId: this.ctx.workerId,
        result,
      });
      if (task.crashes > 0) await this.ctx.redis.hdel(this.ctx.keys.crashes(req.dataset), req.sample.id);
      state.queue.settle(task, outcome);
    } catch (e: unknown) {
      running.settling = true;
      if (e instanceof UpstreamHttpError && e.status === 503) this.ctx.pool.noteOverload(endpoint);
      await this.ctx.failures.handleError(running, e);
    } finally {
      if (strict) this.ctx.strict.untrack(rid);
      if (probation) await this.endProbation(endpoint, rid);
      endpoint.inFlight -= 1;
      state.running.delete(rid);
      // A task neither settled nor back in line would be lost: its batch would never end.
      if (task.state === 'running') {
        this.ctx.log.error(
          { dataset: req.dataset, sampleId: req.sample.id },
          'request ended without an outcome; handing the sample back',
        );
        state.queue.settle(task, { kind: 'handed-back' });
      }
      if (state.running.size === 0) state.signalIdle();
      state.signalDemand();
      this.ctx.schedulePump();
    }
  }

  /** Releases a request's budget reservation and endpoint slot (and its probation, if it held one). */
  async release(dataset: string, rid: string, leaseKey: string, probationOn?: Endpoint): Promise<void> {
    await this.ctx.redis.multi().zrem(this.ctx.keys.inflight(dataset), rid).zrem(leaseKey, rid).exec();
    if (probationOn !== undefined) await this.endProbation(probationOn, rid);
  }

  private async endProbation(endpoint: Endpoint, rid: string): Promise<void> {
    try {
      await this.ctx.redis.endProbation(this.ctx.keys.endpointProbation(endpoint.url), rid);
    } catch (e: unknown) {
      // It lapses by itself after crashProbationMs.
      this.ctx.log.warn({ err: e, endpoint: endpoint.url }, 'could not end a probation');
    }
  }
}
