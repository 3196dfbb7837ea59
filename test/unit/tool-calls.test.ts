// The tool-call library (src/shared/tools): each family's parser on the shapes a model writes
// (one call, parallel calls, content before the calls, broken JSON, an unclosed section, unicode
// arguments, no call, prose holding JSON, trailing special tokens), the source's calls, the
// matching of the source's results, and calls to undefined tools.
import { describe, expect, it } from 'vitest';

import {
  callArgumentsObject,
  detectToolCallFormat,
  matchSourceResults,
  parseToolCalls,
  sourceCalls,
  undefinedToolCall,
  type ChatMessage,
  type ParsedTurn,
  type ToolCall,
  type ToolCallFormat,
} from '../../src/shared/index.js';

/** What a case expects: the content and each call's id, name and arguments, or a reason matching. */
type Expected = { content: string; calls: { id: string; name: string; args: Record<string, unknown> }[] } | RegExp;

interface Case {
  name: string;
  text: string;
  expected: Expected;
  /** The exact `function.arguments` text of each call, for the families that keep the text. */
  rawArgs?: string[];
}

const WEATHER = { city: 'Paris' };
const TIME = { zone: 'Europe/Paris', format: '24h' };
const UNICODE = { query: '東京の天気 — «météo» 🌧️', note: 'line\nbreak "quoted"' };

const hermesCall = (name: string, args: string): string =>
  `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;

const HERMES: Case[] = [
  {
    name: 'single call',
    text: hermesCall('get_weather', '{"city": "Paris"}'),
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
    rawArgs: ['{"city": "Paris"}'],
  },
  {
    name: 'parallel calls',
    text: `${hermesCall('get_weather', '{"city": "Paris"}')}\n${hermesCall('get_time', '{"zone":"Europe/Paris",  "format": "24h"}')}`,
    expected: {
      content: '',
      calls: [
        { id: 'call_2_0', name: 'get_weather', args: WEATHER },
        { id: 'call_2_1', name: 'get_time', args: TIME },
      ],
    },
    rawArgs: ['{"city": "Paris"}', '{"zone":"Europe/Paris",  "format": "24h"}'],
  },
  {
    name: 'content before the call',
    text: `Let me check.\n\n${hermesCall('get_weather', '{"city": "Paris"}')}`,
    expected: { content: 'Let me check.', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
  {
    name: 'an end token inside an argument string',
    text: hermesCall('echo', '{"text": "a </tool_call> b"}'),
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'echo', args: { text: 'a </tool_call> b' } }] },
  },
  { name: 'malformed JSON', text: hermesCall('get_weather', '{"city": Paris}'), expected: /^call 1: not valid JSON/ },
  {
    name: 'malformed second call',
    text: `${hermesCall('a', '{}')}\n<tool_call>\n{"name": "b", "arguments": {"x": 1,}}\n</tool_call>`,
    expected: /^call 2: not valid JSON/,
  },
  {
    name: 'missing name',
    text: '<tool_call>\n{"arguments": {}}\n</tool_call>',
    expected: /^call 1: no function name$/,
  },
  {
    name: 'unclosed call',
    text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    expected: /^call 1: <tool_call> is not closed/,
  },
  {
    name: 'no closing tag',
    text: '<tool_call>\n{"name": "get_weather", "arguments": {}}',
    expected: /^call 1: <tool_call> is not closed$/,
  },
  {
    name: 'unicode arguments',
    text: hermesCall('search', JSON.stringify(UNICODE)),
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'search', args: UNICODE }] },
    rawArgs: [JSON.stringify(UNICODE)],
  },
  {
    name: 'no call',
    text: 'The weather is {"city": "Paris"}.',
    expected: { content: 'The weather is {"city": "Paris"}.', calls: [] },
  },
  {
    name: 'trailing special tokens',
    text: `${hermesCall('get_weather', '{"city": "Paris"}')}\n<|endoftext|>`,
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
  {
    name: 'text after the calls',
    text: `${hermesCall('get_weather', '{"city": "Paris"}')}\nDone.`,
    expected: /^call 1: text after it: "Done\."$/,
  },
];

const LLAMA3: Case[] = [
  {
    name: 'single call',
    text: '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
  {
    name: 'single call with "arguments" after <|python_tag|>',
    text: '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
  {
    name: 'parallel calls',
    text: '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"zone": "Europe/Paris", "format": "24h"}}',
    expected: {
      content: '',
      calls: [
        { id: 'call_2_0', name: 'get_weather', args: WEATHER },
        { id: 'call_2_1', name: 'get_time', args: TIME },
      ],
    },
  },
  {
    name: 'content before the call',
    text: 'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    expected: { content: 'Checking.', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
  {
    name: 'malformed JSON',
    text: '{"name": "get_weather", "parameters": {"city": Paris}}',
    expected: /^call 1: not valid JSON/,
  },
  {
    name: 'malformed second call',
    text: '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {]}',
    expected: /^call 2: not valid JSON/,
  },
  { name: 'missing name', text: '<|python_tag|>{"parameters": {}}', expected: /^call 1: no function name$/ },
  {
    name: 'unclosed call',
    text: '{"name": "get_weather", "parameters": {"city": "Par',
    expected: /^call 1: the text ends inside its JSON$/,
  },
  {
    name: 'built-in tool call',
    text: '<|python_tag|>brave_search.call(query="weather")',
    expected: /^call 1: not valid JSON \(not a JSON object\)$/,
  },
  {
    name: 'unicode arguments',
    text: `{"name": "search", "parameters": ${JSON.stringify(UNICODE)}}`,
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'search', args: UNICODE }] },
  },
  { name: 'no call', text: 'It is sunny in Paris.', expected: { content: 'It is sunny in Paris.', calls: [] } },
  {
    name: 'prose containing JSON is not a call',
    text: 'Call it like this: {"name": "get_weather", "parameters": {"city": "Paris"}}',
    expected: { content: 'Call it like this: {"name": "get_weather", "parameters": {"city": "Paris"}}', calls: [] },
  },
  {
    name: 'a JSON answer that is no call',
    text: '{"name": "Ada", "born": 1815}',
    expected: { content: '{"name": "Ada", "born": 1815}', calls: [] },
  },
  {
    name: 'trailing special tokens',
    text: '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
];

const dsCall = (name: string, args: string): string =>
  `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${name}\n\`\`\`json\n${args}\n\`\`\`<｜tool▁call▁end｜>`;
