/**
 * The SGLang simulator: SGLang's HTTP contract (reference/sglang-api.md) on node:http, in front
 * of a continuous-batching load model, with fault injection and an admin API under /_sim/.
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import path from 'node:path';

import { type ChatTokenizer, type Logger, bundledTokenizerPath, errorMessage, loadTokenizer, logger } from '../shared/index.js';
import { type FaultConfig, type FaultKind, FaultInjector, validateFaults } from './faults.js';
import {
  HttpReply,
  isRecord,
  nativeError,
  openAiError,
  parseJsonBody,
  readBody,
  requireJsonContentType,
  sendEmpty,
  sendJson,
  sendText,
  startEventStream,
  writeEvent,
} from './http-util.js';
import { LoadModel, realClock } from './load-model.js';
import { LatencyHistogram, renderMetrics } from './metrics.js';
import {
  DEFAULT_OUTPUT_LENGTH,
  type FinishReason,
  type OutputLengthSpec,
  type OutputPlan,
  type TokenPool,
  buildTokenPool,
  completionIds,
  planOutput,
} from './output-model.js';
import { PrefixCache } from './prefix-cache.js';
import {
  type ChatTemplateMessage,
  type GenerateItem,
  type SamplingSpec,
  SimValueError,
  parseChat,
  parseGenerate,
} from './request-parsing.js';
import {
  type ItemOutput,
  WEIGHT_VERSION,
  abortBeforePrefillBody,
  chatBody,
  chatChunk,
  chatUsageChunk,
  generateBody,
  runningAbortReason,
} from './responses.js';
import {
  SIM_VERSIONS,
  type SimRequestRecord,
  type SimStats,
  type SimVersion,
  type SimulatorHandle,
  type SimulatorOptions,
} from './types.js';

/** How often a streamed response checks for new tokens (wall ms). */
const STREAM_TICK_MS = 40;
const GENERATE_ROUTE = '/generate';
const CHAT_ROUTE = '/v1/chat/completions';

interface ResolvedOptions {
  host: string;
  port: number;
  seed: number;
  timeScale: number;
  maxRunningRequests: number;
  maxQueuedRequests: number | undefined;
  contextLength: number;
  singleRequestTokensPerSec: number;
  peakTokensPerSec: number;
  prefillTokensPerSec: number;
  outputLength: OutputLengthSpec;
  tokenizerPath: string;
  modelPath: string;
  version: SimVersion;
  faults: Partial<FaultConfig>;
}

function positive(name: string, value: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new RangeError(`simulator option ${name} must be a positive number, got ${String(value)}`);
  }
  return value;
}

function positiveInt(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new RangeError(`simulator option ${name} must be a positive integer, got ${String(value)}`);
  }
  return value;
}

function resolveOptions(o: SimulatorOptions): ResolvedOptions {
  const version = o.version ?? '0.5.4';
  if (!SIM_VERSIONS.includes(version)) {
    throw new RangeError(`simulator option version must be one of ${SIM_VERSIONS.join(', ')}, got ${String(version)}`);
  }
  const port = o.port ?? 0;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new RangeError(`simulator option port is invalid: ${port}`);
  const outputLength = { ...DEFAULT_OUTPUT_LENGTH, ...o.outputLength };
  positive('outputLength.mean', outputLength.mean);
  if (!['lognormal', 'fixed', 'uniform'].includes(outputLength.distribution)) {
    throw new RangeError(`simulator option outputLength.distribution is invalid: ${String(outputLength.distribution)}`);
  }
  return {
    host: o.host ?? '127.0.0.1',
    port,
    seed: o.seed ?? 0,
    timeScale: positive('timeScale', o.timeScale ?? 1),
    maxRunningRequests: positiveInt('maxRunningRequests', o.maxRunningRequests ?? 64),
    maxQueuedRequests: o.maxQueuedRequests === undefined ? undefined : positiveInt('maxQueuedRequests', o.maxQueuedRequests),
    contextLength: positiveInt('contextLength', o.contextLength ?? 32768),
    singleRequestTokensPerSec: positive('singleRequestTokensPerSec', o.singleRequestTokensPerSec ?? 80),
    peakTokensPerSec: positive('peakTokensPerSec', o.peakTokensPerSec ?? 2500),
    prefillTokensPerSec: positive('prefillTokensPerSec', o.prefillTokensPerSec ?? 20000),
    outputLength,
    tokenizerPath: o.tokenizerPath ?? bundledTokenizerPath(),
    modelPath: o.modelPath ?? 'Qwen/Qwen3-8B',
    version,
    faults: validateFaults(o.faults ?? {}),
  };
}

/**
 * Tokenizers by folder, shared by every simulator in the process (loading Qwen3's takes about
 * a second; tests and benchmarks start many simulators). A ChatTokenizer is not mutated after
 * it is built.
 */
const tokenizerCache = new Map<string, Promise<{ tokenizer: ChatTokenizer; pool: TokenPool }>>();

function loadSimTokenizer(dir: string): Promise<{ tokenizer: ChatTokenizer; pool: TokenPool }> {
  const key = path.resolve(dir);
  let entry = tokenizerCache.get(key);
  if (entry === undefined) {
    entry = loadTokenizer(key).then((tokenizer) => ({ tokenizer, pool: buildTokenPool(tokenizer) }));
    tokenizerCache.set(key, entry);
    entry.catch(() => tokenizerCache.delete(key));
  }
  return entry;
}

