/**
 * The turn records of conversations regenerated turn by turn (`turns: all`), gathered per
 * conversation for the SpecForge export, and written as the training rows the tokenize step
 * makes of them (tokenize-conversation-rows.ts):
 *
 * - with `postprocess.rows: conversation`, a conversation whose last turn is there with every
 *   earlier output spliced into its prompt (`history_outputs`), each earlier turn ended by the
 *   model (its output ends with the template's end-of-turn token) and supervised, is **one**
 *   `all-turns` line: the whole regenerated conversation, every assistant turn supervised
 *   (`train_only_last_turn: false`);
 * - a conversation whose row leaves an earlier turn's close (the end of turn the template wrote
 *   after a cut-off answer) or output unsupervised cannot be one SpecForge line, since SpecForge's
 *   loader supervises every assistant span of an `all-turns` line, the template's close included:
 *   it is one `last-turn` line per turn, like every other conversation (or all, with `rows:
 *   per-turn`): its history as context, its own answer supervised (`train_only_last_turn: true`).
 *   These lines supervise what its conversation row supervises, turn by turn.
 */
import {
  conversationTurns,
  errorMessage,
  parseChatMessages,
  turnHistory,
  type ChatMessage,
  type Logger,
} from '../../shared/index.js';
import {
  conversationRow,
  earlierTurnSpans,
  recordToRow,
  turnFields,
  type GenerationRecord,
} from '../../workers/index.js';
import type { TokenizeContext, TurnFields, TurnFinishOf } from '../../workers/index.js';
import { promptIdOf, type PromptIndex, type SampleIdScheme } from './prompt-index.js';
import {
  answerText,
  emitRow,
  noteProblem,
  promptMatches,
  turnAnswerText,
  type SpecForgeExportStats,
  type SpecForgeSink,
} from './specforge-rows.js';

/** Which conversation and turn a record is, and its prompt line's id (the conversation id less a `#s<j>` sample suffix). */
export interface TurnKey extends TurnFields {
  promptId: string;
  /**
   * The tool results its history placed after the previous turn's calls (the record's
   * `tool_results.messages`: the source's or the executor's), when it has some.
   */
  toolResults?: ChatMessage[];
}

/** The messages of a record's `tool_results`, or undefined when it has none that parse. */
function toolResultsOf(value: unknown): ChatMessage[] | undefined {
  const messages = (value as { tool_results?: { messages?: unknown } } | null)?.tool_results?.messages;
  if (!Array.isArray(messages) || messages.length === 0) return undefined;
  try {
    return parseChatMessages(messages, 'tool_results.messages');
  } catch {
    return undefined;
  }
}

/**
 * The conversation keys of a parsed generation line, or undefined for a record that is not a
 * turn. The prompt id is read by the dataset's id scheme ({@link promptIdOf}).
 */
export function turnOf(value: unknown, scheme: SampleIdScheme): TurnKey | undefined {
  const t = turnFields(value);
  if (t === undefined) return undefined;
  const toolResults = toolResultsOf(value);
  return {
    ...t,
    promptId: promptIdOf(t.conversationId, scheme, { conversation: true }),
    ...(toolResults === undefined ? {} : { toolResults }),
  };
}

/** One gathered turn. */
export interface GatheredTurn {
  key: TurnKey;
  record: GenerationRecord;
  file: string;
  line: number;
  /** When its record was written (`ts`): the day a dated template rendered its prompt. */
  generatedAt?: Date | undefined;
}

/** Turn records by conversation (memory: the records of one export partition). */
export class ConversationTurns {
  readonly byConversation = new Map<string, { promptId: string; turns: GatheredTurn[] }>();

  add(key: TurnKey, record: GenerationRecord, file: string, line: number, generatedAt?: Date): void {
    let c = this.byConversation.get(key.conversationId);
    if (c === undefined) {
      c = { promptId: key.promptId, turns: [] };
      this.byConversation.set(key.conversationId, c);
    }
    c.turns.push({ key, record, file, line, generatedAt });
  }
}

/** What {@link exportConversations} needs besides the gathered turns. */
export interface ConversationExport {
  dataset: string;
  ctx: TokenizeContext;
  sink: SpecForgeSink;
  /** `postprocess.rows`. */
  rows: 'per-turn' | 'conversation';
  index: PromptIndex;
  stats: SpecForgeExportStats;
  log: Logger;
}

