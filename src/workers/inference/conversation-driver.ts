/**
 * Regenerates one conversation turn by turn (`datasets[].turns: all`; docs/multi-turn.md).
 *
 * Turn k's prompt is the chat template's rendering of the history with the answers regenerated
 * for turns 1..k−1 (spliced from their ids where the template continues exactly, see
 * `renderTurnPrompt`). Each turn is one request, started and committed like any sample under its
 * own id (`<conversation>#t<k>`): exactly once, counted against the dataset's budget.
 * commit-sample-9.lua keeps each committed turn's output ids in the conversation's history in the
 * same step, so a conversation picked up again (a re-delivered batch, another worker after a
 * kill -9) resumes at its next turn with exactly the history its committed turns had, and a turn
 * that another process committed first is continued with that process's answer.
 *
 * A conversation ends early, keeping its finished turns, when a turn's prompt no longer fits the
 * context, when a turn fails (e.g. a 400 from the server), when a committed turn's answer
 * cannot be read back, or when its own data makes an error (a chat template that raises for a
 * later turn's history, a message that does not parse, an id the tokenizer cannot decode): one
 * conversation's error is that conversation's end, never its batch's (docs/design.md,
 * invariant 12). Only an error of the environment (a retryable one: Redis, a tokenizer server
 * that is down) leaves the driver, so that the batch is tried again. The budget or a stop only
 * pauses a conversation (it resumes at its next turn).
 */
import {
  AppError,
  answerMessage,
  errorMessage,
  conversationTurns,
  parseChatMessage,
  renderTurnPrompt,
  turnHistory,
  turnSampleId,
  type ChatMessage,
  type ChatTokenizer,
  type RegeneratedAnswer,
  type Sample,
} from '../../shared/index.js';
import { isAgentic, readToolTurn, type ConversationTools, type ToolResultsStore } from './conversation-tools.js';
import type { SampleOutcome, SampleRequest } from './dispatch-types.js';

/** How a conversation ended, as finish-conversation-4.lua records it. */
export interface ConversationEnd {
  /** `complete`: every turn committed; `ended`: stopped early at `turn` for `reason`. */
  kind: 'complete' | 'ended';
  /** Turns committed. */
  turnsDone: number;
  turns: number;
  /** The turn that could not be generated (ended only). */
  turn?: number;
  reason?: string;
  /** Turns whose prompt was spliced from the previous turn's ids. */
  spliced: number;
}

/** What the driver needs from the outside world. */
export interface ConversationDeps {
  tokenizer(): Promise<ChatTokenizer>;
  /** The committed turns' output ids, by turn (the conversation's history). */
  history(dataset: string, conversationId: string): Promise<Map<number, number[]>>;
  /** Whether each sample id is committed. */
  isDone(dataset: string, ids: readonly string[]): Promise<boolean[]>;
  /** Whether each conversation id has finished (another delivery may end it while this one runs). */
  finished?(dataset: string, ids: readonly string[]): Promise<boolean[]>;
  /** Records the conversation's end once and drops its history; `failedTurnId` folds that turn's failure record into it. */
  finish(dataset: string, conversationId: string, end: ConversationEnd, failedTurnId?: string): Promise<void>;
  submit(req: SampleRequest): Promise<SampleOutcome>;
  /**
   * Whether this delivery still holds its batch: false once its lock went to another worker
   * (after a stall), which then drives the conversation from its committed turns. Asked before
   * every turn after the first, so that the remaining turns are not generated twice.
   */
  stillHeld?(): Promise<boolean>;
  /** Told when the conversation ends before its last turn, so that a slot held for its next turn is freed. */
  ended?(dataset: string, conversationId: string): void;
  /** Where an executor's tool results are recorded once (conversations with `toolExecutor`). */
  toolResults?: ToolResultsStore;
}

/** What one conversation came to in this delivery. */
export type ConversationOutcome =
  | { kind: 'finished'; end: ConversationEnd; committed: number; outputTokens: number }
  | { kind: 'skipped-budget'; committed: number; outputTokens: number }
  | { kind: 'handed-back'; committed: number; outputTokens: number }
  /** Found finished by another delivery before its next turn: nothing more to do here. */
  | { kind: 'finished-elsewhere'; committed: number; outputTokens: number };

/** A turn request's settings besides its prompt (those of the batch). */
export type TurnRequestBase = Omit<SampleRequest, 'sample' | 'conversation' | 'preferEndpoint' | 'attemptsSpent'>;

/**
 * Runs `sample`'s conversation from its first turn not committed to its end (or until the budget
 * or a stop pauses it). `sample.promptIds` is turn 1's prompt, rendered by the producer.
 */
