/**
 * The generation routes of the simulated SGLang: /generate (single, batch, stream), the
 * OpenAI chat route, /abort_request, and the requests they hold in the load model.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';

import { isRecord } from '../shared/index.js';
import { type Active, ActiveRequests, type Outcome } from './active-requests.js';
import { dropConnection, replyBadAnswer, replyQueueFull, replyServerError, replyTruncated } from './fault-replies.js';
import type { FaultKind } from './faults.js';
import {
  nativeError,
  openAiError,
  parseJsonBody,
  readBody,
  requireJsonContentType,
  sendEmpty,
  sendJson,
  startEventStream,
  writeEvent,
} from './http-util.js';
import type { FinishReason } from './output-model.js';
import { type GenerateItem, SimValueError, parseChat, parseGenerate } from './request-parsing.js';
import {
  type ItemOutput,
  abortBeforePrefillBody,
  chatBody,
  chatChunk,
  chatUsageChunk,
  generateBody,
} from './responses.js';
import type { SimState } from './state.js';

/** How often a streamed response checks for new tokens (wall ms). */
const STREAM_TICK_MS = 40;
export const GENERATE_ROUTE = '/generate';
export const CHAT_ROUTE = '/v1/chat/completions';

/** What the generation routes ask of the server around them. */
export interface GenerationHooks {
  /** The server process dies (a poison prompt) and comes back after `downMs`. */
  crash(downMs: number): void;
}

export class GenerationRoutes {
  private readonly requests: ActiveRequests;
  private readonly streamTimers = new Set<ReturnType<typeof setInterval>>();

  constructor(
    private readonly s: SimState,
    private readonly hooks: GenerationHooks,
  ) {
    this.requests = new ActiveRequests(s);
  }

  /** Stops streaming and ends every request held (the server went away). */
  cancelAll(): void {
    for (const timer of this.streamTimers) clearInterval(timer);
    this.streamTimers.clear();
    this.requests.cancelAll();
  }

  /**
   * Applies an injected fault, the poison and first-try faults first. Returns true when the
   * request is fully handled (answered, dropped, hung, or the server crashed).
   */
  private applyFault(
    fault: FaultKind,
    req: IncomingMessage,
    res: ServerResponse,
    items: readonly GenerateItem[],
    route: string,
    fullBody: () => unknown,
  ): boolean {
    const { faults } = this.s;
    if (items.some((item) => faults.isPoison(item.rid))) {
      // The prompt kills the server: the connection dies with it, then it restarts.
      this.s.counters.failed += items.length;
      this.s.log.info({ rids: items.map((i) => i.rid) }, 'poison prompt: crashing');
      dropConnection(req);
      this.hooks.crash(faults.current().poisonDownMs);
      return true;
    }
    if (faults.firstTry503(items.map((item) => item.rid))) {
      this.s.counters.failed += items.length;
      replyQueueFull(res);
      return true;
    }
    switch (fault) {
      case 'none':
        return false;
      case 'error':
        this.s.counters.failed += items.length;
        replyServerError(res);
        return true;
      case 'unavailable':
        this.s.counters.failed += items.length;
        replyQueueFull(res);
        return true;
      case 'drop':
        this.s.counters.failed += items.length;
        dropConnection(req);
        return true;
      case 'malformed':
        this.s.counters.failed += items.length;
        replyTruncated(res, fullBody());
        return true;
      case 'bad-answer':
        this.s.counters.failed += items.length;
        replyBadAnswer(res, faults.current().badAnswer, fullBody);
        return true;
      case 'hang': {
        const hung = items.map((item) => this.requests.newActive(item, route, true));
        res.on('close', () => {
          for (const a of hung) this.requests.cancel(a);
        });
        // Answered only if /abort_request ends them: with what a queued request gets.
        void Promise.all(hung.map((a) => a.done)).then((outcomes) => {
          if (outcomes.some((o) => o.kind === 'cancelled') || res.writableEnded) return;
          if (route === CHAT_ROUTE) {
            const a = hung[0];
            if (a !== undefined) sendJson(res, 200, this.requests.chatAbortBody(a));
            return;
          }
          const bodies = hung.map((a) => abortBeforePrefillBody(this.s.o.version, a.rid));
          sendJson(res, 200, items.length > 1 ? bodies : bodies[0]);
        });
        return true;
      }
    }
  }