const dsSection = (...calls: string[]): string => `<｜tool▁calls▁begin｜>${calls.join('\n')}<｜tool▁calls▁end｜>`;

const DEEPSEEK: Case[] = [
  {
    name: 'single call',
    text: dsSection(dsCall('get_weather', '{"city": "Paris"}')),
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
    rawArgs: ['{"city": "Paris"}'],
  },
  {
    name: 'parallel calls',
    text: dsSection(
      dsCall('get_weather', '{"city": "Paris"}'),
      dsCall('get_time', '{"zone": "Europe/Paris", "format": "24h"}'),
    ),
    expected: {
      content: '',
      calls: [
        { id: 'call_2_0', name: 'get_weather', args: WEATHER },
        { id: 'call_2_1', name: 'get_time', args: TIME },
      ],
    },
  },
  {
    name: 'content before the call',
    text: `Let me check.\n${dsSection(dsCall('get_weather', '{"city": "Paris"}'))}`,
    expected: { content: 'Let me check.', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
  {
    name: 'malformed JSON',
    text: dsSection(dsCall('get_weather', '{"city": Paris}')),
    expected: /^call 1: the arguments of get_weather are not valid JSON/,
  },
  {
    name: 'missing name',
    text: dsSection(dsCall('', '{}')),
    expected: /^call 1: no function name$/,
  },
  {
    name: 'unclosed section',
    text: `<｜tool▁calls▁begin｜>${dsCall('get_weather', '{"city": "Paris"}')}`,
    expected: /^call 1: the section is not closed/,
  },
  {
    name: 'unclosed call',
    text: '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Pa',
    expected: /^call 1: <｜tool▁call▁begin｜> is not closed/,
  },
  {
    name: 'unicode arguments',
    text: dsSection(dsCall('search', JSON.stringify(UNICODE))),
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'search', args: UNICODE }] },
    rawArgs: [JSON.stringify(UNICODE)],
  },
  { name: 'no call', text: 'Sunny, 21 °C.', expected: { content: 'Sunny, 21 °C.', calls: [] } },
  {
    name: 'trailing special tokens',
    text: `${dsSection(dsCall('get_weather', '{"city": "Paris"}'))}<｜end▁of▁sentence｜>`,
    expected: { content: '', calls: [{ id: 'call_2_0', name: 'get_weather', args: WEATHER }] },
  },
];

const kimiCall = (id: string, args: string): string =>
  `<|tool_call_begin|>${id}<|tool_call_argument_begin|>${args}<|tool_call_end|>`;
const kimiSection = (...calls: string[]): string =>
  `<|tool_calls_section_begin|>${calls.join('')}<|tool_calls_section_end|>`;