/**
 * Writes the lines of the gathered conversations (see the module comment). Turns must run 1,
 * 2, … (the turns after a gap are left out, counted as invalid); turn 1's prompt must still
 * render from the prompt line (else the line changed since generation and the conversation is
 * left out). A turn that the tokenize step drops (truncated without `keepTruncated`) makes no line.
 */
export async function exportConversations(gathered: ConversationTurns, o: ConversationExport): Promise<void> {
  const { ctx, stats } = o;
  const note = (t: GatheredTurn, reason: string): void => noteProblem(stats, o.log, t.file, t.line, reason);
  for (const [id, c] of gathered.byConversation) {
    const sorted = c.turns.sort((a, b) => a.key.turn - b.key.turn);
    const first = sorted[0] as GatheredTurn;
    const gap = sorted.findIndex((t, i) => t.key.turn !== i + 1);
    if (gap >= 0) {
      stats.invalid += 1;
      note(first, `conversation ${id}: turn ${gap + 1} is missing from the generation files`);
    }
    const turns = gap >= 0 ? sorted.slice(0, gap) : sorted;
    if (turns.length === 0) continue;
    const prompt = await o.index.get(c.promptId);
    if (prompt === undefined || 'error' in prompt) {
      if (prompt === undefined) stats.promptMissing += 1;
      else stats.promptChanged += 1;
      note(first, `conversation ${id}: no usable line of ${o.index.file} has id ${c.promptId}`);
      continue;
    }
    const shape = conversationTurns(prompt.messages);
    let matches = false;
    try {
      matches =
        typeof shape !== 'string' &&
        promptMatches(
          ctx,
          turnHistory(prompt.messages, shape, 1, []),
          first.record.prompt_ids,
          first.generatedAt,
          prompt.tools,
        );
    } catch (e: unknown) {
      note(first, `conversation ${id}: its prompt cannot be rendered: ${errorMessage(e)}`);
    }
    if (typeof shape === 'string' || !matches) {
      stats.promptChanged += 1;
      note(first, `conversation ${id}: its line in ${o.index.file} does not render to turn 1's prompt_ids`);
      continue;
    }
    // As the history was sent: an answer's trailing end-of-turn token is the template's to write,
    // whatever the finish reason (SGLang reports `length` for an end token that is the last one allowed).
    const answers: ChatMessage[] = turns.map((t) => ({ role: 'assistant', content: turnAnswerText(ctx, t.record) }));
    // After each turn's calls, the results the next turn's history placed there (an executor's
    // differ from the source's), as the model saw them.
    const results = turns.map((_, j) => turns[j + 1]?.key.toolResults);
    const messagesOf = (k: number, last: ChatMessage): ChatMessage[] => [
      ...turnHistory(prompt.messages, shape, k, answers.slice(0, k - 1), results.slice(0, k - 1)),
      last,
    ];

    const last = turns[turns.length - 1] as GatheredTurn;
    const finishOf: TurnFinishOf = (k) => turns[k - 1]?.record.finish_reason.type;
    // One SpecForge line supervises every earlier turn with its close: only when each was ended by the model and kept.
    const oneLine =
      o.rows === 'conversation' &&
      gap < 0 &&
      last.key.turn === last.key.turns &&
      last.key.historyOutputs?.length === last.key.turn - 1 &&
      earlierTurnSpans(last.record, last.key, ctx, finishOf)?.every((s) => s.closedByModel && s.supervised) === true;
    const whole = oneLine ? conversationRow(last.record, last.key, ctx, o.dataset, finishOf) : undefined;
    if (whole !== undefined) {
      stats.inConversationRows += turns.length - 1;
      await emitRow(
        o.sink,
        ctx,
        stats,
        'all-turns',
        whole,
        messagesOf(turns.length, answers.at(-1) as ChatMessage),
        prompt.tools,
      );
      continue;
    }
    for (const t of turns) {
      const outcome = recordToRow(t.record, ctx, o.dataset);
      if (outcome.status === 'dropped') {
        if (outcome.reason === 'truncated') stats.droppedTruncated += 1;
        else if (outcome.reason === 'aborted') stats.droppedAborted += 1;
        else stats.droppedEmpty += 1;
        continue;
      }
      const k = t.key.turn;
      await emitRow(
        o.sink,
        ctx,
        stats,
        'last-turn',
        outcome.row,
        messagesOf(k, { role: 'assistant', content: answerText(ctx, t.record) }),
        prompt.tools,
      );
      if (outcome.row.finish_reason === 'length' || outcome.row.finish_reason === 'abort') stats.keptTruncated += 1;
      else if (!outcome.closedTurn) stats.stopWithoutEndOfTurn += 1;
    }
  }
}
