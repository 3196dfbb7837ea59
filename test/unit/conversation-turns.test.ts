// conversationTurns: where each turn of a conversation regenerated turn by turn starts, and the
// reason (naming the message by its index) a conversation cannot be regenerated that way.
import { describe, expect, it } from 'vitest';

import { conversationTurns, turnHistory } from '../../src/shared/prompts/conversation.js';
import type { ChatMessage } from '../../src/shared/tokenizer/index.js';

const sys = (content = 'Be brief.'): ChatMessage => ({ role: 'system', content });
const u = (content = 'question'): ChatMessage => ({ role: 'user', content });
const a = (content = 'answer'): ChatMessage => ({ role: 'assistant', content });
const t = (content = '{"ok": true}'): ChatMessage => ({ role: 'tool', content, tool_call_id: 'call_0' });
const call: ChatMessage = {
  role: 'assistant',
  content: '',
  tool_calls: [{ type: 'function', function: { name: 'search', arguments: '{"q": "x"}' } }],
};

describe('conversationTurns', () => {
  it('starts a turn at each assistant message after a user message', () => {
    expect(conversationTurns([u(), a(), u(), a(), u(), a()])).toEqual({ starts: [1, 3, 5] });
    expect(conversationTurns([sys(), u(), a(), u(), a()])).toEqual({ starts: [2, 4] });
    expect(conversationTurns([sys(), u(), a()])).toEqual({ starts: [2] });
  });

  it('starts a turn after tool results, and none at an assistant message that continues another', () => {
    // user, call, tool, tool, answer, user, answer
    expect(conversationTurns([u(), call, t(), t(), a(), u(), a()])).toEqual({ starts: [1, 4, 6] });
    // An assistant message right after another is a continuation of the same turn.
    expect(conversationTurns([u(), a('part 1'), a('part 2'), u(), a()])).toEqual({ starts: [1, 4] });
    // A system message in the middle does not break the user → assistant sequence.
    expect(conversationTurns([u(), sys('mid'), a(), u(), a()])).toEqual({ starts: [2, 4] });
  });

  it('ends an open conversation with a turn at messages.length', () => {
    expect(conversationTurns([u()])).toEqual({ starts: [1] });
    expect(conversationTurns([sys(), u(), a(), u()])).toEqual({ starts: [2, 4] });
    // Ending with tool results: the answer to them is the last turn.
    expect(conversationTurns([u(), call, t()])).toEqual({ starts: [1, 3] });
  });

  it('names the message of each conversation it rejects', () => {
    expect(conversationTurns([])).toBe('the conversation has no user turn');
    expect(conversationTurns([sys(), a()])).toBe('the conversation has no user turn');
    expect(conversationTurns([sys(), t()])).toBe('the conversation has no user turn');
    expect(conversationTurns([u(), t(), a()])).toBe('messages[1] is a tool turn with no assistant turn before it');
    expect(conversationTurns([sys(), u(), a(), u(), t()])).toBe(
      'messages[4] is a tool turn with no assistant turn before it',
    );
    expect(conversationTurns([sys(), u(), u(), a()])).toBe('messages[1] and messages[2] are two user turns in a row');
    expect(conversationTurns([u(), a(), u(), a(), u('one'), u('two')])).toBe(
      'messages[4] and messages[5] are two user turns in a row',
    );
    expect(conversationTurns([u(), a(), u(' \n\t'), a(), u(), a()])).toBe('messages[2] is an empty user turn');
    expect(conversationTurns([u(), a(), u(''), a()])).toBe('messages[2] is an empty user turn');
    expect(conversationTurns([sys(), a(), u(), a()])).toBe('messages[1] is an assistant turn before any user turn');
    expect(conversationTurns([a(), u(), a()])).toBe('messages[0] is an assistant turn before any user turn');
  });

  it('names the message under the field the record read it from', () => {
    expect(conversationTurns([u(), u()], 'conversations')).toBe(
      'conversations[0] and conversations[1] are two user turns in a row',
    );
  });

  it('accepts a 300-turn conversation with 300 starts', () => {
    const messages: ChatMessage[] = [sys()];
    for (let i = 0; i < 300; i++) messages.push(u(`question ${i}`), a(`answer ${i}`));
    const turns = conversationTurns(messages);
    if (typeof turns === 'string') throw new Error(turns);
    expect(turns.starts).toHaveLength(300);
    expect(turns.starts).toEqual(Array.from({ length: 300 }, (_, i) => 2 + 2 * i));
    // The last turn's history carries the 299 regenerated answers, none of the source's.
    const regenerated = Array.from({ length: 299 }, (_, i) => a(`regenerated ${i}`));
    const history = turnHistory(messages, turns, 300, regenerated);
    expect(history).toHaveLength(1 + 299 * 2 + 1);
    expect(history.filter((m) => m.role === 'assistant')).toEqual(regenerated);
    expect(history.at(-1)).toEqual(u('question 299'));
  });
});

describe('turnHistory', () => {
  const messages = [sys(), u('q1'), call, t('r1'), a('source 2'), a('source 2, continued'), u('q2'), a('source 3')];
  const turns = conversationTurns(messages);

  it('replaces each earlier turn with its regenerated answer and drops continuations', () => {
    if (typeof turns === 'string') throw new Error(turns);
    expect(turns.starts).toEqual([2, 4, 7]);
    const r1 = a('regenerated 1');
    const r2 = a('regenerated 2');
    expect(turnHistory(messages, turns, 1, [])).toEqual([sys(), u('q1')]);
    expect(turnHistory(messages, turns, 2, [r1])).toEqual([sys(), u('q1'), r1, t('r1')]);
    expect(turnHistory(messages, turns, 3, [r1, r2])).toEqual([sys(), u('q1'), r1, t('r1'), r2, u('q2')]);
  });

  it('throws for a turn out of range or without the regenerated answers before it', () => {
    if (typeof turns === 'string') throw new Error(turns);
    expect(() => turnHistory(messages, turns, 4, [])).toThrow(RangeError);
    expect(() => turnHistory(messages, turns, 3, [a()])).toThrow('turn 2 has no regenerated answer');
  });
});

describe('answerMessage', () => {
  it('moves only a leading <think> block into reasoning_content; a </think> later in the answer is content', async () => {
    const { answerMessage, bundledTokenizerPath, loadTokenizer } = await import('../../src/shared/index.js');
    const tok = await loadTokenizer(bundledTokenizerPath());
    const eot = tok.endOfTurnTokenIds[0] as number;
    expect(answerMessage(tok, [...tok.encode('<think>\nweigh it\n</think>\n\nParis.'), eot])).toEqual({
      role: 'assistant',
      content: 'Paris.',
      reasoning_content: 'weigh it',
    });
    expect(answerMessage(tok, tok.encode('Use <think> and </think> to wrap reasoning.'))).toEqual({
      role: 'assistant',
      content: 'Use <think> and </think> to wrap reasoning.',
    });
  });
});