const KIMI: Case[] = [
  {
    name: 'single call',
    text: kimiSection(kimiCall('functions.get_weather:0', '{"city": "Paris"}')),
    expected: { content: '', calls: [{ id: 'functions.get_weather:0', name: 'get_weather', args: WEATHER }] },
    rawArgs: ['{"city": "Paris"}'],
  },
  {
    name: 'parallel calls',
    text: kimiSection(
      kimiCall('functions.get_weather:0', '{"city":"Paris"}'),
      kimiCall('functions.get_time:1', '{"zone": "Europe/Paris", "format": "24h"}'),
    ),
    expected: {
      content: '',
      calls: [
        { id: 'functions.get_weather:0', name: 'get_weather', args: WEATHER },
        { id: 'functions.get_time:1', name: 'get_time', args: TIME },
      ],
    },
    rawArgs: ['{"city":"Paris"}', '{"zone": "Europe/Paris", "format": "24h"}'],
  },
  {
    name: 'content before the call (kept as it is)',
    text: `Let me check. ${kimiSection(kimiCall('functions.get_weather:0', '{"city": "Paris"}'))}`,
    expected: {
      content: 'Let me check. ',
      calls: [{ id: 'functions.get_weather:0', name: 'get_weather', args: WEATHER }],
    },
  },
  {
    name: 'malformed JSON',
    text: kimiSection(kimiCall('functions.get_weather:0', '{"city": "Paris"')),
    expected: /^call 1: the arguments of get_weather are not valid JSON/,
  },
  {
    name: 'missing name',
    text: kimiSection(kimiCall('functions.:0', '{}')),
    expected: /^call 1: id "functions\.:0" is not functions\.NAME:IDX$/,
  },
  {
    name: 'unclosed section',
    text: `<|tool_calls_section_begin|>${kimiCall('functions.get_weather:0', '{"city": "Paris"}')}`,
    expected: /^call 1: the section is not closed/,
  },
  {
    name: 'unicode arguments',
    text: kimiSection(kimiCall('functions.search:0', JSON.stringify(UNICODE))),
    expected: { content: '', calls: [{ id: 'functions.search:0', name: 'search', args: UNICODE }] },
  },
  { name: 'no call', text: 'Sunny.', expected: { content: 'Sunny.', calls: [] } },
  {
    name: 'trailing special tokens',
    text: `${kimiSection(kimiCall('functions.get_weather:0', '{"city": "Paris"}'))}[EOS]`,
    expected: { content: '', calls: [{ id: 'functions.get_weather:0', name: 'get_weather', args: WEATHER }] },
  },
];

const FAMILIES: [ToolCallFormat, Case[]][] = [
  ['hermes', HERMES],
  ['llama3', LLAMA3],
  ['deepseekv3', DEEPSEEK],
  ['kimi_k2', KIMI],
];

function expectParsed(parsed: ParsedTurn, expected: Expected): void {
  if (expected instanceof RegExp) {
    expect(parsed.ok).toBe(false);
    if (parsed.ok) return;
    expect(parsed.reason).toMatch(expected);
    expect(parsed.reason).not.toContain('\n');
    expect(parsed.reason.length).toBeLessThanOrEqual(200);
    return;
  }
  expect(parsed.ok, parsed.ok ? '' : parsed.reason).toBe(true);
  if (!parsed.ok) return;
  expect(parsed.content).toBe(expected.content);
  expect(
    parsed.calls.map((c) => ({ id: c.id, name: c.function.name, args: callArgumentsObject(c), type: c.type })),
  ).toEqual(expected.calls.map((c) => ({ ...c, type: 'function' })));
}

describe.each(FAMILIES)('parseToolCalls(%s)', (format, cases) => {
  it.each(cases)('$name', ({ text, expected, rawArgs }) => {
    const parsed = parseToolCalls(format, text, { turn: 2 });
    expectParsed(parsed, expected);
    if (rawArgs !== undefined && parsed.ok) expect(parsed.calls.map((c) => c.function.arguments)).toEqual(rawArgs);
  });

  it(`keeps the arguments in the shape the ${format} template renders`, () => {
    const [first] = cases;
    const parsed = first === undefined ? undefined : parseToolCalls(format, first.text, { turn: 1 });
    expect(parsed?.ok).toBe(true);
    const args = parsed?.ok === true ? parsed.calls[0]?.function.arguments : undefined;
    expect(typeof args).toBe(format === 'llama3' ? 'object' : 'string');
  });
});

describe('parseToolCalls reasons', () => {
  it('bounds a long reason to one line of 200 characters', () => {
    const text = `<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>${'\nmore text '.repeat(100)}`;
    const parsed = parseToolCalls('hermes', text, { turn: 1 });
    expect(parsed.ok).toBe(false);
    if (!parsed.ok) {
      expect(parsed.reason.length).toBeLessThanOrEqual(200);
      expect(parsed.reason).not.toMatch(/\n/);
    }
  });
});

