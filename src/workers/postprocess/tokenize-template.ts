/**
 * What a chat template writes around an assistant turn, found by rendering small probe
 * conversations with the template itself (never hard-coded per model family):
 *
 * ```
 * P0 = render([user U],                               add_generation_prompt=false)
 * P1 = render([user U],                               add_generation_prompt=true)
 * F1 = render([user U, assistant A],                  add_generation_prompt=false)
 * F2 = render([user U, assistant A, user U2, assistant A2], add_generation_prompt=false)
 * ```
 *
 * - generation prompt `G` = `P1` after `P0`;
 * - last turn: `F1` after `P0` is `before + A + after`;
 * - earlier turn: `F2` after `P0`, up to `A`, is `beforeEarlier`;
 * - **assistant header** = the longest common prefix of `G`, `before` and `beforeEarlier`
 *   (Qwen3: `<|im_start|>assistant\n`; DeepSeek-V3: `<｜Assistant｜>`);
 * - **ignorable prefixes** = what `before` / `beforeEarlier` hold past the header: text the
 *   template inserts into an assistant turn that has no reasoning (Qwen3: the empty
 *   `<think>\n\n</think>\n\n` block it writes into the last turn); none for DeepSeek-V3;
 * - **turn end** = `after`: it must start with one of the tokenizer's end-of-turn tokens
 *   (Qwen3: `<|im_end|>` then `\n`; DeepSeek-V3: `<｜end▁of▁sentence｜>` alone);
 * - **suffix ids** = the ids that follow that end-of-turn token in `encode(F1)` (Qwen3: the id
 *   of `\n`; DeepSeek-V3: none): what a finished generation needs appended so that its ids
 *   equal the rendering of the finished conversation.
 *
 * The same probing is implemented independently in Python (test/python/tokenize_parity.py)
 * and the parity test requires both to agree.
 */
import { EnvironmentError, errorMessage, type ChatMessage, type ChatTokenizer } from '../../shared/index.js';

/** The strings and ids a chat template writes around an assistant turn. */
export interface AssistantTurnFormat {
  /** Text that opens an assistant turn, e.g. `<|im_start|>assistant\n`. */
  readonly header: string;
  /**
   * Strings the template writes right after the header when the turn has no reasoning (e.g.
   * `<think>\n\n</think>\n\n`), longest first; not the model's output, so never supervised.
   */
  readonly ignorablePrefixes: readonly string[];
  /** Text that closes an assistant turn: the end-of-turn token and what follows it, e.g. `<|im_end|>\n`. */
  readonly turnEnd: string;
  /** The end-of-turn token that closes an assistant turn (151645 `<|im_end|>` for Qwen3). */
  readonly endOfTurnTokenId: number;
  /** The text of that token. */
  readonly endOfTurnText: string;
  /** Ids the template writes after the end-of-turn token (Qwen3: `[198]`, i.e. `\n`). */
  readonly suffixIds: readonly number[];
}

const PROBE_USER = 'tokenmill probe question';
const PROBE_USER_2 = 'tokenmill probe follow-up';
const PROBE_ANSWER = 'tokenmill probe answer';
const PROBE_ANSWER_2 = 'tokenmill probe second answer';

/** Options that change how conversations render, hence the derived format. */
export interface TurnFormatOptions {
  tools?: unknown[];
  templateKwargs?: Record<string, unknown>;
}

function commonPrefix(a: string, b: string): string {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return a.slice(0, i);
}

function once(haystack: string, needle: string, what: string, name: string): number {
  const at = haystack.indexOf(needle);
  if (at < 0 || haystack.indexOf(needle, at + 1) >= 0) {
    throw new EnvironmentError(
      `chat template of ${name}: the probe text "${needle}" appears ${at < 0 ? 'nowhere' : 'more than once'} in ${what}; ` +
        'cannot tell where an assistant turn starts and ends',
    );
  }
  return at;
}

