/**
 * One conversation's turns in one delivery (see conversation-driver.ts): what is committed
 * already, the answers and tool results so far, and the three steps of a turn — its prompt, its
 * output (sent, or read back when committed), its answer as the next turn's history reads it.
 */
import {
  AppError,
  answerMessage,
  errorMessage,
  renderTurnPrompt,
  turnHistory,
  turnSampleId,
  type ChatMessage,
  type ChatTokenizer,
  type ConversationTurns,
  type RegeneratedAnswer,
  type Sample,
} from '../../shared/index.js';
import { readToolTurn, type ConversationTools } from './conversation-tools.js';
import type {
  ConversationDeps,
  ConversationEnd,
  ConversationOptions,
  ConversationOutcome,
  TurnRequestBase,
  TurnStep,
} from './conversation-types.js';

/** A turn's prompt ids, and how they were made. */
export interface TurnPromptIds {
  ids: number[];
  /** The rendering of the turn's history (the next turn's splice saves rendering it again). */
  text?: string;
  spliced: boolean;
}

export class ConversationRun {
  readonly total: number;
  private readonly answers: RegeneratedAnswer[] = [];
  /** The tool results that follow each turn's answer (matched or executed), by turn index. */
  private readonly results: (ChatMessage[] | undefined)[] = [];
  /** What turn k's history placed after turn k − 1's calls, for turn k's record. */
  private placed: { origin: 'source' | 'executor'; messages: ChatMessage[] } | undefined;
  private previous: { promptIds: number[]; history: ChatMessage[]; text?: string } | undefined;
  private committed = 0;
  private outputTokens = 0;
  private spliced = 0;
  /**
   * Where each earlier turn's output sits in this turn's prompt ids, `[start, length]`, while every
   * turn so far was spliced (the prompt then holds the outputs as they were generated); undefined
   * once one was rendered from text. A conversation row supervises these spans.
   */
  private historyOutputs: [number, number][] | undefined = [];
  private endpoint: string | undefined;

  constructor(
    private readonly sample: Sample,
    private readonly base: TurnRequestBase,
    private readonly opts: ConversationOptions,
    private readonly deps: ConversationDeps,
    private readonly tok: ChatTokenizer,
    private readonly messages: readonly ChatMessage[],
    private readonly turns: ConversationTurns,
    private readonly tools: ConversationTools | undefined,
    /** Whether each turn was committed when the delivery started, and the committed outputs. */
    private readonly done: readonly boolean[],
    private readonly history: ReadonlyMap<number, number[]>,
  ) {
    this.total = turns.starts.length;
  }

  private get dataset(): string {
    return this.base.dataset;
  }

  /** Records the conversation's end (once, in Redis) and returns the outcome. */
  async finish(end: Omit<ConversationEnd, 'turns' | 'spliced'>, failedTurnId?: string): Promise<ConversationOutcome> {
    const full: ConversationEnd = { ...end, turns: this.total, spliced: this.spliced };
    if (full.kind === 'ended') this.deps.ended?.(this.dataset, this.sample.id);
    await this.deps.finish(this.dataset, this.sample.id, full, failedTurnId);
    return { kind: 'finished', end: full, committed: this.committed, outputTokens: this.outputTokens };
  }

  private stop(kind: 'skipped-budget' | 'handed-back' | 'finished-elsewhere'): TurnStep<never> {
    return { ok: false, outcome: { kind, committed: this.committed, outputTokens: this.outputTokens } };
  }

  private async end(end: Omit<ConversationEnd, 'turns' | 'spliced'>, failedTurnId?: string): Promise<TurnStep<never>> {
    return { ok: false, outcome: await this.finish(end, failedTurnId) };
  }

  /** Turn k's history: the source's messages with the answers and tool results so far. */
  historyOf(k: number): ChatMessage[] {
    return turnHistory(
      this.messages,
      this.turns,
      k,
      this.answers.map((a) => a.message),
      this.results,
    );
  }

  /** Turn k's prompt ids: the producer's for turn 1, else spliced or rendered (turns.ts). */
  async prompt(k: number, hist: readonly ChatMessage[]): Promise<TurnStep<TurnPromptIds>> {
    if (k === 1) return { ok: true, value: { ids: this.sample.promptIds, spliced: false } };
    const prev = this.previous as NonNullable<typeof this.previous>;
    const answer = this.answers[k - 2] as RegeneratedAnswer;
    let prompt: ReturnType<typeof renderTurnPrompt>;
    try {
      // With server-side tokenization, texts not seen yet are tokenized by the server first.
      prompt = await this.tok.withServerTokens(() =>
        renderTurnPrompt(this.tok, {
          history: hist,
          previous: { ...prev, answer },
          ...(this.opts.templateKwargs === undefined ? {} : { templateKwargs: this.opts.templateKwargs }),
          ...(this.sample.tools === undefined ? {} : { tools: this.sample.tools }),
        }),
      );
    } catch (e: unknown) {
      if (isEnvironmentError(e)) throw e;
      return this.end({ kind: 'ended', turnsDone: k - 1, turn: k, reason: `error: turn ${k}: ${oneLine(e)}` });
    }
    if (prompt.spliced) this.spliced += 1;
    this.historyOutputs =
      prompt.spliced && this.historyOutputs !== undefined
        ? [...this.historyOutputs, [prev.promptIds.length, answer.outputIds.length]]
        : undefined;
    return { ok: true, value: { ids: prompt.ids, text: prompt.text, spliced: prompt.spliced } };
  }

