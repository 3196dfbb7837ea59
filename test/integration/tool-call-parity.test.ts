// Parity of the tool-call parsers with the chat templates, for Qwen3, Llama 3.1, DeepSeek-V3 and
// Kimi K2: Python transformers renders a user message and an assistant message with one call, two
// parallel calls, and content before a call (where the template renders it); the assistant's part
// of the rendering (after the prompt with its generation prompt, up to the end of turn) is what
// the model writes, and parseToolCalls must read back the same names, arguments and, for Kimi,
// ids. Then, in TypeScript, the parsed calls put back into a history as an assistant message's
// `tool_calls` must render exactly as the original message does (the round trip the multi-turn
// driver relies on).
//
// Templates: the tool-capable folders of test/helpers/tool-tokenizers.ts (Qwen3's package folder,
// Llama 3.1 with its tool-use template, DeepSeek-V3 with DeepSeek-V3-0324's, the kimi-like folder
// with Kimi K2's rendering of calls). Kimi's folder has no tokenizer code for transformers to
// load, so Python renders its template with transformers' own renderer.
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  callArgumentsObject,
  detectToolCallFormat,
  parseToolCalls,
  type ToolCallFormat,
} from '../../src/shared/tools/index.js';
import { loadTokenizer, type ChatMessage, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { runPythonJson } from '../helpers/python.js';
import {
  KIMI_K2_TOOLS_TEMPLATE,
  deepseekV3ToolsFolder,
  kimiK2ToolsFolder,
  llama31ToolsFolder,
  qwen3Folder,
  sortedKeys,
} from '../helpers/tool-tokenizers.js';
import { useTempDir } from '../helpers/temp.js';

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
  /** The tokenizer folder (test/helpers/tool-tokenizers.ts). */
  prepare: (tmp: string) => Promise<string>;
  /** The template Python renders itself: transformers cannot load the folder. */
  pythonRendersTemplate?: string;
  endOfTurn: string;
  /** The arguments as the template takes them: JSON text where it concatenates strings. */
  argsAsText?: boolean;
  /** The template renders no content beside calls. */
  dropsContent?: boolean;
  /** The template raises for more than one call (Llama 3.1). */
  singleCallOnly?: boolean;
}

const FAMILIES: Family[] = [
  {
    label: 'Qwen3',
    format: 'hermes',
    prepare: () => qwen3Folder(),
    endOfTurn: '<|im_end|>',
  },
  {
    label: 'Llama 3.1',
    format: 'llama3',
    prepare: (tmp) => llama31ToolsFolder(path.join(tmp, 'llama31')),
    endOfTurn: '<|eot_id|>',
    dropsContent: true,
    singleCallOnly: true,
  },
  {
    label: 'DeepSeek-V3',
    format: 'deepseekv3',
    prepare: (tmp) => deepseekV3ToolsFolder(path.join(tmp, 'deepseek-v3')),
    endOfTurn: '<｜end▁of▁sentence｜>',
    argsAsText: true,
  },
  {
    label: 'Kimi K2',
    format: 'kimi_k2',
    pythonRendersTemplate: KIMI_K2_TOOLS_TEMPLATE,
    prepare: (tmp) => kimiK2ToolsFolder(path.join(tmp, 'kimi-k2')),
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

const tmp = useTempDir('tool-call-parity-');
const dirs = new Map<Family, string>();
const tokenizers = new Map<Family, ChatTokenizer>();
const rendered = new Map<string, PyCase>();
const key = (family: Family, spec: CaseSpec): string => `${family.label}/${spec.label}`;

beforeAll(async () => {
  for (const family of FAMILIES) dirs.set(family, await family.prepare(tmp));
  const jobs = FAMILIES.flatMap((family) =>
    CASES.map((spec) => ({
      key: key(family, spec),
      tokenizer_dir: family.pythonRendersTemplate === undefined ? dirs.get(family) : null,
      chat_template: family.pythonRendersTemplate ?? null,
      messages: [USER, originalAssistant(family, spec)],
      tools: TOOLS,
    })),
  );
  const report = await runPythonJson<{ cases: PyCase[] }>('tool_call_parity.py', [], { cases: jobs });
  jobs.forEach((job, i) => rendered.set(job.key, report.cases[i] ?? { error: 'no result' }));
  for (const family of FAMILIES) tokenizers.set(family, await loadTokenizer(dirs.get(family) ?? ''));
}, 900_000);

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