function tail(text: string, prefix: string, what: string, name: string): string {
  if (!text.startsWith(prefix)) {
    throw new EnvironmentError(
      `chat template of ${name}: ${what} does not start with the rendering of the conversation before it; ` +
        'templates that rewrite earlier turns when a turn is added are not supported',
    );
  }
  return text.slice(prefix.length);
}

/**
 * Derives the {@link AssistantTurnFormat} of `tokenizer`'s chat template by rendering probe
 * conversations (see the module comment). Throws an {@link EnvironmentError} when the template
 * does not render an assistant turn as header + content + end-of-turn token.
 */
export function deriveAssistantTurnFormat(tokenizer: ChatTokenizer, opts: TurnFormatOptions = {}): AssistantTurnFormat {
  const name = tokenizer.name;
  const render = (messages: ChatMessage[], addGenerationPrompt: boolean): string => {
    try {
      return tokenizer.applyChatTemplate(messages, {
        addGenerationPrompt,
        tools: opts.tools,
        templateKwargs: opts.templateKwargs,
      });
    } catch (e: unknown) {
      throw new EnvironmentError(`chat template of ${name} cannot render a probe conversation: ${errorMessage(e)}`, {
        cause: e,
      });
    }
  };
  const user: ChatMessage = { role: 'user', content: PROBE_USER };
  const answer: ChatMessage = { role: 'assistant', content: PROBE_ANSWER };
  const p0 = render([user], false);
  const p1 = render([user], true);
  const f1 = render([user, answer], false);
  const f2 = render(
    [user, answer, { role: 'user', content: PROBE_USER_2 }, { role: 'assistant', content: PROBE_ANSWER_2 }],
    false,
  );

  const generationPrompt = tail(p1, p0, 'the generation prompt', name);
  const lastTurn = tail(f1, p0, 'a conversation ending with an assistant turn', name);
  const at = once(lastTurn, PROBE_ANSWER, 'the last assistant turn', name);
  const before = lastTurn.slice(0, at);
  const after = lastTurn.slice(at + PROBE_ANSWER.length);
  const earlierTurns = tail(f2, p0, 'a conversation of two exchanges', name);
  const beforeEarlier = earlierTurns.slice(0, once(earlierTurns, PROBE_ANSWER, 'a two-exchange conversation', name));

  const header = commonPrefix(commonPrefix(generationPrompt, before), beforeEarlier);
  if (header === '') {
    throw new EnvironmentError(
      `chat template of ${name}: found no assistant header (the generation prompt is empty or differs from the turns it renders)`,
    );
  }
  const ignorable = new Set([before.slice(header.length), beforeEarlier.slice(header.length)]);
  ignorable.delete('');
  const ignorablePrefixes = [...ignorable].sort((a, b) => b.length - a.length);

  let endOfTurnTokenId: number | undefined;
  let endOfTurnText = '';
  for (const id of tokenizer.endOfTurnTokenIds) {
    const text = tokenizer.idToToken(id);
    if (text !== undefined && after.startsWith(text) && text.length > endOfTurnText.length) {
      endOfTurnTokenId = id;
      endOfTurnText = text;
    }
  }
  if (endOfTurnTokenId === undefined) {
    throw new EnvironmentError(
      `chat template of ${name}: an assistant turn ends with ${JSON.stringify(after)}, which does not start with an end-of-turn token ` +
        `(${tokenizer.endOfTurnTokenIds.map((id) => tokenizer.idToToken(id) ?? String(id)).join(', ')})`,
    );
  }

  const ids = tokenizer.encode(f1);
  const last = ids.lastIndexOf(endOfTurnTokenId);
  const suffixIds = last < 0 ? [] : ids.slice(last + 1);
  const suffixText = after.slice(endOfTurnText.length);
  if (last < 0 || tokenizer.decode(suffixIds) !== suffixText) {
    throw new EnvironmentError(
      `chat template of ${name}: the ids after the last end-of-turn token do not decode to ${JSON.stringify(suffixText)}, ` +
        'the text the template writes after it',
    );
  }
  return { header, ignorablePrefixes, turnEnd: after, endOfTurnTokenId, endOfTurnText, suffixIds };
}