describe('callArgumentsObject', () => {
  const call = (args: ToolCall['function']['arguments']): ToolCall => ({
    id: 'c',
    type: 'function',
    function: { name: 'f', arguments: args },
  });
  it('parses JSON text and passes an object through', () => {
    expect(callArgumentsObject(call('{"a": [1, 2]}'))).toEqual({ a: [1, 2] });
    expect(callArgumentsObject(call({ a: 1 }))).toEqual({ a: 1 });
  });
  it('throws for text that is no JSON object', () => {
    expect(() => callArgumentsObject(call('[1]'))).toThrow(/not a JSON object/);
    expect(() => callArgumentsObject(call('{'))).toThrow(/not valid JSON/);
  });
});

describe('detectToolCallFormat', () => {
  it.each([
    ['{{- "<tool_call>\\n" }}{{ tool_call.name }}', 'hermes'],
    ["{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] }}", 'deepseekv3'],
    ['<|tool_calls_section_begin|>{% for tool_call in message.tool_calls %}', 'kimi_k2'],
    ['{{- "<|python_tag|>" + tool_call.name + ".call(" }}', 'llama3'],
    ['{%- if message.role == "ipython" %}{{- \'"parameters": \' }}', 'llama3'],
    ["{% for m in messages %}{{ m['content'] }}{% endfor %}", undefined],
    [undefined, undefined],
  ] as [string | undefined, ToolCallFormat | undefined][])('%s → %s', (source, format) => {
    expect(detectToolCallFormat(source)).toBe(format);
  });
});

const assistant = (content: string, toolCalls?: unknown[]): ChatMessage => ({
  role: 'assistant',
  content,
  ...(toolCalls === undefined ? {} : { tool_calls: toolCalls }),
});
const tool = (content: string, extra: Partial<ChatMessage> = {}): ChatMessage => ({ role: 'tool', content, ...extra });
const openAiCall = (id: string, name: string, args: unknown = '{}'): unknown => ({
  id,
  type: 'function',
  function: { name, arguments: args },
});

describe('sourceCalls', () => {
  it.each([
    [
      'OpenAI tool_calls with string arguments',
      assistant('', [openAiCall('a', 'get_weather', '{"city":"Paris"}')]),
      [{ name: 'get_weather', id: 'a' }],
    ],
    [
      'OpenAI tool_calls with object arguments',
      assistant('', [openAiCall('a', 'f', { x: 1 }), openAiCall('b', 'g')]),
      [
        { name: 'f', id: 'a' },
        { name: 'g', id: 'b' },
      ],
    ],
    ['a bare {name, arguments} entry', assistant('', [{ name: 'f', arguments: { x: 1 } }]), [{ name: 'f' }]],
    [
      'Hermes <tool_call> blocks in the text',
      assistant(
        'I will look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {"a": 1}}\n</tool_call>',
      ),
      [{ name: 'f' }, { name: 'g' }],
    ],
    [
      'a Hermes block written as a Python dict',
      assistant("<tool_call>\n{'arguments': {'q': 'x'}, 'name': 'search'}\n</tool_call>"),
      [{ name: 'search' }],
    ],
    ['no call', assistant('Just text.'), []],
    [
      'an empty tool_calls list falls back to the text',
      assistant('<tool_call>{"name": "f"}</tool_call>', []),
      [{ name: 'f' }],
    ],
  ] as [string, ChatMessage, unknown][])('%s', (_, message, expected) => {
    expect(sourceCalls(message)).toEqual(expected);
  });

  it.each([
    [
      'an entry without a name',
      assistant('', [openAiCall('a', 'f'), { id: 'b', function: { arguments: '{}' } }]),
      'tool_calls[1] has no function name',
    ],
    ['an entry that is no object', assistant('', ['f']), 'tool_calls[0] is not an object'],
    ['an unclosed block', assistant('<tool_call>{"name": "f"}'), '<tool_call> block 1 is not closed'],
    [
      'a block without a name',
      assistant('<tool_call>{"arguments": {}}</tool_call>'),
      /^<tool_call> block 1 has no function name/,
    ],
  ] as [string, ChatMessage, string | RegExp][])('says why it cannot read %s', (_, message, reason) => {
    const got = sourceCalls(message);
    expect(typeof got).toBe('string');
    expect(got).toMatch(reason);
  });
});

const made = (...names: string[]): ToolCall[] =>
  names.map((name, i) => ({ id: `call_3_${String(i)}`, type: 'function', function: { name, arguments: '{}' } }));

