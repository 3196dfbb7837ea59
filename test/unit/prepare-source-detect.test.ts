import { describe, expect, it } from 'vitest';

import type { PromptSource } from '../../src/shared/config/source.js';
import { resolveLayout, type ResolvedLayout, type SampleRow } from '../../src/producers/prepare/source-detect.js';

const src = (extra: Partial<PromptSource> = {}): PromptSource => ({ path: 'x', format: 'auto', ...extra });
const samples = (...rows: Record<string, unknown>[]): SampleRow[] =>
  rows.map((value, row) => ({ value, where: { file: 'd.jsonl', row, line: row + 1 } }));
const detect = (rows: SampleRow[], extra: Partial<PromptSource> = {}): ResolvedLayout =>
  resolveLayout(src(extra), rows, 'source d.jsonl');
const formatOf = (rows: SampleRow[], extra: Partial<PromptSource> = {}): [string, string | undefined] => {
  const r = detect(rows, extra);
  return [r.layout.format, r.detectedFrom];
};

describe('format detection', () => {
  it('openai from a list of {role, content}, in messages or conversations', () => {
    expect(formatOf(samples({ prompt: 'p', prompt_id: 'x', messages: [{ role: 'user', content: 'hi' }] }))).toEqual([
      'openai',
      'column messages[].role/content in the first row',
    ]);
    const r = detect(samples({ id: 1, conversations: [{ role: 'user', content: 'hi' }] }));
    expect(r.layout).toMatchObject({ format: 'openai', messages: 'conversations', role: 'role', content: 'content' });
  });

  it('sharegpt from a list of {from, value}', () => {
    const r = detect(samples({ conversations: [{ from: 'human', value: 'hi' }] }));
    expect(r.layout).toMatchObject({ format: 'sharegpt', messages: 'conversations', role: 'from', content: 'value' });
    expect(r.detectedFrom).toBe('column conversations[].from/value in the first row');
  });

  it('looks past rows whose list of turns is empty', () => {
    expect(formatOf(samples({ messages: [] }, { messages: [{ role: 'user', content: 'x' }] }))).toEqual([
      'openai',
      'column messages[].role/content in line 2 of d.jsonl',
    ]);
  });

  it('uses fields to find turns of another shape', () => {
    const r = detect(samples({ trajectory: [{ role: 'user', text: 'x' }] }), {
      fields: { messages: 'trajectory', content: 'text' },
    });
    expect(r.layout).toMatchObject({ format: 'openai', messages: 'trajectory', role: 'role', content: 'text' });
    expect(r.detectedFrom).toBe('column trajectory[].role/text in the first row');
  });

  it('alpaca from an instruction column, before any prompt-like column', () => {
    expect(formatOf(samples({ instruction: 'i', input: '', output: 'o', text: 't' }))).toEqual([
      'alpaca',
      'column instruction with input/output in the first row',
    ]);
    expect(formatOf(samples({ instruction: 'i', response: 'r' }))).toEqual([
      'alpaca',
      'column instruction with response in the first row',
    ]);
  });

  it('prompt from one well-known text column, or from field / fields.prompt', () => {
    expect(formatOf(samples({ problem: 'p', generated_solution: 's', expected_answer: '1' }))).toEqual([
      'prompt',
      'text column problem in the first row',
    ]);
    expect(detect(samples({ question: 'q', answer: 'a' })).layout.prompt).toBe('question');
    expect(formatOf(samples({ prompt: 'p', story: 's' }))).toEqual(['prompt', 'text column prompt in the first row']);
    expect(formatOf(samples({ question: null, n: 1 }, { question: 'q', n: 2 }))).toEqual([
      'prompt',
      'text column question in line 2 of d.jsonl',
    ]);
    expect(formatOf(samples({ body: 'b' }), { field: 'body' })).toEqual(['prompt', 'field is set']);
    expect(detect(samples({ body: 'b' }), { fields: { prompt: 'body' } }).layout.prompt).toBe('body');
  });

  it('refuses several candidate text columns, naming them and what to set', () => {
    expect(() => detect(samples({ prompt: 'p', text: 't', id: 3 }))).toThrow(
      'source d.jsonl: cannot detect the format: several text columns could be the prompt (prompt, text); set field to the one to use (columns seen in line 1 of d.jsonl: prompt (a string), text (a string), id (a number))',
    );
  });

  it('refuses columns it does not know, listing them with their types', () => {
    expect(() => detect(samples({ body: 'b', n: 1, tags: ['a'] }))).toThrow(
      /cannot detect the format \(columns seen in line 1 of d\.jsonl: body \(a string\), n \(a number\), tags \(a list\)\); set format: prompt with field: <text column>/,
    );
  });

  it('refuses turns whose keys it does not know', () => {
    expect(() => detect(samples({ messages: [{ speaker: 'user', text: 'x' }] }))).toThrow(
      'source d.jsonl: cannot detect the format: the turns of column messages in line 1 of d.jsonl have keys speaker, text, neither role/content (openai) nor from/value (sharegpt); set fields.role and fields.content to the keys of the role and the text',
    );
    expect(() => detect(samples({ messages: [] }, { messages: [] }))).toThrow(
      /column messages holds no turn objects in the first 2 rows/,
    );
  });

  it('refuses fields.messages naming a column that is not a list', () => {
    expect(() => detect(samples({ chat: 'USER: hi' }), { fields: { messages: 'turns' } })).toThrow(
      'source d.jsonl: fields.messages is "turns" but line 1 of d.jsonl has no list there (columns: chat (a string))',
    );
  });

  it('refuses to detect from no rows', () => {
    expect(() => detect([])).toThrow(/no readable row in the first 20; set format/);
  });
});

describe('explicit formats', () => {
  it('take their defaults; openai takes conversations when the rows have no messages, sharegpt messages when they have no conversations', () => {
    expect(detect(samples({ conversations: [] }), { format: 'openai' }).layout.messages).toBe('conversations');
    expect(detect(samples({ x: 1 }), { format: 'openai' }).layout.messages).toBe('messages');
    expect(detect([], { format: 'sharegpt' }).layout).toMatchObject({
      messages: 'conversations',
      role: 'from',
      content: 'value',
    });
    expect(detect(samples({ messages: [{ from: 'human', value: 'x' }] }), { format: 'sharegpt' }).layout.messages).toBe(
      'messages',
    );
    expect(detect([], { format: 'sharegpt', fields: { messages: 'c', role: 'r' } }).layout).toMatchObject({
      messages: 'c',
      role: 'r',
      content: 'value',
    });
    expect(detect([], { format: 'prompt', field: 'q' }).detectedFrom).toBeUndefined();
  });
});
