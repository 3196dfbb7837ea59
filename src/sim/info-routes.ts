/** SGLang's info, load, cache, metrics and tokenizer routes, answered from the simulator's state. */
import type { IncomingMessage, ServerResponse } from 'node:http';

import { errorMessage, isRecord } from '../shared/index.js';
import {
  HttpReplyError,
  openAiError,
  parseJsonBody,
  readBody,
  requireJsonContentType,
  sendJson,
  sendText,
} from './http-util.js';
import { SIM_ANNOUNCEMENT_KEY, simAnnouncement } from './announce.js';
import { renderMetrics } from './metrics.js';
import { SimValueError, parseChat } from './request-parsing.js';
import { WEIGHT_VERSION } from './responses.js';
import { speculativeLaunchArgs, speculativeServerInfo } from './speculative.js';
import type { SimState } from './state.js';

export class InfoRoutes {
  constructor(private readonly s: SimState) {}

  modelCard(id: string): Record<string, unknown> {
    return {
      id,
      object: 'model',
      created: Math.floor(Date.now() / 1000),
      owned_by: 'sglang',
      root: id,
      parent: null,
      max_model_len: this.s.o.contextLength,
    };
  }

  retrieveModel(res: ServerResponse, model: string): void {
    if (model !== this.s.o.modelPath) {
      sendJson(res, 404, {
        error: {
          message: `The model '${model}' does not exist`,
          type: 'invalid_request_error',
          param: 'model',
          code: 'model_not_found',
        },
      });
      return;
    }
    sendJson(res, 200, this.modelCard(model));
  }

  modelInfo(): Record<string, unknown> {
    const info: Record<string, unknown> = {
      model_path: this.s.o.modelPath,
      tokenizer_path: this.s.o.tokenizerPath,
      is_generation: true,
      preferred_sampling_params: null,
    };
    if (this.s.o.version !== '0.4.10') info.weight_version = WEIGHT_VERSION;
    return info;
  }

  serverInfo(): Record<string, unknown> {
    const snap = this.s.load.snapshot();
    const maxTotal = this.s.maxTotalNumTokens();
    // Over the requests ended so far (SGLang's scheduler counts each verify step as it runs).
    const avgAcceptLength = this.s.speculation?.averageAcceptLength();
    return {
      model_path: this.s.o.modelPath,
      tokenizer_path: this.s.o.tokenizerPath,
      tokenizer_mode: 'auto',
      skip_tokenizer_init: false,
      load_format: 'auto',
      trust_remote_code: false,
      dtype: 'auto',
      kv_cache_dtype: 'auto',
      quantization: null,
      context_length: this.s.o.contextLength,
      device: 'cuda',
      served_model_name: this.s.o.modelPath,
      chat_template: null,
      is_embedding: false,
      host: this.s.o.host,
      port: this.s.boundPort,
      mem_fraction_static: 0.88,
      max_running_requests: this.s.o.maxRunningRequests,
      max_queued_requests: this.s.o.maxQueuedRequests ?? null,
      max_total_tokens: null,
      chunked_prefill_size: 8192,
      max_prefill_tokens: 16384,
      schedule_policy: 'fcfs',
      schedule_conservativeness: 1.0,
      tp_size: 1,
      dp_size: 1,
      stream_interval: 1,
      random_seed: this.s.o.seed,
      log_level: 'info',
      enable_metrics: true,
      api_key: null,
      weight_version: WEIGHT_VERSION,
      preferred_sampling_params: null,
      ...speculativeServerInfo(this.s.o.speculative),
      launch_command: this.launchCommand(),
      max_total_num_tokens: maxTotal,
      max_req_input_len: this.s.o.contextLength - 1,
      internal_states: [
        {
          attention_backend: 'fa3',
          last_gen_throughput: this.s.genThroughput(),
          load: snap.running + snap.queued,
          num_running_reqs: snap.running,
          num_waiting_reqs: snap.queued,
          token_usage: snap.tokensInUse / maxTotal,
          memory_usage: { weight: 15.27, kvcache: 64.0, token_capacity: maxTotal, graph: 1.5 },
          ...(avgAcceptLength === undefined ? {} : { avg_spec_accept_length: avgAcceptLength }),
        },
      ],
      version: this.s.o.version,
      ...(this.s.o.announce ? { [SIM_ANNOUNCEMENT_KEY]: simAnnouncement(this.s.o.version, this.s.o.speculative) } : {}),
    };
  }

  /** The command line such a server would have been started with (SGLang joins its argv with spaces). */
  private launchCommand(): string {
    const o = this.s.o;
    const args = ['--model-path', o.modelPath, '--host', o.host, '--port', String(this.s.boundPort)];
    args.push('--context-length', String(o.contextLength), '--max-running-requests', String(o.maxRunningRequests));
    if (o.maxQueuedRequests !== undefined) args.push('--max-queued-requests', String(o.maxQueuedRequests));
    if (o.apiKey !== undefined) args.push('--api-key', '<redacted>');
    args.push('--random-seed', String(o.seed), '--enable-metrics', ...speculativeLaunchArgs(o.speculative));
    return args.join(' ');
  }

  getLoad(): unknown[] {
    const snap = this.s.load.snapshot();
    return [
      { dp_rank: 0, num_reqs: snap.running + snap.queued, num_waiting_reqs: snap.queued, num_tokens: snap.tokensInUse },
    ];
  }