  async handleGenerate(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    let parsed: ReturnType<typeof parseGenerate>;
    try {
      parsed = parseGenerate(parseJsonBody(raw), {
        encode: (text) => this.s.encodeText(text),
        vocabSize: this.s.tok.vocabSize,
        contextLength: this.s.o.contextLength,
        version: this.s.o.version,
      });
    } catch (e: unknown) {
      this.s.counters.requestsReceived++;
      this.s.counters.failed++;
      if (e instanceof SimValueError) throw nativeError(e.message);
      throw e;
    }
    const { items } = parsed;
    this.requests.record(GENERATE_ROUTE, items);
    try {
      this.requests.admit(items, false);
    } catch (e: unknown) {
      this.s.counters.failed += items.length;
      throw e;
    }
    const fault = this.s.faults.next();
    const fullBody = (): unknown => {
      const bodies = items.map((item) =>
        generateBody(this.s.o.version, this.requests.instantOutput(item), { finished: true }),
      );
      return parsed.isBatch ? bodies : bodies[0];
    };
    if (this.applyFault(fault, req, res, items, GENERATE_ROUTE, fullBody)) return;

    const actives = items.map((item) => this.requests.begin(item, GENERATE_ROUTE));
    res.on('close', () => {
      if (!res.writableEnded) for (const a of actives) this.requests.cancel(a);
    });
    if (parsed.stream) {
      this.streamGenerate(res, actives, parsed.isBatch, parsed.returnLogprob);
      return;
    }
    const outcomes = await Promise.all(actives.map((a) => a.done));
    if (outcomes.some((o) => o.kind === 'cancelled')) return;
    const bodies = actives.map((a, i) => {
      const out = this.requests.outputOf(a, outcomes[i] as Outcome);
      if (out === 'before-prefill') return abortBeforePrefillBody(this.s.o.version, a.rid);
      return generateBody(this.s.o.version, out, { finished: true, returnLogprob: parsed.returnLogprob });
    });
    sendJson(res, 200, parsed.isBatch ? bodies : bodies[0]);
  }

  /** Polls decode progress and streams cumulative outputs, one event per new tokens. */
  private streamProgress(a: Active, onTokens: (ids: number[], newText: string) => void): () => void {
    let sent = 0;
    const timer = setInterval(() => {
      const p = this.s.load.progress(a.rid);
      if (p === undefined || p.generatedTokens <= sent) return;
      const ids = this.requests.fullIds(a).slice(0, p.generatedTokens);
      const fresh = ids.slice(sent);
      sent = p.generatedTokens;
      onTokens(ids, this.s.tok.decode(fresh, { skipSpecialTokens: true }));
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
        writeEvent(
          res,
          generateBody(this.s.o.version, partial, {
            finished: false,
            returnLogprob,
            ...(index === undefined ? {} : { index }),
          }),
        );
      });
      void a.done.then((outcome) => {
        stopTicking();
        if (outcome.kind === 'cancelled') return;
        const out = this.requests.outputOf(a, outcome);
        writeEvent(
          res,
          out === 'before-prefill'
            ? abortBeforePrefillBody(this.s.o.version, a.rid, index)
            : generateBody(this.s.o.version, out, {
                finished: true,
                returnLogprob,
                ...(index === undefined ? {} : { index }),
              }),
        );
        remaining--;
        if (remaining === 0) {
          writeEvent(res, '[DONE]');
          res.end();
        }
      });
    });
  }

  async handleChat(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    let parsed: ReturnType<typeof parseChat>;
    try {
      requireJsonContentType(req);
      parsed = parseChat(parseJsonBody(raw), this.s.chatContext());
    } catch (e: unknown) {
      this.s.counters.requestsReceived++;
      this.s.counters.failed++;
      if (e instanceof SimValueError) throw openAiError(e.message);
      throw e;
    }
    const { item, model } = parsed;
    this.requests.record(CHAT_ROUTE, [item]);
    try {
      this.requests.admit([item], true);
    } catch (e: unknown) {
      this.s.counters.failed++;
      throw e;
    }
    const created = Math.floor(Date.now() / 1000);
    const fault = this.s.faults.next();
    if (
      this.applyFault(fault, req, res, [item], CHAT_ROUTE, () =>
        chatBody(this.s.o.version, this.requests.instantOutput(item), model, created),
      )
    ) {
      return;
    }
    const a = this.requests.begin(item, CHAT_ROUTE);
    res.on('close', () => {
      if (!res.writableEnded) this.requests.cancel(a);
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
      const out = this.requests.outputOf(a, outcome);
      const finish: FinishReason =
        out === 'before-prefill'
          ? { type: 'abort', message: 'Abort before prefill' }
          : (out.finishReason ?? a.plan.finishReason);
      writeEvent(res, chatChunk(a, model, created, {}, finish));
      if (parsed.includeUsage && out !== 'before-prefill')
        writeEvent(res, chatUsageChunk(this.s.o.version, out, model, created));
      writeEvent(res, '[DONE]');
      res.end();
      return;
    }
    const outcome = await a.done;
    if (outcome.kind === 'cancelled') return;
    const out = this.requests.outputOf(a, outcome);
    sendJson(
      res,
      200,
      out === 'before-prefill' ? this.requests.chatAbortBody(a) : chatBody(this.s.o.version, out, model, created),
    );
  }

  async handleAbort(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = parseJsonBody(await readBody(req), true);
    const rid = isRecord(body) && typeof body.rid === 'string' ? body.rid : '';
    const all = isRecord(body) && body.abort_all === true;
    // Like TokenizerManager.abort_request: an unknown rid is a no-op; the scheduler then
    // aborts every request whose rid starts with it.
    if (all || this.requests.has(rid)) {
      for (const a of this.requests.all()) {
        if (all || a.rid.startsWith(rid)) this.requests.abortActive(a);
      }
    }
    sendEmpty(res, 200);
  }

  // --- admin ---
}