type Outcome =
  | { kind: 'completed'; generated: number }
  | { kind: 'aborted'; generated: number; beforePrefill: boolean }
  /** The client went away (disconnect, outage): nothing to answer. */
  | { kind: 'cancelled'; generated: number };

/** One generation request held by the simulator (a batch has one per item). */
interface Active {
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
  settled: boolean;
  resolve: (outcome: Outcome) => void;
  done: Promise<Outcome>;
}

interface Counters {
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

type Handler = (req: IncomingMessage, res: ServerResponse, url: URL) => Promise<void> | void;

export class Simulator {
  private readonly o: ResolvedOptions;
  private readonly log: Logger;
  private readonly server: http.Server;
  private readonly sockets = new Set<Socket>();
  private readonly load: LoadModel;
  private readonly faults: FaultInjector;
  private readonly prefixCache = new PrefixCache();
  private readonly active = new Map<string, Active>();
  private readonly streamTimers = new Set<ReturnType<typeof setInterval>>();
  private readonly routes = new Map<string, Map<string, Handler>>();
  private tokenizer: ChatTokenizer | undefined;
  private pool: TokenPool | undefined;
  private starting = true;
  private ready: Promise<void> = Promise.resolve();
  private counters: Counters = emptyCounters();
  // Monotonic, as Prometheus counters are.
  private promptTokensTotal = 0;
  private cachedTokensTotal = 0;
  private generationTokensTotal = 0;
  private requestsTotal = 0;
  private readonly e2eLatency = new LatencyHistogram();
  private readonly queueTime = new LatencyHistogram();
  private boundPort = 0;
  private listening = false;
  private reopenTimer: ReturnType<typeof setTimeout> | undefined;
  private stopped = false;

