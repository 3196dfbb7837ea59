/**
 * One phase of an evaluation: a prompt set sent to one group of endpoints (the drafter's, or the
 * baseline's) with `concurrency` requests in flight, spread over the endpoints in turn. Bounded:
 * each request has its deadline (a late one is counted as failed), an unreachable endpoint is
 * tried again with backoff and then ends the phase with an error naming it.
 */
import {
  AppError,
  CancelledError,
  EndpointMisconfiguredError,
  errorMessage,
  logger,
  type GenerateResult,
  type SglangClient,
} from '../../shared/index.js';
import type { EvalPromptSet } from './prompts.js';
import { DEFAULT_RETRY, EvalError, type RetryPolicy, withConnectRetries } from './servers.js';
import { addAnswer, addFailure, emptyTotals, type PhaseTotals, specStatsOf } from './stats.js';

/** Which endpoints a phase measures. */
export type EvalPhase = 'drafter' | 'baseline';

/** The rid of one evaluation request: `eval:<dataset>:<id>:<phase>`. */
export function evalRid(dataset: string, id: string, phase: EvalPhase): string {
  return `eval:${dataset}:${id}:${phase}`;
}

/** What {@link runPhase} needs. */
export interface PhaseOptions {
  phase: EvalPhase;
  /** One client per endpoint of the phase. */
  clients: readonly SglangClient[];
  set: EvalPromptSet;
  /** Requests in flight at once, over all endpoints. */
  concurrency: number;
  retry?: RetryPolicy;
  /** Stops the phase (the requests in flight are aborted on the servers). */
  signal?: AbortSignal;
  /** Told each answer as it arrives (rid, endpoint, the answer). */
  onAnswer?: (rid: string, endpoint: string, answer: GenerateResult) => void;
  /**
   * Sent before the clock starts, as many at once as the phase keeps in flight (rids
   * `eval:<dataset>:warmup-<j>:<phase>`), and not counted: the connections are opened and the
   * servers past their first requests, so the first phase is not the slower for being first.
   */
  warmup?: { inputIds: number[]; maxNewTokens: number };
}

/** Tokens of each warm-up request. */
export const WARMUP_NEW_TOKENS = 16;

/** Errors that end the phase rather than count as one failed request. */
function isFatal(e: unknown): boolean {
  return (
    e instanceof EvalError ||
    e instanceof EndpointMisconfiguredError ||
    e instanceof CancelledError ||
    !(e instanceof AppError)
  );
}

/**
 * Sends every prompt of the set once and sums the answers. Drafter answers must carry
 * `spec_verify_ct`: the first that does not ends the phase with an error naming its endpoint.
 */
export async function runPhase(o: PhaseOptions): Promise<PhaseTotals> {
  const log = logger('eval');
  const totals = emptyTotals();
  const stop = new AbortController();
  const onOuterAbort = (): void => stop.abort(o.signal?.reason);
  o.signal?.addEventListener('abort', onOuterAbort, { once: true });
  let fatal: unknown;
  let next = 0;
  const prompts = o.set.prompts;
  const inFlight = Math.max(1, Math.min(o.concurrency, prompts.length));
  if (o.warmup !== undefined) {
    const w = o.warmup;
    await Promise.all(
      Array.from({ length: inFlight }, async (_, j) => {
        const client = o.clients[j % o.clients.length];
        if (client === undefined) return;
        const rid = `eval:${o.set.dataset}:warmup-${j}:${o.phase}`;
        try {
          await withConnectRetries(
            client.endpoint,
            'POST /generate',
            () =>
              client.generate({
                inputIds: w.inputIds,
                maxNewTokens: w.maxNewTokens,
                samplingParams: o.set.sampling,
                rid,
                signal: stop.signal,
              }),
            o.retry ?? DEFAULT_RETRY,
            stop.signal,
          );
        } catch (e: unknown) {
          if (isFatal(e)) {
            fatal ??= e;
            stop.abort(e);
          } else log.warn({ rid, endpoint: client.endpoint, err: errorMessage(e) }, 'warm-up request failed');
        }
      }),
    );
    if (fatal !== undefined) {
      o.signal?.removeEventListener('abort', onOuterAbort);
      throw fatal;
    }
  }
  const started = performance.now();
  const worker = async (): Promise<void> => {
    while (fatal === undefined && !stop.signal.aborted) {
      const i = next++;
      const p = prompts[i];
      if (p === undefined) return;
      const client = o.clients[i % o.clients.length];
      if (client === undefined) throw new AppError('eval: a phase without endpoints');
      const rid = evalRid(o.set.dataset, p.id, o.phase);
      try {
        const answer = await withConnectRetries(
          client.endpoint,
          'POST /generate',
          () =>
            client.generate({
              inputIds: p.inputIds,
              maxNewTokens: p.maxNewTokens,
              samplingParams: o.set.sampling,
              rid,
              signal: stop.signal,
            }),
          o.retry ?? DEFAULT_RETRY,
          stop.signal,
        );
        o.onAnswer?.(rid, client.endpoint, answer);
        if (answer.finishReason.type === 'abort') {
          log.warn({ rid, endpoint: client.endpoint, finishReason: answer.finishReason }, 'evaluation request aborted');
          addFailure(totals);
          continue;
        }
        const spec = o.phase === 'drafter' ? specStatsOf(answer.metaInfo) : undefined;
        if (o.phase === 'drafter' && (spec === undefined || typeof spec === 'string'))
          throw new EvalError(
            spec === undefined
              ? `eval: endpoint ${client.endpoint} answered /generate (rid ${rid}) without meta_info.spec_verify_ct: it is not decoding speculatively, though listed in eval.endpoints`
              : `eval: endpoint ${client.endpoint} answered /generate (rid ${rid}) with unusable speculative fields: ${spec}`,
          );
        addAnswer(totals, {
          promptTokens: answer.promptTokens,
          completionTokens: answer.completionTokens,
          e2eLatencySec: answer.e2eLatencySec,
          spec: typeof spec === 'object' ? spec : undefined,
        });
      } catch (e: unknown) {
        if (fatal !== undefined || stop.signal.aborted) return;
        if (isFatal(e)) {
          fatal = e;
          stop.abort(e);
          return;
        }
        log.warn({ rid, endpoint: client.endpoint, err: errorMessage(e) }, 'evaluation request failed');
        addFailure(totals);
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: inFlight }, () => worker()));
  } finally {
    o.signal?.removeEventListener('abort', onOuterAbort);
  }
  if (fatal !== undefined) throw fatal;
  if (o.signal?.aborted === true)
    throw new CancelledError(`eval: the ${o.phase} phase of ${o.set.dataset} was stopped`);
  totals.wallSec = (performance.now() - started) / 1000;
  if (totals.requests > 0 && totals.failures === totals.requests)
    throw new EvalError(
      `eval: every ${o.phase} request of ${o.set.dataset} failed (${totals.failures} of ${totals.requests}, endpoints ${o.clients.map((c) => c.endpoint).join(', ')}); see the log for why`,
    );
  return totals;
}
