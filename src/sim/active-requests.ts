/**
 * The generation requests a simulator holds: admitted, handed to the load model, settled by
 * finishing, `/abort_request`, a client disconnect or an outage, and their outputs.
 */
import { type FinishReason, type OutputPlan, completionIds, knownCompletionIds, planOutput } from './output-model.js';
import { nativeError, openAiError } from './http-util.js';
import type { GenerateItem, SamplingSpec } from './request-parsing.js';
import { type ItemOutput, chatBody, runningAbortReason } from './responses.js';
import type { SpecPlan } from './speculative.js';
import type { SimState } from './state.js';

export type Outcome =
  | { kind: 'completed'; generated: number }
  | { kind: 'aborted'; generated: number; beforePrefill: boolean }
  /** The client went away (disconnect, outage): nothing to answer. */
  | { kind: 'cancelled'; generated: number };

/** One generation request held by the simulator (a batch has one per item). */
export interface Active {
  rid: string;
  route: string;
  promptIds: number[];
  cachedTokens: number;
  sampling: SamplingSpec;
  plan: OutputPlan;
  receivedPerfMs: number;
  /** Held by the hang fault: never scheduled. */
  hung: boolean;
  fullIds: number[] | undefined;
  /** Its verify steps, when the simulator decodes speculatively. */
  spec?: SpecPlan | undefined;
  settled: boolean;
  resolve: (outcome: Outcome) => void;
  done: Promise<Outcome>;
}

export class ActiveRequests {
  private readonly active = new Map<string, Active>();

  constructor(private readonly s: SimState) {}

  /** Whether a request with this rid is held. */
  has(rid: string): boolean {
    return this.active.has(rid);
  }

  /** Every request held, for aborts. */
  all(): Active[] {
    return [...this.active.values()];
  }

  /** Ends every request held (the server went away). */
  cancelAll(): void {
    for (const a of [...this.active.values()]) this.cancel(a);
  }

  record(route: string, items: readonly GenerateItem[]): void {
    const now = Date.now();
    this.s.counters.requestsReceived += items.length;
    for (const item of items) {
      this.s.counters.requests.push({
        rid: item.rid,
        route,
        receivedAtMs: now,
        promptTokens: item.inputIds.length,
        maxNewTokens: item.maxNewTokens,
      });
    }
  }

  /** Checks rid collisions with requests in flight and queue capacity (before any fault). */
  admit(items: readonly GenerateItem[], openAi: boolean): void {
    for (const item of items) {
      if (this.active.has(item.rid)) {
        const message = `Duplicate request ID detected: ${item.rid}`;
        throw openAi ? openAiError(message) : nativeError(message);
      }
    }
    if (this.s.o.maxQueuedRequests !== undefined) {
      const snap = this.s.load.snapshot();
      const free = Math.max(0, this.s.o.maxRunningRequests - snap.running);
      const wouldQueue = Math.max(0, items.length - free);
      if (wouldQueue > 0 && snap.queued + wouldQueue > this.s.o.maxQueuedRequests) {
        throw openAiError('The request queue is full.', 503, '503');
      }
    }
  }

  /** The ids of the answer with calls to a prompt that offers tools, or undefined for a text answer. */
  private toolAnswerIds(item: GenerateItem): number[] | undefined {
    if (item.sampling.ignoreEos) return undefined;
    const answer = this.s.toolCaller.answer(item.inputIds, item.rid);
    if (answer === undefined) return undefined;
    const ids = this.s.tok.encode(answer.text);
    // min_new_tokens holds the end of turn back past the calls: the model writes text instead.
    return ids.length >= item.sampling.minNewTokens ? ids : undefined;
  }

  newActive(item: GenerateItem, route: string, hung: boolean): Active {
    const promptIds = item.inputIds;
    const toolIds = this.toolAnswerIds(item);
    const plan = planOutput({
      spec: this.s.o.outputLength,
      seed: this.s.o.seed,
      rid: item.rid,
      promptTokens: promptIds.length,
      maxNewTokens: item.maxNewTokens,
      minNewTokens: item.sampling.minNewTokens,
      ignoreEos: item.sampling.ignoreEos,
      stopTokenIds: item.sampling.stopTokenIds,
      eosTokenId: this.s.tok.eosTokenId,
      ...(toolIds === undefined ? {} : { naturalTokens: toolIds.length + 1 }),
    });
    let resolve: (outcome: Outcome) => void = () => {};
    const done = new Promise<Outcome>((r) => {
      resolve = r;
    });
    const a: Active = {
      rid: item.rid,
      route,
      promptIds,
      cachedTokens: 0,
      sampling: item.sampling,
      plan,
      receivedPerfMs: performance.now(),
      hung,
      fullIds: toolIds === undefined ? undefined : knownCompletionIds(plan, toolIds),
      settled: false,
      resolve,
      done,
    };
    this.active.set(a.rid, a);
    return a;
  }

