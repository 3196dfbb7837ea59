/**
 * Token ids of turn k's prompt in a conversation regenerated turn by turn (docs/design.md,
 * Multi-turn regeneration): the chat template's rendering of the history with the answers
 * regenerated so far.
 *
 * Where the template renders the history as an exact continuation (turn k's rendering starts with
 * turn k − 1's prompt, then the model's answer as it was decoded, then what the template puts
 * after an answer), turn k's prompt is turn k − 1's prompt ids + the server's own output ids +
 * the ids of the rest: the answer is never re-encoded from its text, so there is no tokenization
 * drift. Where it does not (a template that drops or rewrites earlier answers, e.g. Qwen3
 * stripping earlier reasoning, or one that trims them), the whole history is rendered from the
 * decoded text and encoded, as `apply_chat_template` on the regenerated conversation does.
 */
import type { ChatTokenizer } from './chat.js';
import type { ChatMessage } from './messages.js';

/** One regenerated answer: what the server returned, and the message the history carries for it. */
export interface RegeneratedAnswer {
  outputIds: readonly number[];
  message: ChatMessage;
}

/** Turn k's prompt, and whether it was spliced from the previous turn's ids. */
export interface TurnPrompt {
  ids: number[];
  /** True when the ids are turn k − 1's prompt + its output ids + the rest (an exact continuation). */
  spliced: boolean;
  /** The template's rendering of turn k's history: the next turn's `previous.text`. */
  text: string;
}

/**
 * The message the history carries for a regenerated answer: its text decoded without special
 * tokens (the end-of-turn token is the template's to write), and a leading
 * `<think>…</think>` passed as `reasoning_content`, the way reasoning templates expect it.
 */
export function answerMessage(tok: ChatTokenizer, outputIds: readonly number[]): ChatMessage {
  const text = tok.decode(withoutEndOfTurn(tok, outputIds), { skipSpecialTokens: true });
  // Only a block the answer opens with is reasoning; `</think>` later in the text is its content.
  const close = /^\s*<think>/.test(text) ? text.indexOf('</think>') : -1;
  if (close < 0) return { role: 'assistant', content: text };
  const reasoning = text
    .slice(0, close)
    .replace(/^\s*<think>/, '')
    .replace(/^\n+|\n+$/g, '');
  return {
    role: 'assistant',
    content: text.slice(close + '</think>'.length).replace(/^\n+/, ''),
    reasoning_content: reasoning,
  };
}

/**
 * A generated answer's text with its special tokens written out (a tool-call section's markers
 * among them), the end-of-turn token it closed with left out, and a leading `<think>…</think>`
 * block dropped: what a tool-call parser reads.
 */
export function answerTextWithSpecials(tok: ChatTokenizer, outputIds: readonly number[]): string {
  const text = tok.decode(withoutEndOfTurn(tok, outputIds), { skipSpecialTokens: false });
  const close = /^\s*<think>/.test(text) ? text.indexOf('</think>') : -1;
  return close < 0 ? text : text.slice(close + '</think>'.length).replace(/^\n+/, '');
}

function withoutEndOfTurn(tok: ChatTokenizer, ids: readonly number[]): readonly number[] {
  const last = ids[ids.length - 1];
  return last !== undefined && tok.endOfTurnTokenIds.includes(last) ? ids.slice(0, -1) : ids;
}

/** What {@link renderTurnPrompt} needs besides the tokenizer. */
export interface TurnRenderInput {
  /** Turn k's history (see `turnHistory`), its last earlier answer regenerated. */
  history: readonly ChatMessage[];
  /**
   * Turn k − 1's prompt ids, history and answer; absent for turn 1. `text`, the rendering of
   * that history (the previous call's {@link TurnPrompt.text}), saves rendering it again.
   */
  previous?: {
    promptIds: readonly number[];
    history: readonly ChatMessage[];
    answer: RegeneratedAnswer;
    text?: string;
  };
  templateKwargs?: Record<string, unknown>;
  /** The record's tool schemas, rendered into every turn's prompt as into the first. */
  tools?: readonly unknown[];
  /** The moment the template's `strftime_now` renders (default: the clock's); see `ApplyChatTemplateOptions.now`. */
  now?: Date;
}

/**
 * Turn k's prompt ids: spliced where the template continues exactly (see the module comment),
 * else rendered from the decoded history. Throws what the template throws (a `PayloadError`).
 */
export function renderTurnPrompt(tok: ChatTokenizer, input: TurnRenderInput): TurnPrompt {
  const opts = {
    ...(input.templateKwargs === undefined ? {} : { templateKwargs: input.templateKwargs }),
    ...(input.now === undefined ? {} : { now: input.now }),
    ...(input.tools === undefined ? {} : { tools: [...input.tools] }),
  };
  const text = tok.applyChatTemplate(input.history, { ...opts, addGenerationPrompt: true });
  const prev = input.previous;
  if (prev !== undefined) {
    const spliced = splice(tok, text, prev, opts);
    if (spliced !== undefined) return { ids: spliced, spliced: true, text };
  }
  return { ids: tok.encode(text), spliced: false, text };
}

function splice(
  tok: ChatTokenizer,
  text: string,
  prev: NonNullable<TurnRenderInput['previous']>,
  opts: { templateKwargs?: Record<string, unknown>; now?: Date; tools?: unknown[] },
): number[] | undefined {
  const output = prev.answer.outputIds;
  const prevText = prev.text ?? tok.applyChatTemplate(prev.history, { ...opts, addGenerationPrompt: true });
  const answerText = tok.decode(withoutEndOfTurn(tok, output), { skipSpecialTokens: false });
  const head = prevText + answerText;
  if (!text.startsWith(head)) return undefined;
  const rest = tok.encode(text.slice(head.length));
  const last = output[output.length - 1];
  const endsTurn = last !== undefined && tok.endOfTurnTokenIds.includes(last);
  if (endsTurn) {
    // The answer closed its turn itself: the template must close it with that same token.
    if (rest[0] !== last) return undefined;
    rest.shift();
  } else if (rest.length === 0 || !tok.isSpecialTokenId(rest[0] as number)) {
    // A cut-off answer is closed by the template; the close must be a special token, so that
    // encoding the text after the answer on its own gives the ids encoding it all would.
    return undefined;
  }
  return [...prev.promptIds, ...output, ...rest];
}