export async function driveConversation(
  sample: Sample,
  base: TurnRequestBase,
  opts: {
    templateKwargs?: Record<string, unknown>;
    contextLength?: number;
    maxNewTokens: number;
    /** The least max_new_tokens a turn is sent with (default 1); below it the conversation ends (`context`). */
    minNewTokens?: number;
    /**
     * How the model writes tool calls, the record's tools and the executor: an agentic
     * conversation's calls are read after each turn and answered (conversation-tools.ts).
     */
    tools?: Omit<ConversationTools, 'store'>;
  },
  deps: ConversationDeps,
): Promise<ConversationOutcome> {
  const { dataset } = base;
  let messages: ChatMessage[];
  let turns: ReturnType<typeof conversationTurns>;
  try {
    messages = (sample.messages ?? []).map((m, i) => parseChatMessage(m, `messages[${i}]`));
    turns = conversationTurns(messages);
  } catch (e: unknown) {
    turns = oneLine(e);
    messages = [];
  }
  if (typeof turns === 'string') {
    // The producer checked the line; a payload that disagrees ends its conversation, not the batch.
    const end: ConversationEnd = {
      kind: 'ended',
      turnsDone: 0,
      turns: 0,
      turn: 1,
      reason: `error: ${turns}`,
      spliced: 0,
    };
    await deps.finish(dataset, sample.id, end);
    return { kind: 'finished', end, committed: 0, outputTokens: 0 };
  }
  const total = turns.starts.length;
  const tools: ConversationTools | undefined =
    opts.tools !== undefined && isAgentic(messages, opts.tools.tools)
      ? { ...opts.tools, store: deps.toolResults }
      : undefined;
  const tok = await deps.tokenizer();
  // Which turns are committed first, then their history, one after the other: commit-sample-9.lua
  // writes a turn's answer into the history in the step that marks it committed, so every turn
  // found committed here is in the history read after it. Read side by side, a turn that another
  // delivery of the batch commits between the two reads would look committed with no answer, and
  // the conversation would end `history-lost` while that delivery goes on writing its turns.
  const done = await deps.isDone(
    dataset,
    turns.starts.map((_, k) => turnSampleId(sample.id, k + 1)),
  );
  const history = await deps.history(dataset, sample.id);
  const answers: RegeneratedAnswer[] = [];
  /** The tool results that follow each turn's answer (matched or executed), by turn index. */
  const results: (ChatMessage[] | undefined)[] = [];
  /** What turn k's history placed after turn k − 1's calls, for turn k's record. */
  let placed: { origin: 'source' | 'executor'; messages: ChatMessage[] } | undefined;
  let previous: { promptIds: number[]; history: ChatMessage[]; text?: string } | undefined;
  let committed = 0;
  let outputTokens = 0;
  let spliced = 0;
  /**
   * Where each earlier turn's output sits in this turn's prompt ids, `[start, length]`, while every
   * turn so far was spliced (the prompt then holds the outputs as they were generated); undefined
   * once one was rendered from text. A conversation row supervises these spans.
   */
  let historyOutputs: [number, number][] | undefined = [];
  let endpoint: string | undefined;
  const finish = async (end: Omit<ConversationEnd, 'turns' | 'spliced'>, failedTurnId?: string) => {
    const full: ConversationEnd = { ...end, turns: total, spliced };
    if (full.kind === 'ended') deps.ended?.(dataset, sample.id);
    await deps.finish(dataset, sample.id, full, failedTurnId);
    return { kind: 'finished' as const, end: full, committed, outputTokens };
  };
  // Every turn committed already (its end not recorded: a crash right after the last commit, or a
  // Redis rebuilt from the files, which restores commits but not histories): it is complete.
  if (done.every((d) => d)) return finish({ kind: 'complete', turnsDone: total });

  for (let k = 1; k <= total; k += 1) {
    const turnId = turnSampleId(sample.id, k);
    const hist = turnHistory(
      messages,
      turns,
      k,
      answers.map((a) => a.message),
      results,
    );
    let promptIds: number[];
    let text: string | undefined;
    let thisSpliced = false;
    if (k === 1) {
      promptIds = sample.promptIds;
    } else {
      const prev = previous as NonNullable<typeof previous>;
      let prompt: ReturnType<typeof renderTurnPrompt>;
      try {
        // With server-side tokenization, texts not seen yet are tokenized by the server first.
        prompt = await tok.withServerTokens(() =>
          renderTurnPrompt(tok, {
            history: hist,
            previous: { ...prev, answer: answers[k - 2] as RegeneratedAnswer },
            ...(opts.templateKwargs === undefined ? {} : { templateKwargs: opts.templateKwargs }),
            ...(sample.tools === undefined ? {} : { tools: sample.tools }),
          }),
        );
      } catch (e: unknown) {
        if (isEnvironmentError(e)) throw e;
        return finish({ kind: 'ended', turnsDone: k - 1, turn: k, reason: `error: turn ${k}: ${oneLine(e)}` });
      }
      promptIds = prompt.ids;
      text = prompt.text;
      thisSpliced = prompt.spliced;
      if (prompt.spliced) spliced += 1;
      const prevOutput = (answers[k - 2] as RegeneratedAnswer).outputIds;
      historyOutputs =
        prompt.spliced && historyOutputs !== undefined
          ? [...historyOutputs, [prev.promptIds.length, prevOutput.length]]
          : undefined;
    }
    const known = history.get(k);
    if (known === undefined && done[k - 1] === true) {
      // Committed, but its answer is not in the history (Redis was rebuilt from the files): the
      // conversation cannot go on with the same history; its committed turns are kept.
      return finish({ kind: 'ended', turnsDone: k, turn: k + 1, reason: 'history-lost' });
    }
    let outputIds = known;
    if (outputIds === undefined) {
      // Another delivery of this conversation ended it meanwhile (e.g. a turn of its that failed):
      // no turn is started past its end.
      if (k > 1 && (await deps.finished?.(dataset, [sample.id]))?.[0] === true)
        return { kind: 'finished-elsewhere', committed, outputTokens };
      // The batch was taken over by another worker: it goes on from the committed turns.
      if (k > 1 && deps.stillHeld !== undefined && !(await deps.stillHeld()))
        return { kind: 'handed-back', committed, outputTokens };
      const ctx = opts.contextLength;
      const floor = Math.min(opts.minNewTokens ?? 1, opts.maxNewTokens);
      if (ctx !== undefined && ctx - promptIds.length < floor) {
        return finish({
          kind: 'ended',
          turnsDone: k - 1,
          turn: k,
          reason: `context: turn ${k}'s prompt has ${promptIds.length} tokens; the context length is ${ctx}${floor > 1 ? `, which leaves fewer than minNewTokens (${floor})` : ''}`,
        });
      }
      const o = await deps.submit({
        ...base,
        sample: {
          id: turnId,
          line: sample.line,
          promptIds,
          maxNewTokens: ctx === undefined ? opts.maxNewTokens : Math.min(opts.maxNewTokens, ctx - promptIds.length),
        },
        attemptsSpent: 0,
        conversation: {
          id: sample.id,
          turn: k,
          turns: total,
          spliced: thisSpliced,
          ...(historyOutputs === undefined ? {} : { historyOutputs }),
          ...(placed === undefined ? {} : { toolResults: placed }),
        },
        ...(endpoint === undefined ? {} : { preferEndpoint: endpoint }),
      });
      switch (o.kind) {
        case 'committed':
          committed += 1;
          outputTokens += o.completionTokens;
          endpoint = o.endpoint ?? endpoint;
          outputIds = o.outputIds === undefined ? undefined : [...o.outputIds];
          break;
        case 'duplicate':
          break; // another process committed this turn first: continue with its answer
        case 'failed':
          return finish(
            {
              kind: 'ended',
              turnsDone: k - 1,
              turn: k,
              reason: `failed: turn ${k}${o.status === undefined ? '' : ` (HTTP ${o.status})`}: ${o.reason}`,
            },
            turnId,
          );
        case 'skipped-budget':
          return { kind: 'skipped-budget', committed, outputTokens };
        case 'handed-back':
          return { kind: 'handed-back', committed, outputTokens };
      }
      if (outputIds === undefined) outputIds = (await deps.history(dataset, sample.id)).get(k);
      if (outputIds === undefined) return finish({ kind: 'ended', turnsDone: k, turn: k + 1, reason: 'history-lost' });
    }
    let message: ChatMessage;
    placed = undefined;
    try {
      const ids = outputIds;
      if (tools === undefined) {
        message = await tok.withServerTokens(() => answerMessage(tok, ids));
      } else {
        // Decoded (and fetched from the server's /tokenize where it tokenizes) before the calls are read.
        await tok.withServerTokens(() => answerMessage(tok, ids));
        const read = await readToolTurn(
          tok,
          { dataset, conversationId: sample.id, turn: k, total, outputIds: ids, messages, turns },
          tools,
        );
        if (read.kind === 'end') return finish({ kind: 'ended', turnsDone: k, turn: k, reason: read.reason });
        message = read.message;
        if (read.results !== undefined && read.origin !== undefined) {
          results[k - 1] = read.results;
          placed = { origin: read.origin, messages: read.results };
        }
      }
    } catch (e: unknown) {
      if (isEnvironmentError(e)) throw e;
      return finish({
        kind: 'ended',
        turnsDone: k,
        turn: k + 1,
        reason: `error: turn ${k}'s answer cannot be read back: ${oneLine(e)}`,
      });
    }
    answers.push({ outputIds, message });
    previous = { promptIds, history: hist, ...(text === undefined ? {} : { text }) };
  }
  return finish({ kind: 'complete', turnsDone: total });
}

/**
 * An error of the environment, not of the conversation: a retryable {@link AppError} (Redis, a
 * tokenizer server that is down, a timeout). It leaves the driver, and the batch is tried again.
 */
function isEnvironmentError(e: unknown): boolean {
  return e instanceof AppError && e.retryable;
}

/** The error's message on one bounded line: it is shown in status and on the pipeline page. */
function oneLine(e: unknown): string {
  const line = errorMessage(e).replace(/\s+/g, ' ').trim();
  return line.length > 300 ? `${line.slice(0, 297)}...` : line;
}