  /** Registers a request and hands it to the load model. */
  begin(item: GenerateItem, route: string): Active {
    const a = this.newActive(item, route, false);
    a.cachedTokens = this.s.prefixCache.lookupAndInsert(a.promptIds);
    this.s.promptTokensTotal += a.promptIds.length;
    this.s.cachedTokensTotal += a.cachedTokens;
    this.s.requestsTotal++;
    a.spec = this.s.speculation?.plan(a.rid, a.plan.outputTokens);
    this.s.load.submit({
      id: a.rid,
      promptTokens: a.promptIds.length,
      cachedTokens: a.cachedTokens,
      outputTokens: a.plan.outputTokens,
      ...(a.spec === undefined ? {} : this.s.speculation?.loadJob(a.spec)),
      onStart: () => this.s.queueTime.observe((performance.now() - a.receivedPerfMs) / 1000),
      onFinish: ({ generatedTokens }) => this.settle(a, { kind: 'completed', generated: generatedTokens }),
    });
    return a;
  }

  settle(a: Active, outcome: Outcome): void {
    if (a.settled) return;
    a.settled = true;
    if (this.active.get(a.rid) === a) this.active.delete(a.rid);
    this.s.counters.outputTokensTotal += outcome.generated;
    if (a.spec !== undefined) this.s.speculation?.record(a.spec, outcome.generated);
    this.s.generationTokensTotal += outcome.generated;
    if (outcome.kind === 'completed') {
      this.s.counters.completed++;
      this.s.e2eLatency.observe((performance.now() - a.receivedPerfMs) / 1000);
    } else {
      this.s.counters.aborted++;
    }
    a.resolve(outcome);
  }

  /** /abort_request or abort_all: the request ends now and answers with what it has. */
  abortActive(a: Active): void {
    if (a.settled) return;
    if (a.hung) {
      this.settle(a, { kind: 'aborted', generated: 0, beforePrefill: true });
      return;
    }
    const r = this.s.load.abort(a.rid);
    if (r === undefined) return;
    this.settle(a, { kind: 'aborted', generated: r.generatedTokens, beforePrefill: r.phase === 'queued' });
  }

  /** The client is gone: free the slot, answer nothing. */
  cancel(a: Active): void {
    if (a.settled) return;
    const r = a.hung ? undefined : this.s.load.abort(a.rid);
    this.settle(a, { kind: 'cancelled', generated: r?.generatedTokens ?? 0 });
  }

  idsOf(a: Active, count: number): number[] {
    if (a.fullIds !== undefined) return a.fullIds.slice(0, count);
    if (this.s.o.output === 'text') return this.fullIds(a).slice(0, count);
    return completionIds(a.plan, this.s.poolOrThrow(), this.s.o.seed, a.rid, a.promptIds.length, count);
  }

  fullIds(a: Active): number[] {
    a.fullIds ??= completionIds(
      a.plan,
      this.s.poolOrThrow(),
      this.s.o.seed,
      a.rid,
      a.promptIds.length,
      a.plan.outputTokens,
      this.s.o.output,
    );
    return a.fullIds;
  }

  /** Completion text: decoded ids, a matched stop token trimmed unless `no_stop_trim`. */
  textOf(a: Active, ids: readonly number[], finish: FinishReason | null): string {
    const trim =
      finish?.type === 'stop' && typeof finish.matched === 'number' && !a.sampling.noStopTrim && ids.length > 0;
    const textIds = trim ? ids.slice(0, -1) : ids;
    return this.s.tok.decode(textIds, { skipSpecialTokens: a.sampling.skipSpecialTokens });
  }

  /** The output of a finished request, or 'before-prefill' for one aborted while it queued. */
  outputOf(a: Active, outcome: Outcome): ItemOutput | 'before-prefill' {
    if (outcome.kind === 'aborted' && outcome.beforePrefill) return 'before-prefill';
    const ids = this.idsOf(a, outcome.generated);
    const finish = outcome.kind === 'completed' ? a.plan.finishReason : runningAbortReason(this.s.o.version);
    return {
      rid: a.rid,
      promptIds: a.promptIds,
      completionIds: ids,
      finishReason: finish,
      cachedTokens: a.cachedTokens,
      text: this.textOf(a, ids, finish),
      e2eLatencyS: (performance.now() - a.receivedPerfMs) / 1000,
      ...(a.spec === undefined ? {} : { spec: this.s.speculation?.metaInfo(a.spec, ids.length) }),
    };
  }

  /** A complete, instant output, used to build the malformed-response fault's body. */
  instantOutput(item: GenerateItem): ItemOutput {
    const a = this.newActive(item, 'fault', true);
    this.active.delete(a.rid);
    const ids = this.fullIds(a);
    return {
      rid: a.rid,
      promptIds: a.promptIds,
      completionIds: ids,
      finishReason: a.plan.finishReason,
      cachedTokens: 0,
      text: this.textOf(a, ids, a.plan.finishReason),
      e2eLatencyS: 0.5,
    };
  }

  chatAbortBody(a: Active): Record<string, unknown> {
    const out: ItemOutput = {
      rid: a.rid,
      promptIds: a.promptIds,
      completionIds: [],
      finishReason: { type: 'abort', message: 'Abort before prefill' },
      cachedTokens: 0,
      text: '',
      e2eLatencyS: (performance.now() - a.receivedPerfMs) / 1000,
    };
    return chatBody(this.s.o.version, out, this.s.o.modelPath, Math.floor(Date.now() / 1000));
  }
}