describe('matchSourceResults', () => {
  it('gives each result the id of the regenerated call it answers', () => {
    const m = matchSourceResults(3, made('get_weather', 'get_time'), {
      assistant: assistant('', [openAiCall('src_a', 'get_weather'), openAiCall('src_b', 'get_time')]),
      results: [tool('21 °C', { tool_call_id: 'src_a' }), tool('14:00', { tool_call_id: 'src_b', name: 'get_time' })],
    });
    expect(m).toEqual({
      ok: true,
      results: [
        { role: 'tool', content: '21 °C', tool_call_id: 'call_3_0' },
        { role: 'tool', content: '14:00', tool_call_id: 'call_3_1', name: 'get_time' },
      ],
    });
  });

  it("names a result by the call's name where the source named results but gave no id", () => {
    const m = matchSourceResults(3, made('get_weather'), {
      assistant: assistant('', [{ name: 'get_weather', arguments: {} }]),
      results: [tool('21 °C', { name: 'weather' })],
    });
    expect(m).toEqual({
      ok: true,
      results: [{ role: 'tool', content: '21 °C', name: 'get_weather', tool_call_id: 'call_3_0' }],
    });
  });

  it('keeps a Hermes-in-text results message whole', () => {
    const results: ChatMessage[] = [
      {
        role: 'user',
        content: '<tool_response>\n{"t": 21}\n</tool_response>\n<tool_response>\n{"h": 14}\n</tool_response>',
      },
    ];
    const m = matchSourceResults(3, made('f', 'g'), {
      assistant: assistant(
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
      ),
      results,
    });
    expect(m).toEqual({ ok: true, results });
  });

  it('has no results where neither side called', () => {
    expect(matchSourceResults(2, [], { assistant: assistant('Hi.'), results: [] })).toEqual({ ok: true, results: [] });
  });

  it.each([
    [
      'another tool',
      made('search'),
      { assistant: assistant('', [openAiCall('a', 'get_weather')]), results: [tool('x')] },
      'tool-mismatch: turn 3 called search where the source called get_weather',
    ],
    [
      'another tool in a parallel turn',
      made('f', 'h'),
      { assistant: assistant('', [openAiCall('a', 'f'), openAiCall('b', 'g')]), results: [tool('x'), tool('y')] },
      'tool-mismatch: turn 3 called h where the source called g (call 2)',
    ],
    [
      'another number of calls',
      made('f', 'f'),
      { assistant: assistant('', [openAiCall('a', 'f')]), results: [tool('x')] },
      'tool-mismatch: turn 3 made 2 calls where the source made 1',
    ],
    [
      'a call where the source answered',
      made('f'),
      { assistant: assistant('The answer.'), results: [] },
      'tool-mismatch: turn 3 called f where the source answered',
    ],
    [
      'an answer where the source called',
      [],
      { assistant: assistant('', [openAiCall('a', 'f'), openAiCall('b', 'g')]), results: [tool('x'), tool('y')] },
      'tool-mismatch: turn 3 answered where the source called f, g',
    ],
    [
      'a source whose results do not answer its calls',
      made('f', 'g'),
      { assistant: assistant('', [openAiCall('a', 'f'), openAiCall('b', 'g')]), results: [tool('x')] },
      'tool-source: turn 3: the source made 2 calls and 1 results answer them',
    ],
    [
      'a source whose calls cannot be read',
      made('f'),
      { assistant: assistant('', [{ id: 'a', function: {} }]), results: [tool('x')] },
      'tool-source: turn 3: tool_calls[0] has no function name',
    ],
  ] as [string, ToolCall[], { assistant: ChatMessage; results: ChatMessage[] }, string][])(
    'ends on %s',
    (_, calls, source, reason) => {
      expect(matchSourceResults(3, calls, source)).toEqual({ ok: false, reason });
    },
  );
});

describe('undefinedToolCall', () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: {} } }, { name: 'get_time' }];
  it('names the first call to a tool the record does not define', () => {
    expect(undefinedToolCall(made('get_weather', 'search'), tools, 4)).toBe(
      "tool-unknown: turn 4 called search, which the record's tools do not define",
    );
  });
  it('passes calls to defined tools, in either shape', () => {
    expect(undefinedToolCall(made('get_weather', 'get_time'), tools, 4)).toBeUndefined();
  });
  it('does not judge a record without structured tools', () => {
    expect(undefinedToolCall(made('anything'), undefined, 4)).toBeUndefined();
    expect(undefinedToolCall(made('anything'), [], 4)).toBeUndefined();
  });
});
