import { describe, expect, it } from 'vitest';

import type { PromptSource } from '../../src/shared/config/source.js';
import { convertRow, layoutOf, wantedColumns, type ConvertedRow } from '../../src/producers/prepare/source-formats.js';
import type { SourceFormat } from '../../src/producers/prepare/source-types.js';

const src = (extra: Partial<PromptSource> = {}): PromptSource => ({ path: 'x', format: 'auto', ...extra });
const convert = (format: SourceFormat, row: unknown, extra: Partial<PromptSource> = {}): ConvertedRow =>
  convertRow(row, layoutOf(format, src(extra)));

function reason(r: ConvertedRow): string {
  if (r.ok) throw new Error(`expected a malformed row, got ${JSON.stringify(r)}`);
  return r.reason;
}

describe('openai', () => {
  it('keeps the turns, their extra keys and the id; null extras are dropped, null content is ""', () => {
    const call = [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }];
    const r = convert('openai', {
      id: 7,
      messages: [
        { role: 'user', content: 'hi', name: 'bob', weight: null },
        { role: 'assistant', content: null, tool_calls: call },
        { role: 'tool', content: '42', tool_call_id: 'c1' },
      ],
    });
    expect(r).toEqual({
      ok: true,
      id: '7',
      messages: [
        { role: 'user', content: 'hi', name: 'bob' },
        { role: 'assistant', content: '', tool_calls: call },
        { role: 'tool', content: '42', tool_call_id: 'c1' },
      ],
    });
  });

  it('joins text parts with a newline, and refuses a row with an image part', () => {
    expect(
      convert('openai', { messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, 'b', { text: 'c' }] }] }),
    ).toEqual({
      ok: true,
      messages: [{ role: 'user', content: 'a\nb\nc' }],
    });
    const bad = convert('openai', {
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'a' },
            { type: 'image_url', image_url: { url: 'u' } },
          ],
        },
      ],
    });
    expect(reason(bad)).toBe('messages[0].content[1] is a "image_url" part: only text parts can be a prompt');
    expect(bad.ok === false && bad.excerpt).toContain('image_url');
  });

  it('says what is wrong with a row: missing column, not a list, bad turn, unknown role, bad content, no turns', () => {
    expect(reason(convert('openai', { id: 1, msgs: [] }))).toBe(
      'no column "messages" (the turns); the row has: id, msgs',
    );
    expect(reason(convert('openai', { messages: 'hi' }))).toBe(
      'column "messages" is a string: expected a list of turns',
    );
    expect(reason(convert('openai', { messages: ['hi'] }))).toBe(
      'messages[0] is a string: expected an object with "role" and "content"',
    );
    expect(reason(convert('openai', { messages: [{ speaker: 'user', content: 'x' }] }))).toBe(
      'messages[0] has no "role" (its keys: speaker, content); set fields.role to the key of the role',
    );
    expect(reason(convert('openai', { messages: [{ role: 'narrator', content: 'x' }] }))).toBe(
      'messages[0].role is "narrator": not a known role; map it with roles: {narrator: user|assistant|system|tool}',
    );
    expect(reason(convert('openai', { messages: [{ role: 'user', content: 3 }] }))).toBe(
      'messages[0].content is a number: expected a string or a list of text parts',
    );
    expect(reason(convert('openai', { messages: [{ role: 'user' }] }))).toBe(
      'messages[0] has no "content" (its keys: role); set fields.content to the key of the text',
    );
    expect(reason(convert('openai', { messages: [] }))).toBe('"messages" has no turns');
    expect(reason(convert('openai', ['a']))).toBe('the row is a list, not an object of columns');
    expect(reason(convert('openai', 'text'))).toBe('the row is a string, not an object of columns');
  });

  it('maps roles given in the config, and matches known roles whatever their case', () => {
    const row = {
      messages: [
        { role: 'narrator', content: 'n' },
        { role: 'USER', content: 'u' },
        { role: 'developer', content: 'd' },
      ],
    };
    expect(convert('openai', row, { roles: { narrator: 'system' } })).toEqual({
      ok: true,
      messages: [
        { role: 'system', content: 'n' },
        { role: 'user', content: 'u' },
        { role: 'system', content: 'd' },
      ],
    });
    // A configured mapping wins over a known name.
    expect(
      convert('openai', { messages: [{ role: 'user', content: 'x' }] }, { roles: { user: 'assistant' } }),
    ).toMatchObject({ messages: [{ role: 'assistant' }] });
  });
});

