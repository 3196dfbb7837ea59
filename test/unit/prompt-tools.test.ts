import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

import type { PromptSource } from '../../src/shared/config/source.js';
import { useTempDir } from '../helpers/temp.js';
import { convertRow, layoutOf } from '../../src/producers/prepare/source-formats.js';
import {
  contentSampleId,
  parsePromptLine,
  readPromptFile,
  recordTools,
  type PromptLine,
  type PromptRecord,
} from '../../src/shared/index.js';

const weatherFn = {
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const weather = { type: 'function', function: weatherFn };
const user = { role: 'user', content: 'Weather in Paris?' };

function record(line: PromptLine): PromptRecord {
  if (!line.ok) throw new Error(`expected a record, got ${JSON.stringify(line.reject)}`);
  return line.record;
}

function rejected(line: PromptLine): { file: string; line: number; reason: string } {
  if (line.ok) throw new Error(`expected a reject, got ${JSON.stringify(line.record)}`);
  return line.reject;
}

const parse = (value: unknown, turns: 'last' | 'all' = 'last'): PromptLine =>
  parsePromptLine(JSON.stringify(value), 'p.jsonl', 3, { turns });

describe('tool schemas of a prompt record', () => {
  it('reads an OpenAI tools list as it is', () => {
    expect(record(parse({ id: 'a', messages: [user], tools: [weather] })).tools).toEqual([weather]);
  });

  it('reads tools given as a JSON string (glaive, xLAM), wrapping bare function schemas', () => {
    expect(record(parse({ id: 'a', messages: [user], tools: JSON.stringify([weather]) })).tools).toEqual([weather]);
    expect(record(parse({ id: 'a', messages: [user], tools: JSON.stringify([weatherFn]) })).tools).toEqual([weather]);
  });

  it('reads functions (a list or a JSON string of bare schemas) as wrapped tools', () => {
    expect(record(parse({ id: 'a', messages: [user], functions: [weatherFn] })).tools).toEqual([weather]);
    expect(record(parse({ id: 'a', messages: [user], functions: JSON.stringify([weatherFn]) })).tools).toEqual([
      weather,
    ]);
    // `tools` wins over `functions`.
    const other = { name: 'other', parameters: {} };
    expect(record(parse({ id: 'a', messages: [user], tools: [weather], functions: [other] })).tools).toEqual([weather]);
  });

  it('takes an empty list, a blank string or null as no tools', () => {
    for (const tools of [[], '', ' ', '[]', null]) {
      const r = record(parse({ messages: [user], tools }));
      expect(r).not.toHaveProperty('tools');
      expect(r.id).toBe(contentSampleId([{ role: 'user', content: user.content }]));
    }
  });

  it('rejects tools that are no list of schemas, with the file, the line and the reason', () => {
    const cases: [unknown, string][] = [
      [5, '"tools" is a number: expected a list of tool schemas, or a JSON string of one'],
      [{ a: 1 }, '"tools" is an object: expected a list of tool schemas, or a JSON string of one'],
      ['[{"name": "f",', '"tools" is a string that is not JSON: '],
      ['{"name": "f"}', '"tools" is a JSON string of an object: expected a list of tool schemas'],
      [[weather, 'f'], 'tools[1] is a string: expected a tool (function) schema object'],
      [JSON.stringify([null]), 'tools[0] is null: expected a tool (function) schema object'],
    ];
    for (const [tools, reason] of cases) {
      const r = rejected(parse({ id: 'a', messages: [user], tools }));
      expect(r).toMatchObject({ file: 'p.jsonl', line: 3 });
      expect(r.reason.startsWith(reason), `${JSON.stringify(tools)}: ${r.reason}`).toBe(true);
    }
    expect(rejected(parse({ id: 'a', messages: [user], functions: 'nope' })).reason).toMatch(
      /^"functions" is a string that is not JSON/,
    );
    // Whole conversations too.
    expect(rejected(parse({ id: 'a', messages: [user], tools: 7 }, 'all')).reason).toMatch(/^"tools" is a number/);
  });

  it('writes the rejects of a prompt file with their line', async () => {
    const file = path.join(useTempDir('prompt-tools-'), 'p.jsonl');
    writeFileSync(
      file,
      [
        JSON.stringify({ id: 'a', messages: [user], tools: [weather] }),
        JSON.stringify({ id: 'b', messages: [user], tools: 'not json' }),
        JSON.stringify({ id: 'c', messages: [user], tools: true }),
      ].join('\n') + '\n',
    );
    const lines: PromptLine[] = [];
    for await (const l of readPromptFile(file)) lines.push(l);
    expect(lines.map((l) => (l.ok ? `ok ${l.record.id}` : `${l.reject.file}:${l.reject.line}`))).toEqual([
      'ok a',
      `${file}:2`,
      `${file}:3`,
    ]);
    expect(rejected(lines[2] as PromptLine).reason).toBe(
      '"tools" is a boolean: expected a list of tool schemas, or a JSON string of one',
    );
  });

  it('keeps the content id of a record without tools, and hashes the tools of one with them', () => {
    const messages = [{ role: 'user' as const, content: user.content }];
    const old = `h:${createHash('sha256').update(JSON.stringify(messages)).digest('hex').slice(0, 16)}`;
    expect(record(parse({ messages: [user] })).id).toBe(old);
    const withTools = record(parse({ messages: [user], tools: [weather] })).id;
    expect(withTools).toMatch(/^h:[0-9a-f]{16}$/);
    expect(withTools).not.toBe(old);
    expect(withTools).toBe(contentSampleId(messages, [weather]));
    expect(record(parse({ messages: [user], functions: [{ ...weatherFn, name: 'other' }] })).id).not.toBe(withTools);
    // The same tools given as a JSON string are the same record.
    expect(record(parse({ messages: [user], tools: JSON.stringify([weather]) })).id).toBe(withTools);
  });

  it('reads ShareGPT function_call and observation turns as a call and its result', () => {
    const r = record(
      parse(
        {
          id: 'g',
          conversations: [
            { from: 'human', value: 'Weather in Paris?' },
            { from: 'function_call', value: '{"name": "get_weather", "arguments": {"city": "Paris"}}' },
            { from: 'observation', value: '{"temp": 21}' },
            { from: 'gpt', value: 'It is 21 degrees.' },
            { from: 'human', value: 'And in Rome?' },
          ],
          tools: JSON.stringify([weather]),
        },
        'all',
      ),
    );
    expect(r.messages).toEqual([
      { role: 'user', content: 'Weather in Paris?' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [
          { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } },
        ],
      },
      { role: 'tool', content: '{"temp": 21}', tool_call_id: 'call_1' },
      { role: 'assistant', content: 'It is 21 degrees.' },
      { role: 'user', content: 'And in Rome?' },
    ]);
    expect(r.tools).toEqual([weather]);
  });

  it('reads parallel calls of one function_call turn, each answered by an observation in order', () => {
    const r = record(
      parse({
        conversations: [
          { from: 'human', value: 'Paris and Rome?' },
          {
            from: 'function_call',
            value: JSON.stringify([
              { name: 'get_weather', arguments: { city: 'Paris' } },
              { id: 'own', name: 'get_weather', arguments: '{"city": "Rome"}' },
            ]),
          },
          { from: 'observation', value: '21' },
          { from: 'observation', value: '25' },
          { from: 'human', value: 'Thanks. Which is warmer?' },
        ],
      }),
    );
    expect(r.messages[1]?.tool_calls).toEqual([
      { id: 'call_1_0', type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } },
      { id: 'own', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Rome"}' } },
    ]);
    expect(r.messages.slice(2, 4)).toEqual([
      { role: 'tool', content: '21', tool_call_id: 'call_1_0' },
      { role: 'tool', content: '25', tool_call_id: 'own' },
    ]);
  });

  it('rejects a function_call turn whose value is not a call', () => {
    const line = (value: string): PromptLine =>
      parse({
        conversations: [
          { from: 'human', value: 'q' },
          { from: 'function_call', value },
          { from: 'observation', value: 'r' },
          { from: 'human', value: 'q2' },
        ],
      });
    expect(rejected(line('get_weather(Paris)')).reason).toMatch(
      /^conversations\[1\] is a function_call turn whose value is not JSON/,
    );
    expect(rejected(line('{"arguments": {}}')).reason).toBe(
      'conversations[1] is a function_call turn whose value is not {"name", "arguments"}',
    );
    expect(rejected(line('[]')).reason).toBe('conversations[1] is a function_call turn with no call');
  });

  it('leaves Hermes tool schemas in a system prompt as its text', () => {
    const system = `You are a function calling AI model. <tools>${JSON.stringify(weather)}</tools>`;
    const r = record(parse({ id: 'h', messages: [{ role: 'system', content: system }, user] }));
    expect(r).not.toHaveProperty('tools');
    expect(r.messages[0]).toEqual({ role: 'system', content: system });
  });
});