  constructor(options: SimulatorOptions = {}) {
    this.o = resolveOptions(options);
    this.log = logger('sim');
    this.load = new LoadModel(
      {
        maxRunningRequests: this.o.maxRunningRequests,
        singleRequestTokensPerSec: this.o.singleRequestTokensPerSec,
        peakTokensPerSec: this.o.peakTokensPerSec,
        prefillTokensPerSec: this.o.prefillTokensPerSec,
        timeScale: this.o.timeScale,
      },
      realClock,
    );
    this.faults = new FaultInjector(this.o.seed, this.o.faults);
    this.server = http.createServer((req, res) => {
      this.dispatch(req, res).catch((e: unknown) => {
        this.log.error({ err: e, url: req.url }, 'simulator handler failed');
        if (!res.headersSent) sendJson(res, 500, { object: 'error', message: 'Internal Server Error', type: '500', param: null, code: 500 });
        else res.destroy();
      });
    });
    // uvicorn's keep-alive timeout.
    this.server.keepAliveTimeout = 5000;
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
    });
    this.registerRoutes();
  }

  get url(): string {
    const host = this.o.host.includes(':') ? `[${this.o.host}]` : this.o.host;
    return `http://${host}:${this.boundPort}`;
  }

  get port(): number {
    return this.boundPort;
  }

  /** Listens, then loads the tokenizer; health checks answer 503 until it is loaded. */
  async start(): Promise<void> {
    await this.listen(this.o.port);
    this.ready = (async () => {
      const { tokenizer, pool } = await loadSimTokenizer(this.o.tokenizerPath);
      this.pool = pool;
      this.tokenizer = tokenizer;
      this.starting = false;
    })();
    try {
      await this.ready;
    } catch (e: unknown) {
      await this.stop();
      throw e;
    }
    this.log.info(
      { url: this.url, version: this.o.version, timeScale: this.o.timeScale, maxRunningRequests: this.o.maxRunningRequests },
      'SGLang simulator ready',
    );
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    if (this.reopenTimer !== undefined) clearTimeout(this.reopenTimer);
    for (const timer of this.streamTimers) clearInterval(timer);
    this.streamTimers.clear();
    await this.closeListener();
    for (const a of [...this.active.values()]) this.cancel(a);
    this.load.stop();
  }

  setFaults(partial: Partial<FaultConfig>): void {
    this.faults.set(partial);
    this.log.debug({ faults: this.faults.current() }, 'faults set');
  }

  clearFaults(): void {
    this.faults.clear();
    this.log.debug('faults cleared');
  }

  async outage(durationMs: number): Promise<void> {
    if (!(durationMs >= 0)) throw new RangeError(`outage duration must be >= 0, got ${durationMs}`);
    if (this.stopped) return;
    this.log.info({ durationMs }, 'outage: going down');
    if (this.reopenTimer !== undefined) clearTimeout(this.reopenTimer);
    await this.closeListener();
    // A restarted server has no requests: whatever was in flight is gone with its socket.
    for (const a of [...this.active.values()]) this.cancel(a);
    this.reopenTimer = setTimeout(() => {
      this.reopenTimer = undefined;
      void this.reopen(0);
    }, durationMs);
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

  // --- listener ---

  private listen(port: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const onError = (e: Error): void => {
        this.server.off('listening', onListening);
        reject(e);
      };
      const onListening = (): void => {
        this.server.off('error', onError);
        const address = this.server.address();
        if (address !== null && typeof address === 'object') this.boundPort = address.port;
        this.listening = true;
        resolve();
      };
      this.server.once('error', onError);
      this.server.once('listening', onListening);
      this.server.listen(port, this.o.host);
    });
  }

  private async reopen(attempt: number): Promise<void> {
    if (this.stopped) return;
    try {
      await this.listen(this.boundPort);
      this.log.info({ url: this.url }, 'outage over: listening again');
    } catch (e: unknown) {
      // The port may linger for a moment; try again shortly.
      this.log.warn({ err: e, attempt }, 'cannot listen again yet');
      if (attempt < 100) this.reopenTimer = setTimeout(() => void this.reopen(attempt + 1), 50);
    }
  }

  private closeListener(): Promise<void> {
    if (!this.listening) return Promise.resolve();
    this.listening = false;
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
      for (const socket of this.sockets) socket.destroy();
    });
  }

  // --- routing ---

  private route(methods: string[], paths: string[], handler: Handler): void {
    for (const path of paths) {
      const byMethod = this.routes.get(path) ?? new Map<string, Handler>();
      for (const method of methods) byMethod.set(method, handler);
      this.routes.set(path, byMethod);
    }
  }

  private registerRoutes(): void {
    this.route(['GET'], ['/health', '/health_generate'], (_req, res) => this.health(res));
    this.route(['GET'], ['/ping'], (_req, res) => sendEmpty(res, 200));
    this.route(['POST', 'PUT'], [GENERATE_ROUTE], (req, res) => this.handleGenerate(req, res));
    this.route(['POST'], [CHAT_ROUTE], (req, res) => this.handleChat(req, res));
    this.route(['POST'], ['/abort_request'], (req, res) => this.handleAbort(req, res));
    this.route(['GET'], ['/v1/models'], (_req, res) => sendJson(res, 200, { object: 'list', data: [this.modelCard(this.o.modelPath)] }));
    this.route(['GET'], ['/model_info', '/get_model_info'], (_req, res) => sendJson(res, 200, this.modelInfo()));
    this.route(['GET'], ['/server_info', '/get_server_info'], (_req, res) => sendJson(res, 200, this.serverInfo()));
    this.route(['GET'], ['/get_load'], (_req, res) => sendJson(res, 200, this.getLoad()));
    this.route(['GET'], ['/v1/loads'], (_req, res) => sendJson(res, 200, this.v1Loads()));
    this.route(['GET', 'POST'], ['/flush_cache'], (_req, res) => this.flushCache(res));
    this.route(['POST'], ['/tokenize', '/v1/tokenize'], (req, res) => this.handleTokenize(req, res));
    this.route(['POST'], ['/detokenize', '/v1/detokenize'], (req, res) => this.handleDetokenize(req, res));
    this.route(['GET'], ['/metrics'], (_req, res) => this.handleMetrics(res));
    this.route(['GET'], ['/get_weight_version'], (_req, res) => sendJson(res, 200, { weight_version: WEIGHT_VERSION }));
    // Admin API, for simulators running as a child process.
    this.route(['GET'], ['/_sim/stats'], (_req, res) => sendJson(res, 200, this.stats()));
    this.route(['POST'], ['/_sim/faults'], (req, res, url) => this.adminFaults(req, res, url));
    this.route(['POST'], ['/_sim/outage'], (req, res) => this.adminOutage(req, res));
    this.route(['POST'], ['/_sim/reset'], (_req, res) => {
      this.resetStats();
      sendJson(res, 200, { ok: true });
    });
  }

  private async dispatch(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://sim.invalid');
    const method = req.method ?? 'GET';
    let byMethod = this.routes.get(url.pathname);
    if (byMethod === undefined && url.pathname.startsWith('/v1/models/')) {
      byMethod = new Map([['GET', (_r: IncomingMessage, s: ServerResponse) => this.retrieveModel(s, decodeURIComponent(url.pathname.slice('/v1/models/'.length)))]]);
    }
    if (byMethod === undefined) {
      req.resume();
      sendJson(res, 404, { detail: 'Not Found' });
      return;
    }
    const handler = byMethod.get(method) ?? (method === 'HEAD' ? byMethod.get('GET') : undefined);
    if (handler === undefined) {
      req.resume();
      sendJson(res, 405, { detail: 'Method Not Allowed' });
      return;
    }
    const isAdminOrHealth = url.pathname.startsWith('/_sim/') || url.pathname.startsWith('/health') || url.pathname === '/ping';
    if (!isAdminOrHealth) await this.ready;
    try {
      await handler(req, res, url);
    } catch (e: unknown) {
      if (e instanceof HttpReply) {
        sendJson(res, e.status, e.body);
        return;
      }
      throw e;
    }
  }

  /** Encodes a text prompt as SGLang's tokenizer call does: with the BOS when the model has one. */
  private encodeText(text: string, addSpecialTokens = true): number[] {
    const ids = this.tok.encode(text);
    const bos = this.tok.bosTokenId;
    if (addSpecialTokens && bos !== undefined && ids[0] !== bos) ids.unshift(bos);
    return ids;
  }

  private get tok(): ChatTokenizer {
    if (this.tokenizer === undefined) throw new Error('tokenizer not loaded');
    return this.tokenizer;
  }

  // --- health & info ---

  private health(res: ServerResponse): void {
    if (this.starting || this.faults.unhealthy) sendEmpty(res, 503);
    else sendEmpty(res, 200);
  }

  private modelCard(id: string): Record<string, unknown> {
    return {
      id,
      object: 'model',
      created: Math.floor(Date.now() / 1000),
      owned_by: 'sglang',
      root: id,
      parent: null,
      max_model_len: this.o.contextLength,
    };
  }

  private retrieveModel(res: ServerResponse, model: string): void {
    if (model !== this.o.modelPath) {
      sendJson(res, 404, {
        error: { message: `The model '${model}' does not exist`, type: 'invalid_request_error', param: 'model', code: 'model_not_found' },
      });
      return;
    }
    sendJson(res, 200, this.modelCard(model));
  }

  private modelInfo(): Record<string, unknown> {
    const info: Record<string, unknown> = {
      model_path: this.o.modelPath,
      tokenizer_path: this.o.tokenizerPath,
      is_generation: true,
      preferred_sampling_params: null,
    };
    if (this.o.version !== '0.4.10') info.weight_version = WEIGHT_VERSION;
    return info;
  }

  private maxTotalNumTokens(): number {
    return Math.max(this.o.contextLength * 4, this.o.maxRunningRequests * 8192);
  }

  /** Decode throughput now, tokens per wall second. */
  private genThroughput(): number {
    return this.load.snapshot().throughputTokensPerSec * this.o.timeScale;
  }

  private serverInfo(): Record<string, unknown> {
    const snap = this.load.snapshot();
    const maxTotal = this.maxTotalNumTokens();
    return {
      model_path: this.o.modelPath,
      tokenizer_path: this.o.tokenizerPath,
      tokenizer_mode: 'auto',
      skip_tokenizer_init: false,
      load_format: 'auto',
      trust_remote_code: false,
      dtype: 'auto',
      kv_cache_dtype: 'auto',
      quantization: null,
      context_length: this.o.contextLength,
      device: 'cuda',
      served_model_name: this.o.modelPath,
      chat_template: null,
      is_embedding: false,
      host: this.o.host,
      port: this.boundPort,
      mem_fraction_static: 0.88,
      max_running_requests: this.o.maxRunningRequests,
      max_queued_requests: this.o.maxQueuedRequests ?? null,
      max_total_tokens: null,
      chunked_prefill_size: 8192,
      max_prefill_tokens: 16384,
      schedule_policy: 'fcfs',
      schedule_conservativeness: 1.0,
      tp_size: 1,
      dp_size: 1,
      stream_interval: 1,
      random_seed: this.o.seed,
      log_level: 'info',
      enable_metrics: true,
      api_key: null,
      weight_version: WEIGHT_VERSION,
      preferred_sampling_params: null,
      max_total_num_tokens: maxTotal,
      max_req_input_len: this.o.contextLength - 1,
      internal_states: [
        {
          attention_backend: 'fa3',
          last_gen_throughput: this.genThroughput(),
          load: snap.running + snap.queued,
          num_running_reqs: snap.running,
          num_waiting_reqs: snap.queued,
          token_usage: snap.tokensInUse / maxTotal,
          memory_usage: { weight: 15.27, kvcache: 64.0, token_capacity: maxTotal, graph: 1.5 },
        },
      ],
      version: this.o.version,
    };
  }

  private getLoad(): unknown[] {
    const snap = this.load.snapshot();
    return [{ dp_rank: 0, num_reqs: snap.running + snap.queued, num_waiting_reqs: snap.queued, num_tokens: snap.tokensInUse }];
  }

  private v1Loads(): Record<string, unknown> {
    const snap = this.load.snapshot();
    const maxTotal = this.maxTotalNumTokens();
    const rank = {
      dp_rank: 0,
      num_running_reqs: snap.running,
      num_waiting_reqs: snap.queued,
      num_total_reqs: snap.running + snap.queued,
      num_used_tokens: snap.tokensInUse,
      max_total_num_tokens: maxTotal,
      max_running_requests: this.o.maxRunningRequests,
      token_usage: snap.tokensInUse / maxTotal,
      gen_throughput: this.genThroughput(),
      cache_hit_rate: this.promptTokensTotal > 0 ? this.cachedTokensTotal / this.promptTokensTotal : 0,
      utilization: snap.running / this.o.maxRunningRequests,
    };
    const aggregate: Record<string, unknown> = { ...rank };
    delete aggregate.dp_rank;
    delete aggregate.max_running_requests;
    return { timestamp: new Date().toISOString(), version: this.o.version, dp_rank_count: 1, loads: [rank], aggregate };
  }

  private flushCache(res: ServerResponse): void {
    const snap = this.load.snapshot();
    const busy = snap.running + snap.queued > 0;
    if (!busy) this.prefixCache.clear();
    sendText(
      res,
      busy ? 400 : 200,
      'Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n',
    );
  }

  private handleMetrics(res: ServerResponse): void {
    const snap = this.load.snapshot();
    const text = renderMetrics({
      modelName: this.o.modelPath,
      numRunningReqs: snap.running,
      numQueueReqs: snap.queued,
      tokenUsage: snap.tokensInUse / this.maxTotalNumTokens(),
      genThroughput: this.genThroughput(),
      cacheHitRate: this.promptTokensTotal > 0 ? this.cachedTokensTotal / this.promptTokensTotal : 0,
      promptTokensTotal: this.promptTokensTotal,
      generationTokensTotal: this.generationTokensTotal,
      cachedTokensTotal: this.cachedTokensTotal,
      requestsTotal: this.requestsTotal,
      e2eLatency: this.e2eLatency,
      queueTime: this.queueTime,
    });
    sendText(res, 200, text, 'text/plain; version=0.0.4; charset=utf-8');
  }

  // --- tokenize ---

  private renderChat(messages: ChatTemplateMessage[], tools: unknown[] | undefined, kwargs: Record<string, unknown> | undefined): number[] {
    try {
      return this.tok.encodePrompt(messages, {
        ...(tools === undefined ? {} : { tools }),
        ...(kwargs === undefined ? {} : { templateKwargs: kwargs }),
      });
    } catch (e: unknown) {
      throw new SimValueError(errorMessage(e));
    }
  }

  private async handleTokenize(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    requireJsonContentType(req);
    const body = parseJsonBody(raw);
    if (!isRecord(body)) throw openAiError('Request body must be a JSON object');
    const addSpecial = body.add_special_tokens !== false;
    let result: { tokens: number[] | number[][]; count: number | number[] };
    try {
      if (Array.isArray(body.messages)) {
        const parsed = parseChat({ messages: body.messages, max_tokens: 0 }, this.chatContext());
        result = { tokens: parsed.item.inputIds, count: parsed.item.inputIds.length };
      } else if (typeof body.prompt === 'string') {
        const tokens = this.encodeText(body.prompt, addSpecial);
        result = { tokens, count: tokens.length };
      } else if (Array.isArray(body.prompt) && body.prompt.every((p) => typeof p === 'string')) {
        const tokens = (body.prompt as string[]).map((p) => this.encodeText(p, addSpecial));
        result = { tokens, count: tokens.map((t) => t.length) };
      } else {
        throw openAiError('Either prompt (a string or a list of strings) or messages must be given');
      }
    } catch (e: unknown) {
      if (e instanceof SimValueError) throw openAiError(e.message);
      throw e;
    }
    sendJson(res, 200, { ...result, max_model_len: this.o.contextLength });
  }

  private async handleDetokenize(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    requireJsonContentType(req);
    const body = parseJsonBody(raw);
    const tokens = isRecord(body) ? body.tokens : undefined;
    const isIds = (v: unknown): v is number[] => Array.isArray(v) && v.every((x) => typeof x === 'number' && Number.isInteger(x));
    try {
      if (isIds(tokens)) {
        sendJson(res, 200, { text: this.tok.decode(tokens) });
      } else if (Array.isArray(tokens) && tokens.every(isIds)) {
        sendJson(res, 200, { text: (tokens as number[][]).map((t) => this.tok.decode(t)) });
      } else {
        throw openAiError('tokens must be a list of integers or a list of lists of integers');
      }
    } catch (e: unknown) {
      if (e instanceof HttpReply) throw e;
      throw openAiError(`Failed to detokenize: ${errorMessage(e)}`);
    }
  }

  // --- generation ---

  private chatContext(): Parameters<typeof parseChat>[1] {
    return {
      render: (messages, tools, kwargs) => this.renderChat(messages, tools, kwargs),
      vocabSize: this.tok.vocabSize,
      contextLength: this.o.contextLength,
      version: this.o.version,
      servedModelName: this.o.modelPath,
    };
  }

  private record(route: string, items: readonly GenerateItem[]): void {
    const now = Date.now();
    this.counters.requestsReceived += items.length;
    for (const item of items) {
      this.counters.requests.push({ rid: item.rid, route, receivedAtMs: now, promptTokens: item.inputIds.length, maxNewTokens: item.maxNewTokens });
    }
  }

  /** Checks rid collisions with requests in flight and queue capacity (before any fault). */
  private admit(items: readonly GenerateItem[], openAi: boolean): void {
    for (const item of items) {
      if (this.active.has(item.rid)) {
        const message = `Duplicate request ID detected: ${item.rid}`;
        throw openAi ? openAiError(message) : nativeError(message);
      }
    }
    if (this.o.maxQueuedRequests !== undefined) {
      const snap = this.load.snapshot();
      const free = Math.max(0, this.o.maxRunningRequests - snap.running);
      const wouldQueue = Math.max(0, items.length - free);
      if (wouldQueue > 0 && snap.queued + wouldQueue > this.o.maxQueuedRequests) {
        throw openAiError('The request queue is full.', 503, '503');
      }
    }
  }

  private newActive(item: GenerateItem, route: string, hung: boolean): Active {
    const promptIds = item.inputIds;
    const plan = planOutput({
      spec: this.o.outputLength,
      seed: this.o.seed,
      rid: item.rid,
      promptTokens: promptIds.length,
      maxNewTokens: item.maxNewTokens,
      minNewTokens: item.sampling.minNewTokens,
      ignoreEos: item.sampling.ignoreEos,
      stopTokenIds: item.sampling.stopTokenIds,
      eosTokenId: this.tok.eosTokenId,
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
      fullIds: undefined,
      settled: false,
      resolve,
      done,
    };
    this.active.set(a.rid, a);
    return a;
  }

  /** Registers a request and hands it to the load model. */
  private begin(item: GenerateItem, route: string): Active {
    const a = this.newActive(item, route, false);
    a.cachedTokens = this.prefixCache.lookupAndInsert(a.promptIds);
    this.promptTokensTotal += a.promptIds.length;
    this.cachedTokensTotal += a.cachedTokens;
    this.requestsTotal++;
    this.load.submit({
      id: a.rid,
      promptTokens: a.promptIds.length,
      cachedTokens: a.cachedTokens,
      outputTokens: a.plan.outputTokens,
      onStart: () => this.queueTime.observe((performance.now() - a.receivedPerfMs) / 1000),
      onFinish: ({ generatedTokens }) => this.settle(a, { kind: 'completed', generated: generatedTokens }),
    });
    return a;
  }

  private settle(a: Active, outcome: Outcome): void {
    if (a.settled) return;
    a.settled = true;
    if (this.active.get(a.rid) === a) this.active.delete(a.rid);
    this.counters.outputTokensTotal += outcome.generated;
    this.generationTokensTotal += outcome.generated;
    if (outcome.kind === 'completed') {
      this.counters.completed++;
      this.e2eLatency.observe((performance.now() - a.receivedPerfMs) / 1000);
    } else {
      this.counters.aborted++;
    }
    a.resolve(outcome);
  }

  /** /abort_request or abort_all: the request ends now and answers with what it has. */
  private abortActive(a: Active): void {
    if (a.settled) return;
    if (a.hung) {
      this.settle(a, { kind: 'aborted', generated: 0, beforePrefill: true });
      return;
    }
    const r = this.load.abort(a.rid);
    if (r === undefined) return;
    this.settle(a, { kind: 'aborted', generated: r.generatedTokens, beforePrefill: r.phase === 'queued' });
  }

  /** The client is gone: free the slot, answer nothing. */
  private cancel(a: Active): void {
    if (a.settled) return;
    const r = a.hung ? undefined : this.load.abort(a.rid);
    this.settle(a, { kind: 'cancelled', generated: r?.generatedTokens ?? 0 });
  }

  private idsOf(a: Active, count: number): number[] {
    if (a.fullIds !== undefined) return a.fullIds.slice(0, count);
    return completionIds(a.plan, this.poolOrThrow(), this.o.seed, a.rid, a.promptIds.length, count);
  }

  private fullIds(a: Active): number[] {
    a.fullIds ??= completionIds(a.plan, this.poolOrThrow(), this.o.seed, a.rid, a.promptIds.length, a.plan.outputTokens);
    return a.fullIds;
  }

  private poolOrThrow(): TokenPool {
    if (this.pool === undefined) throw new Error('token pool not built');
    return this.pool;
  }

  /** Completion text: decoded ids, a matched stop token trimmed unless `no_stop_trim`. */
  private textOf(a: Active, ids: readonly number[], finish: FinishReason | null): string {
    const trim = finish?.type === 'stop' && typeof finish.matched === 'number' && !a.sampling.noStopTrim && ids.length > 0;
    const textIds = trim ? ids.slice(0, -1) : ids;
    return this.tok.decode(textIds, { skipSpecialTokens: a.sampling.skipSpecialTokens });
  }

  /** The output of a finished request, or 'before-prefill' for one aborted while it queued. */
  private outputOf(a: Active, outcome: Outcome): ItemOutput | 'before-prefill' {
    if (outcome.kind === 'aborted' && outcome.beforePrefill) return 'before-prefill';
    const ids = this.idsOf(a, outcome.generated);
    const finish = outcome.kind === 'completed' ? a.plan.finishReason : runningAbortReason(this.o.version);
    return {
      rid: a.rid,
      promptIds: a.promptIds,
      completionIds: ids,
      finishReason: finish,
      cachedTokens: a.cachedTokens,
      text: this.textOf(a, ids, finish),
      e2eLatencyS: (performance.now() - a.receivedPerfMs) / 1000,
    };
  }

  /** A complete, instant output, used to build the malformed-response fault's body. */
  private instantOutput(item: GenerateItem): ItemOutput {
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

  /**
   * Applies an injected fault. Returns true when the request is fully handled (answered,
   * dropped or hung).
   */
  private applyFault(
    fault: FaultKind,
    req: IncomingMessage,
    res: ServerResponse,
    items: readonly GenerateItem[],
    route: string,
    fullBody: () => unknown,
  ): boolean {
    switch (fault) {
      case 'none':
        return false;
      case 'error':
        this.counters.failed += items.length;
        sendJson(res, 500, {
          object: 'error',
          message: 'Out of memory even after retracting all other requests in the decode batch. Aborting the request.',
          type: '500',
          param: null,
          code: 500,
        });
        return true;
      case 'unavailable':
        this.counters.failed += items.length;
        sendJson(res, 503, { object: 'error', message: 'The request queue is full.', type: '503', param: null, code: 503 });
        return true;
      case 'drop': {
        this.counters.failed += items.length;
        const socket = req.socket as Socket & { resetAndDestroy?: () => Socket };
        if (typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
        else socket.destroy();
        return true;
      }
      case 'malformed': {
        this.counters.failed += items.length;
        const text = JSON.stringify(fullBody());
        const cut = text.slice(0, Math.max(1, Math.floor(text.length * 0.6)));
        sendText(res, 200, cut, 'application/json');
        return true;
      }
      case 'hang': {
        const hung = items.map((item) => this.newActive(item, route, true));
        res.on('close', () => {
          for (const a of hung) this.cancel(a);
        });
        // Answered only if /abort_request ends them: with what a queued request gets.
        void Promise.all(hung.map((a) => a.done)).then((outcomes) => {
          if (outcomes.some((o) => o.kind === 'cancelled') || res.writableEnded) return;
          if (route === CHAT_ROUTE) {
            const a = hung[0];
            if (a !== undefined) sendJson(res, 200, this.chatAbortBody(a));
            return;
          }
          const bodies = hung.map((a) => abortBeforePrefillBody(this.o.version, a.rid));
          sendJson(res, 200, items.length > 1 ? bodies : bodies[0]);
        });
        return true;
      }
    }
  }

  private async handleGenerate(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    let parsed: ReturnType<typeof parseGenerate>;
    try {
      parsed = parseGenerate(parseJsonBody(raw), {
        encode: (text) => this.encodeText(text),
        vocabSize: this.tok.vocabSize,
        contextLength: this.o.contextLength,
        version: this.o.version,
      });
    } catch (e: unknown) {
      this.counters.requestsReceived++;
      this.counters.failed++;
      if (e instanceof SimValueError) throw nativeError(e.message);
      throw e;
    }
    const { items } = parsed;
    this.record(GENERATE_ROUTE, items);
    try {
      this.admit(items, false);
    } catch (e: unknown) {
      this.counters.failed += items.length;
      throw e;
    }
    const fault = this.faults.next();
    const fullBody = (): unknown => {
      const bodies = items.map((item) => generateBody(this.o.version, this.instantOutput(item), { finished: true }));
      return parsed.isBatch ? bodies : bodies[0];
    };
    if (this.applyFault(fault, req, res, items, GENERATE_ROUTE, fullBody)) return;

    const actives = items.map((item) => this.begin(item, GENERATE_ROUTE));
    res.on('close', () => {
      if (!res.writableEnded) for (const a of actives) this.cancel(a);
    });
    if (parsed.stream) {
      this.streamGenerate(res, actives, parsed.isBatch, parsed.returnLogprob);
      return;
    }
    const outcomes = await Promise.all(actives.map((a) => a.done));
    if (outcomes.some((o) => o.kind === 'cancelled')) return;
    const bodies = actives.map((a, i) => {
      const out = this.outputOf(a, outcomes[i] as Outcome);
      if (out === 'before-prefill') return abortBeforePrefillBody(this.o.version, a.rid);
      return generateBody(this.o.version, out, { finished: true, returnLogprob: parsed.returnLogprob });
    });
    sendJson(res, 200, parsed.isBatch ? bodies : bodies[0]);
  }

  /** Polls decode progress and streams cumulative outputs, one event per new tokens. */
  private streamProgress(a: Active, onTokens: (ids: number[], newText: string) => void): () => void {
    let sent = 0;
    const timer = setInterval(() => {
      const p = this.load.progress(a.rid);
      if (p === undefined || p.generatedTokens <= sent) return;
      const ids = this.fullIds(a).slice(0, p.generatedTokens);
      const fresh = ids.slice(sent);
      sent = p.generatedTokens;
      onTokens(ids, this.tok.decode(fresh, { skipSpecialTokens: true }));
    }, STREAM_TICK_MS);
    this.streamTimers.add(timer);
    return () => {
      clearInterval(timer);
      this.streamTimers.delete(timer);
    };
  }

  private streamGenerate(res: ServerResponse, actives: Active[], isBatch: boolean, returnLogprob: boolean): void {
    startEventStream(res);
    let remaining = actives.length;
    actives.forEach((a, i) => {
      const index = isBatch ? i : undefined;
      let text = '';
      const stopTicking = this.streamProgress(a, (ids, fresh) => {
        text += fresh;
        const partial: ItemOutput = {
          rid: a.rid,
          promptIds: a.promptIds,
          completionIds: ids,
          finishReason: null,
          cachedTokens: a.cachedTokens,
          text,
          e2eLatencyS: 0,
        };
        writeEvent(res, generateBody(this.o.version, partial, { finished: false, returnLogprob, ...(index === undefined ? {} : { index }) }));
      });
      void a.done.then((outcome) => {
        stopTicking();
        if (outcome.kind === 'cancelled') return;
        const out = this.outputOf(a, outcome);
        writeEvent(
          res,
          out === 'before-prefill'
            ? abortBeforePrefillBody(this.o.version, a.rid, index)
            : generateBody(this.o.version, out, { finished: true, returnLogprob, ...(index === undefined ? {} : { index }) }),
        );
        remaining--;
        if (remaining === 0) {
          writeEvent(res, '[DONE]');
          res.end();
        }
      });
    });
  }

  private chatAbortBody(a: Active): Record<string, unknown> {
    const out: ItemOutput = {
      rid: a.rid,
      promptIds: a.promptIds,
      completionIds: [],
      finishReason: { type: 'abort', message: 'Abort before prefill' },
      cachedTokens: 0,
      text: '',
      e2eLatencyS: (performance.now() - a.receivedPerfMs) / 1000,
    };
    return chatBody(this.o.version, out, this.o.modelPath, Math.floor(Date.now() / 1000));
  }

  private async handleChat(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    let parsed: ReturnType<typeof parseChat>;
    try {
      requireJsonContentType(req);
      parsed = parseChat(parseJsonBody(raw), this.chatContext());
    } catch (e: unknown) {
      this.counters.requestsReceived++;
      this.counters.failed++;
      if (e instanceof SimValueError) throw openAiError(e.message);
      throw e;
    }
    const { item, model } = parsed;
    this.record(CHAT_ROUTE, [item]);
    try {
      this.admit([item], true);
    } catch (e: unknown) {
      this.counters.failed++;
      throw e;
    }
    const created = Math.floor(Date.now() / 1000);
    const fault = this.faults.next();
    if (this.applyFault(fault, req, res, [item], CHAT_ROUTE, () => chatBody(this.o.version, this.instantOutput(item), model, created))) {
      return;
    }
    const a = this.begin(item, CHAT_ROUTE);
    res.on('close', () => {
      if (!res.writableEnded) this.cancel(a);
    });
    if (parsed.stream) {
      startEventStream(res);
      writeEvent(res, chatChunk(a, model, created, { role: 'assistant', content: '' }, null));
      const stopTicking = this.streamProgress(a, (_ids, fresh) => {
        writeEvent(res, chatChunk(a, model, created, { content: fresh }, null));
      });
      const outcome = await a.done;
      stopTicking();
      if (outcome.kind === 'cancelled') return;
      const out = this.outputOf(a, outcome);
      const finish: FinishReason = out === 'before-prefill' ? { type: 'abort', message: 'Abort before prefill' } : (out.finishReason ?? a.plan.finishReason);
      writeEvent(res, chatChunk(a, model, created, {}, finish));
      if (parsed.includeUsage && out !== 'before-prefill') writeEvent(res, chatUsageChunk(this.o.version, out, model, created));
      writeEvent(res, '[DONE]');
      res.end();
      return;
    }
    const outcome = await a.done;
    if (outcome.kind === 'cancelled') return;
    const out = this.outputOf(a, outcome);
    sendJson(res, 200, out === 'before-prefill' ? this.chatAbortBody(a) : chatBody(this.o.version, out, model, created));
  }

  private async handleAbort(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = parseJsonBody(await readBody(req), true);
    const rid = isRecord(body) && typeof body.rid === 'string' ? body.rid : '';
    const all = isRecord(body) && body.abort_all === true;
    // Like TokenizerManager.abort_request: an unknown rid is a no-op; the scheduler then
    // aborts every request whose rid starts with it.
    if (all || this.active.has(rid)) {
      for (const a of [...this.active.values()]) {
        if (all || a.rid.startsWith(rid)) this.abortActive(a);
      }
    }
    sendEmpty(res, 200);
  }

  // --- admin ---

  private async adminFaults(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const body = parseJsonBody(await readBody(req), true);
    if (!isRecord(body)) throw nativeError('faults must be a JSON object');
    const { clear, ...rest } = body;
    const clearFirst = clear === true || url.searchParams.get('clear') === '1' || url.searchParams.get('clear') === 'true';
    try {
      const validated = validateFaults(rest as Partial<FaultConfig>);
      if (clearFirst) this.clearFaults();
      if (Object.keys(validated).length > 0) this.setFaults(validated);
    } catch (e: unknown) {
      throw nativeError(errorMessage(e));
    }
    sendJson(res, 200, this.faults.current());
  }

  private async adminOutage(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = parseJsonBody(await readBody(req), true);
    const durationMs = isRecord(body) ? body.durationMs : undefined;
    if (typeof durationMs !== 'number' || !(durationMs >= 0)) throw nativeError('durationMs must be a non-negative number');
    res.on('finish', () => {
      void this.outage(durationMs);
    });
    sendJson(res, 200, { ok: true, durationMs });
  }
}

/** Starts a simulator; resolves once it listens and its tokenizer is loaded. */
export async function startSimulator(options: SimulatorOptions = {}): Promise<SimulatorHandle> {
  const sim = new Simulator(options);
  await sim.start();
  return {
    get url() {
      return sim.url;
    },
    get port() {
      return sim.port;
    },
    setFaults: (f) => sim.setFaults(f),
    clearFaults: () => sim.clearFaults(),
    outage: (durationMs) => sim.outage(durationMs),
    stats: () => sim.stats(),
    resetStats: () => sim.resetStats(),
    stop: () => sim.stop(),
  };
}