describe('sharegpt', () => {
  it('maps the ShareGPT and LLaMA-Factory role names', () => {
    const r = convert('sharegpt', {
      conversations: [
        { from: 'system', value: 's' },
        { from: 'human', value: 'h' },
        { from: 'function_call', value: '{"name":"f"}' },
        { from: 'observation', value: '{"r":1}' },
        { from: 'gpt', value: 'g' },
      ],
    });
    expect(r).toEqual({
      ok: true,
      messages: [
        { role: 'system', content: 's' },
        { role: 'user', content: 'h' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [{ id: 'call_2', type: 'function', function: { name: 'f', arguments: {} } }],
        },
        { role: 'tool', content: '{"r":1}', tool_call_id: 'call_2' },
        { role: 'assistant', content: 'g' },
      ],
    });
  });

  it('puts a system column before the turns, unless they start with a system turn', () => {
    const turns = [{ from: 'human', value: 'h' }];
    expect(convert('sharegpt', { system: 'be brief', conversations: turns })).toMatchObject({
      messages: [{ role: 'system', content: 'be brief' }, { role: 'user' }],
    });
    expect(convert('sharegpt', { system: '', conversations: turns })).toMatchObject({ messages: [{ role: 'user' }] });
    expect(
      convert('sharegpt', { system: 'col', conversations: [{ from: 'system', value: 'turn' }, ...turns] }),
    ).toMatchObject({
      messages: [{ role: 'system', content: 'turn' }, { role: 'user' }],
    });
  });

  it('reads other columns and keys through fields', () => {
    const extra: Partial<PromptSource> = {
      fields: { id: 'uid', messages: 'trajectory', role: 'speaker', content: 'text', system: 'sys' },
      roles: { ai: 'assistant' },
    };
    const row = {
      uid: 'u-1',
      sys: 'S',
      trajectory: [
        { speaker: 'user', text: 'fix it', mask: false },
        { speaker: 'ai', text: 'done' },
      ],
    };
    expect(convert('sharegpt', row, extra)).toEqual({
      ok: true,
      id: 'u-1',
      messages: [
        { role: 'system', content: 'S' },
        { role: 'user', content: 'fix it', mask: false },
        { role: 'assistant', content: 'done' },
      ],
    });
    expect(reason(convert('sharegpt', { trajectory: [], sys: 'S' }, extra))).toBe(
      'no id column "uid" (fields.id); the row has: trajectory, sys',
    );
    expect(reason(convert('sharegpt', { uid: null, trajectory: [] }, extra))).toBe(
      'id column "uid" is null: expected a string or a number',
    );
    expect(reason(convert('sharegpt', { uid: 'a', trajectory: [{ speaker: 'user', text: 'x' }] }, extra))).toBe(
      'no system column "sys" (fields.system); the row has: uid, trajectory',
    );
    expect(
      reason(convert('sharegpt', { uid: 'a', sys: 'S', trajectory: [{ speaker: 'system', text: 'x' }] }, extra)),
    ).toBe('the row has both a system column "sys" (fields.system) and a system turn');
  });
});

