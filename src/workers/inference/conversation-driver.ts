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
import { conversationTurns, parseChatMessage, turnSampleId, type ChatMessage } from '../../shared/index.js';
import { isAgentic, type ConversationTools } from './conversation-tools.js';
import { ConversationRun, oneLine } from './conversation-run.js';
import type {
  ConversationDeps,
  ConversationEnd,
  ConversationOptions,
  ConversationOutcome,
  Sample,
  TurnRequestBase,
} from './conversation-types.js';

export type {
  ConversationDeps,
  ConversationEnd,
  ConversationOptions,
  ConversationOutcome,
  TurnRequestBase,
} from './conversation-types.js';

/**
 * Runs `sample`'s conversation from its first turn not committed to its end (or until the budget
 * or a stop pauses it). `sample.promptIds` is turn 1's prompt, rendered by the producer.
 */
export async function driveConversation(
  sample: Sample,
  base: TurnRequestBase,
  opts: ConversationOptions,
  deps: ConversationDeps,
): Promise<ConversationOutcome> {
  const run = await openConversation(sample, base, opts, deps);
  if (!(run instanceof ConversationRun)) return run;
  for (let k = 1; k <= run.total; k += 1) {
    const hist = run.historyOf(k);
    const prompt = await run.prompt(k, hist);
    if (!prompt.ok) return prompt.outcome;
    const output = await run.output(k, prompt.value);
    if (!output.ok) return output.outcome;
    const answer = await run.answer(k, output.value);
    if (!answer.ok) return answer.outcome;
    run.advance(prompt.value, hist, output.value, answer.value);
  }
  return run.finish({ kind: 'complete', turnsDone: run.total });
}

/**
 * The conversation's turns and what is committed of them, or its outcome when there is nothing
 * to run: a payload that does not parse (ended), or every turn committed (complete).
 */
async function openConversation(
  sample: Sample,
  base: TurnRequestBase,
  opts: ConversationOptions,
  deps: ConversationDeps,
): Promise<ConversationRun | ConversationOutcome> {
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
  const run = new ConversationRun(sample, base, opts, deps, tok, messages, turns, tools, done, history);
  // Every turn committed already (its end not recorded: a crash right after the last commit, or a
  // Redis rebuilt from the files, which restores commits but not histories): it is complete.
  if (done.every((d) => d)) return run.finish({ kind: 'complete', turnsDone: run.total });
  return run;
}