  v1Loads(): Record<string, unknown> {
    const snap = this.s.load.snapshot();
    const maxTotal = this.s.maxTotalNumTokens();
    const rank = {
      dp_rank: 0,
      num_running_reqs: snap.running,
      num_waiting_reqs: snap.queued,
      num_total_reqs: snap.running + snap.queued,
      num_used_tokens: snap.tokensInUse,
      max_total_num_tokens: maxTotal,
      max_running_requests: this.s.o.maxRunningRequests,
      token_usage: snap.tokensInUse / maxTotal,
      gen_throughput: this.s.genThroughput(),
      cache_hit_rate: this.s.promptTokensTotal > 0 ? this.s.cachedTokensTotal / this.s.promptTokensTotal : 0,
      utilization: snap.running / this.s.o.maxRunningRequests,
    };
    const aggregate: Record<string, unknown> = { ...rank };
    delete aggregate.dp_rank;
    delete aggregate.max_running_requests;
    return {
      timestamp: new Date().toISOString(),
      version: this.s.o.version,
      dp_rank_count: 1,
      loads: [rank],
      aggregate,
    };
  }

  flushCache(res: ServerResponse): void {
    const snap = this.s.load.snapshot();
    const busy = snap.running + snap.queued > 0;
    if (!busy) this.s.prefixCache.clear();
    sendText(
      res,
      busy ? 400 : 200,
      'Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n',
    );
  }

  handleMetrics(res: ServerResponse): void {
    const snap = this.s.load.snapshot();
    const text = renderMetrics({
      modelName: this.s.o.modelPath,
      numRunningReqs: snap.running,
      numQueueReqs: snap.queued,
      tokenUsage: snap.tokensInUse / this.s.maxTotalNumTokens(),
      genThroughput: this.s.genThroughput(),
      cacheHitRate: this.s.promptTokensTotal > 0 ? this.s.cachedTokensTotal / this.s.promptTokensTotal : 0,
      promptTokensTotal: this.s.promptTokensTotal,
      // Counted as tokens are decoded, as SGLang does, not as requests end.
      generationTokensTotal: Math.max(this.s.generationTokensTotal, Math.floor(this.s.load.decodedTokensTotal())),
      cachedTokensTotal: this.s.cachedTokensTotal,
      requestsTotal: this.s.requestsTotal,
      e2eLatency: this.s.e2eLatency,
      queueTime: this.s.queueTime,
    });
    sendText(res, 200, text, 'text/plain; version=0.0.4; charset=utf-8');
  }

  // --- tokenize ---

  async handleTokenize(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    requireJsonContentType(req);
    const body = parseJsonBody(raw);
    if (!isRecord(body)) throw openAiError('Request body must be a JSON object');
    const addSpecial = body.add_special_tokens !== false;
    let result: { tokens: number[] | number[][]; count: number | number[] };
    try {
      if (Array.isArray(body.messages)) {
        // The chat template applied here, with the generation prompt unless add_generation_prompt is false.
        const chat = this.s.chatContext();
        const ctx: typeof chat =
          body.add_generation_prompt === false
            ? {
                ...chat,
                render: (messages, tools, templateKwargs) => {
                  try {
                    return this.s.tok.encode(
                      this.s.tok.applyChatTemplate(messages, { addGenerationPrompt: false, tools, templateKwargs }),
                    );
                  } catch (e: unknown) {
                    throw new SimValueError(errorMessage(e));
                  }
                },
              }
            : chat;
        const request = {
          messages: body.messages,
          max_tokens: 0,
          tools: body.tools,
          chat_template_kwargs: body.chat_template_kwargs,
        };
        const parsed = parseChat(request, ctx);
        result = { tokens: parsed.item.inputIds, count: parsed.item.inputIds.length };
      } else if (typeof body.prompt === 'string') {
        const tokens = this.s.encodeText(body.prompt, addSpecial);
        result = { tokens, count: tokens.length };
      } else if (Array.isArray(body.prompt) && body.prompt.every((p) => typeof p === 'string')) {
        const tokens = (body.prompt as string[]).map((p) => this.s.encodeText(p, addSpecial));
        result = { tokens, count: tokens.map((t) => t.length) };
      } else {
        throw openAiError('Either prompt (a string or a list of strings) or messages must be given');
      }
    } catch (e: unknown) {
      if (e instanceof SimValueError) throw openAiError(e.message);
      throw e;
    }
    sendJson(res, 200, { ...result, max_model_len: this.s.o.contextLength });
  }

  async handleDetokenize(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    requireJsonContentType(req);
    const body = parseJsonBody(raw);
    const tokens = isRecord(body) ? body.tokens : undefined;
    const isIds = (v: unknown): v is number[] =>
      Array.isArray(v) && v.every((x) => typeof x === 'number' && Number.isInteger(x));
    try {
      if (isIds(tokens)) {
        sendJson(res, 200, { text: this.s.tok.decode(tokens) });
      } else if (Array.isArray(tokens) && tokens.every(isIds)) {
        sendJson(res, 200, { text: (tokens as number[][]).map((t) => this.s.tok.decode(t)) });
      } else {
        throw openAiError('tokens must be a list of integers or a list of lists of integers');
      }
    } catch (e: unknown) {
      if (e instanceof HttpReplyError) throw e;
      throw openAiError(`Failed to detokenize: ${errorMessage(e)}`);
    }
  }

  // --- generation ---
}