describe('alpaca', () => {
  it('joins instruction and input with a blank line; the output is the assistant turn', () => {
    expect(convert('alpaca', { instruction: 'Translate', input: 'bonjour', output: 'hello' })).toEqual({
      ok: true,
      messages: [
        { role: 'user', content: 'Translate\n\nbonjour' },
        { role: 'assistant', content: 'hello' },
      ],
    });
    expect(convert('alpaca', { instruction: 'Say hi', input: '  ', output: '' })).toEqual({
      ok: true,
      messages: [{ role: 'user', content: 'Say hi' }],
    });
    expect(convert('alpaca', { instruction: 'Say hi', response: 'hi' })).toMatchObject({
      messages: [{ role: 'user' }, { role: 'assistant', content: 'hi' }],
    });
  });

  it('reads renamed columns and refuses rows without a usable instruction', () => {
    expect(convert('alpaca', { q: 'Q', ctx: 'C' }, { fields: { instruction: 'q', input: 'ctx' } })).toMatchObject({
      messages: [{ role: 'user', content: 'Q\n\nC' }],
    });
    expect(reason(convert('alpaca', { prompt: 'x' }))).toBe(
      'no column "instruction" (the instruction); the row has: prompt',
    );
    expect(reason(convert('alpaca', { instruction: '' }))).toBe('column "instruction" is empty');
    expect(reason(convert('alpaca', { instruction: 'a', input: 3 }))).toBe(
      'column "input" is a number: expected a string',
    );
    expect(reason(convert('alpaca', { instruction: 'a', output: ['x'] }))).toBe(
      'column "output" is a list: expected a string',
    );
  });
});

describe('prompt', () => {
  it('makes one user turn of the text column named by field or fields.prompt; ids from the id column', () => {
    expect(convert('prompt', { id: 'w1', prompt: 'Write a story' })).toEqual({
      ok: true,
      id: 'w1',
      messages: [{ role: 'user', content: 'Write a story' }],
    });
    expect(convert('prompt', { problem: 'Solve x' }, { field: 'problem' })).toEqual({
      ok: true,
      messages: [{ role: 'user', content: 'Solve x' }],
    });
    expect(convert('prompt', { q: 'Why?' }, { fields: { prompt: 'q' } })).toMatchObject({
      messages: [{ content: 'Why?' }],
    });
    expect(convert('prompt', { id: 12345678901234567890n, prompt: 'p' })).toMatchObject({ id: '12345678901234567890' });
  });

  it('ignores an id column of another type unless fields.id names it', () => {
    expect(convert('prompt', { id: { a: 1 }, prompt: 'p' })).toEqual({
      ok: true,
      messages: [{ role: 'user', content: 'p' }],
    });
    expect(convert('prompt', { id: '', prompt: 'p' })).toEqual({
      ok: true,
      messages: [{ role: 'user', content: 'p' }],
    });
    expect(reason(convert('prompt', { id: '', prompt: 'p' }, { fields: { id: 'id' } }))).toBe(
      'id column "id" is an empty string: expected a string or a number',
    );
  });

  it('refuses a missing, non-text or blank prompt', () => {
    expect(reason(convert('prompt', { text: 'x' }, { field: 'question' }))).toBe(
      'no column "question" (the prompt column); the row has: text',
    );
    expect(reason(convert('prompt', { question: null }, { field: 'question' }))).toBe(
      'column "question" is null: expected a string',
    );
    expect(reason(convert('prompt', { question: ' \n' }, { field: 'question' }))).toBe('column "question" is empty');
  });
});

describe('wantedColumns', () => {
  it('names the columns each format reads; configured ones are required', () => {
    expect(wantedColumns(layoutOf('sharegpt', src()))).toEqual({
      required: ['conversations'],
      optional: ['id', 'system', 'tools', 'functions'],
    });
    expect(wantedColumns(layoutOf('alpaca', src({ fields: { id: 'uid' } })))).toEqual({
      required: ['uid', 'instruction'],
      optional: ['system', 'tools', 'functions', 'input', 'output', 'response'],
    });
    expect(wantedColumns(layoutOf('prompt', src({ field: 'problem', fields: { system: 'sys' } })))).toEqual({
      required: ['sys', 'problem'],
      optional: ['id', 'tools', 'functions'],
    });
  });
});
