/**
 * What the simulator's route handlers share: options, the load model, faults, the tokenizer,
 * the prefix cache and the counters behind /_sim/stats and /metrics.
 */
import path from 'node:path';

import { type ChatTokenizer, type Logger, errorMessage, loadTokenizer } from '../shared/index.js';
import { FaultInjector } from './faults.js';
import { LoadModel, realClock } from './load-model.js';
import { LatencyHistogram } from './metrics.js';
import { type TokenPool, buildTokenPool } from './output-model.js';
import type { ResolvedOptions } from './options.js';
import { PrefixCache } from './prefix-cache.js';
import { Speculation } from './speculative.js';
import { ToolCaller } from './tool-calls.js';
import { type ChatTemplateMessage, SimValueError, type parseChat } from './request-parsing.js';
import type { SimRequestRecord, SimStats } from './types.js';

/**
 * Tokenizers by folder, shared by every simulator in the process (loading Qwen3's takes about
 * a second; tests and benchmarks start many simulators). A ChatTokenizer is not mutated after
 * it is built.
 */
const tokenizerCache = new Map<string, Promise<{ tokenizer: ChatTokenizer; pool: TokenPool }>>();

export function loadSimTokenizer(dir: string): Promise<{ tokenizer: ChatTokenizer; pool: TokenPool }> {
  const key = path.resolve(dir);
  let entry = tokenizerCache.get(key);
  if (entry === undefined) {
    entry = loadTokenizer(key).then((tokenizer) => ({ tokenizer, pool: buildTokenPool(tokenizer) }));
    tokenizerCache.set(key, entry);
    entry.catch(() => tokenizerCache.delete(key));
  }
  return entry;
}

export interface Counters {
  requestsReceived: number;
  requests: SimRequestRecord[];
  completed: number;
  aborted: number;
  failed: number;
  outputTokensTotal: number;
}

function emptyCounters(): Counters {
  return { requestsReceived: 0, requests: [], completed: 0, aborted: 0, failed: 0, outputTokensTotal: 0 };
}

/** Shared state of one simulator. */
export class SimState {
  readonly load: LoadModel;
  readonly faults: FaultInjector;
  /** Speculative decoding (EAGLE3), when the simulator runs with it. */
  readonly speculation: Speculation | undefined;
  readonly prefixCache = new PrefixCache();
  tokenizer: ChatTokenizer | undefined;
  pool: TokenPool | undefined;
  /** True until the tokenizer is loaded: health checks answer 503. */
  starting = true;
  counters: Counters = emptyCounters();
  // Monotonic, as Prometheus counters are.
  promptTokensTotal = 0;
  cachedTokensTotal = 0;
  generationTokensTotal = 0;
  requestsTotal = 0;
  readonly e2eLatency = new LatencyHistogram();
  readonly queueTime = new LatencyHistogram();
  /** The port the listener is bound to (0 before it listens). */
  boundPort = 0;
  #toolCaller: ToolCaller | undefined;

  constructor(
    readonly o: ResolvedOptions,
    readonly log: Logger,
  ) {
    this.load = new LoadModel(
      {
        maxRunningRequests: o.maxRunningRequests,
        singleRequestTokensPerSec: o.singleRequestTokensPerSec,
        peakTokensPerSec: o.peakTokensPerSec,
        prefillTokensPerSec: o.prefillTokensPerSec,
        ...(o.declineAboveBatch === undefined
          ? {}
          : { declineAboveBatch: o.declineAboveBatch, declinePerRequest: o.declinePerRequest }),
        timeScale: o.timeScale,
      },
      realClock,
    );
    this.faults = new FaultInjector(o.seed, o.faults);
    const spec = o.speculative;
    this.speculation = spec === undefined ? undefined : new Speculation(spec, o.seed);
    if (spec?.numDraftTokensGiven !== undefined) {
      // SGLang's words (server_args), then what it did.
      log.warn(
        { given: spec.numDraftTokensGiven, numDraftTokens: spec.numDraftTokens },
        'speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1',
      );
    }
  }

  get tok(): ChatTokenizer {
    if (this.tokenizer === undefined) throw new Error('tokenizer not loaded');
    return this.tokenizer;
  }

  /** Who answers prompts that offer tools with calls (built once the tokenizer is loaded). */
  get toolCaller(): ToolCaller {
    this.#toolCaller ??= new ToolCaller(this.o.toolCalls, this.tok, this.o.seed);
    return this.#toolCaller;
  }

  poolOrThrow(): TokenPool {
    if (this.pool === undefined) throw new Error('token pool not built');
    return this.pool;
  }

  /** Encodes a text prompt as SGLang's tokenizer call does: with the BOS when the model has one. */
  encodeText(text: string, addSpecialTokens = true): number[] {
    const ids = this.tok.encode(text);
    const bos = this.tok.bosTokenId;
    if (addSpecialTokens && bos !== undefined && ids[0] !== bos) ids.unshift(bos);
    return ids;
  }

  renderChat(
    messages: ChatTemplateMessage[],
    tools: unknown[] | undefined,
    kwargs: Record<string, unknown> | undefined,
  ): number[] {
    try {
      return this.tok.encodePrompt(messages, {
        ...(tools === undefined ? {} : { tools }),
        ...(kwargs === undefined ? {} : { templateKwargs: kwargs }),
      });
    } catch (e: unknown) {
      throw new SimValueError(errorMessage(e));
    }
  }

  chatContext(): Parameters<typeof parseChat>[1] {
    return {
      render: (messages, tools, kwargs) => this.renderChat(messages, tools, kwargs),
      vocabSize: this.tok.vocabSize,
      contextLength: this.o.contextLength,
      version: this.o.version,
      servedModelName: this.o.modelPath,
    };
  }

  maxTotalNumTokens(): number {
    return Math.max(this.o.contextLength * 4, this.o.maxRunningRequests * 8192);
  }

  /** Decode throughput now, tokens per wall second. */
  genThroughput(): number {
    return this.load.snapshot().throughputTokensPerSec * this.o.timeScale;
  }

  stats(): SimStats {
    const snap = this.load.snapshot();
    const occ = this.load.occupancy();
    return {
      requestsReceived: this.counters.requestsReceived,
      requests: [...this.counters.requests],
      completed: this.counters.completed,
      aborted: this.counters.aborted,
      failed: this.counters.failed,
      running: snap.running,
      queued: snap.queued,
      maxRunningObserved: occ.maxRunningObserved,
      outputTokensTotal: this.counters.outputTokensTotal,
      occupancy: { meanRunning: occ.meanRunning, windowMs: occ.windowMs },
    };
  }

  resetStats(): void {
    this.counters = emptyCounters();
    this.load.resetOccupancy();
  }
}
