/**
 * The shapes a conversation regenerated turn by turn passes between its driver
 * (conversation-driver.ts), its turns (conversation-run.ts) and the outside world.
 */
import type { ChatTokenizer, Sample } from '../../shared/index.js';
import type { ConversationTools, ToolResultsStore } from './conversation-tools.js';
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

/** The driver's settings of one conversation (those of its batch). */
export interface ConversationOptions {
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
}

/** A step of a turn: its value, or the outcome the conversation stops at. */
export type TurnStep<T> = { ok: true; value: T } | { ok: false; outcome: ConversationOutcome };

/** Re-exported for the driver's callers. */
export type { Sample };