describe('tool schemas of a source row (prepare)', () => {
  const src = (extra: Partial<PromptSource> = {}): PromptSource => ({ path: 'x', format: 'auto', ...extra });

  it("reads a row's tools or functions column, and the ShareGPT tool turns", () => {
    const r = convertRow(
      {
        conversations: [
          { from: 'human', value: 'Weather in Paris?' },
          { from: 'function_call', value: '{"name": "get_weather", "arguments": {"city": "Paris"}}' },
          { from: 'observation', value: '21' },
          { from: 'gpt', value: 'Warm.' },
        ],
        tools: JSON.stringify([weather]),
      },
      layoutOf('sharegpt', src()),
    );
    expect(r).toEqual({
      ok: true,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [
            { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } },
          ],
        },
        { role: 'tool', content: '21', tool_call_id: 'call_1' },
        { role: 'assistant', content: 'Warm.' },
      ],
      tools: [weather],
    });
    expect(convertRow({ messages: [user], functions: [weatherFn] }, layoutOf('openai', src()))).toMatchObject({
      ok: true,
      tools: [weather],
    });
  });

  it('counts a row whose tools cannot be read as malformed, with the reason', () => {
    expect(convertRow({ messages: [user], tools: '{oops' }, layoutOf('openai', src()))).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/^"tools" is a string that is not JSON/) as unknown,
    });
    expect(
      convertRow(
        {
          conversations: [
            { from: 'human', value: 'q' },
            { from: 'function_call', value: 'call f' },
          ],
        },
        layoutOf('sharegpt', src()),
      ),
    ).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/^conversations\[1\] is a function_call turn/) as unknown,
    });
  });

  it('recordTools: none for a row without tools', () => {
    expect(recordTools({})).toEqual({ ok: true, tools: undefined });
  });
});