  /** Turn k's output ids: read back when it is committed already, else generated now. */
  async output(k: number, prompt: TurnPromptIds): Promise<TurnStep<number[]>> {
    const known = this.history.get(k);
    if (known === undefined && this.done[k - 1] === true) {
      // Committed, but its answer is not in the history (Redis was rebuilt from the files): the
      // conversation cannot go on with the same history; its committed turns are kept.
      return this.end({ kind: 'ended', turnsDone: k, turn: k + 1, reason: 'history-lost' });
    }
    if (known !== undefined) return { ok: true, value: known };
    // Another delivery of this conversation ended it meanwhile (e.g. a turn of its that failed):
    // no turn is started past its end.
    if (k > 1 && (await this.deps.finished?.(this.dataset, [this.sample.id]))?.[0] === true)
      return this.stop('finished-elsewhere');
    // The batch was taken over by another worker: it goes on from the committed turns.
    if (k > 1 && this.deps.stillHeld !== undefined && !(await this.deps.stillHeld())) return this.stop('handed-back');
    const ctx = this.opts.contextLength;
    const floor = Math.min(this.opts.minNewTokens ?? 1, this.opts.maxNewTokens);
    if (ctx !== undefined && ctx - prompt.ids.length < floor) {
      return this.end({
        kind: 'ended',
        turnsDone: k - 1,
        turn: k,
        reason: `context: turn ${k}'s prompt has ${prompt.ids.length} tokens; the context length is ${ctx}${prompt.ids.length < ctx ? `, which leaves ${ctx - prompt.ids.length}, fewer than minNewTokens (${floor})` : ''}`,
      });
    }
    const turnId = turnSampleId(this.sample.id, k);
    const o = await this.deps.submit({
      ...this.base,
      sample: {
        id: turnId,
        line: this.sample.line,
        promptIds: prompt.ids,
        maxNewTokens:
          ctx === undefined ? this.opts.maxNewTokens : Math.min(this.opts.maxNewTokens, ctx - prompt.ids.length),
      },
      attemptsSpent: 0,
      conversation: {
        id: this.sample.id,
        turn: k,
        turns: this.total,
        spliced: prompt.spliced,
        ...(this.historyOutputs === undefined ? {} : { historyOutputs: this.historyOutputs }),
        ...(this.placed === undefined ? {} : { toolResults: this.placed }),
      },
      ...(this.endpoint === undefined ? {} : { preferEndpoint: this.endpoint }),
    });
    let outputIds: number[] | undefined;
    switch (o.kind) {
      case 'committed':
        this.committed += 1;
        this.outputTokens += o.completionTokens;
        this.endpoint = o.endpoint ?? this.endpoint;
        outputIds = o.outputIds === undefined ? undefined : [...o.outputIds];
        break;
      case 'duplicate':
        break; // another process committed this turn first: continue with its answer
      case 'failed':
        return this.end(
          {
            kind: 'ended',
            turnsDone: k - 1,
            turn: k,
            reason: `failed: turn ${k}${o.status === undefined ? '' : ` (HTTP ${o.status})`}: ${o.reason}`,
          },
          turnId,
        );
      case 'skipped-budget':
      case 'handed-back':
        return this.stop(o.kind);
    }
    outputIds ??= (await this.deps.history(this.dataset, this.sample.id)).get(k);
    if (outputIds === undefined) return this.end({ kind: 'ended', turnsDone: k, turn: k + 1, reason: 'history-lost' });
    return { ok: true, value: outputIds };
  }

  /** Turn k's answer as the next turn's history carries it: its text, and with tools its calls and their results. */
  async answer(k: number, outputIds: readonly number[]): Promise<TurnStep<ChatMessage>> {
    this.placed = undefined;
    const tok = this.tok;
    try {
      // Decoded (and fetched from the server's /tokenize where it tokenizes) before the calls are read.
      const plain = await tok.withServerTokens(() => answerMessage(tok, outputIds));
      if (this.tools === undefined) return { ok: true, value: plain };
      const read = await readToolTurn(
        tok,
        {
          dataset: this.dataset,
          conversationId: this.sample.id,
          turn: k,
          total: this.total,
          outputIds,
          messages: this.messages,
          turns: this.turns,
        },
        this.tools,
      );
      if (read.kind === 'end') return this.end({ kind: 'ended', turnsDone: k, turn: k, reason: read.reason });
      if (read.results !== undefined && read.origin !== undefined) {
        this.results[k - 1] = read.results;
        this.placed = { origin: read.origin, messages: read.results };
      }
      return { ok: true, value: read.message };
    } catch (e: unknown) {
      if (isEnvironmentError(e)) throw e;
      return this.end({
        kind: 'ended',
        turnsDone: k,
        turn: k + 1,
        reason: `error: turn ${k}'s answer cannot be read back: ${oneLine(e)}`,
      });
    }
  }

  /** Turn k is done: its answer and prompt are what turn k + 1 builds on. */
  advance(prompt: TurnPromptIds, hist: ChatMessage[], outputIds: number[], message: ChatMessage): void {
    this.answers.push({ outputIds, message });
    this.previous = {
      promptIds: prompt.ids,
      history: hist,
      ...(prompt.text === undefined ? {} : { text: prompt.text }),
    };
  }
}

/**
 * An error of the environment, not of the conversation: a retryable {@link AppError} (Redis, a
 * tokenizer server that is down, a timeout). It leaves the driver, and the batch is tried again.
 */
export function isEnvironmentError(e: unknown): boolean {
  return e instanceof AppError && e.retryable;
}

/** The error's message on one bounded line: it is shown in status and on the pipeline page. */
export function oneLine(e: unknown): string {
  const line = errorMessage(e).replace(/\s+/g, ' ').trim();
  return line.length > 300 ? `${line.slice(0, 297)}...` : line;
}
