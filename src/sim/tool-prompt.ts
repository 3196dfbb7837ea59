/**
 * What the simulated model reads in a prompt before it calls a tool: the call format of its chat
 * template, the tools the template rendered into the prompt, and where the conversation stands
 * (the request it works on and how many answers it already gave to it). The prompt is read as
 * the model sees it: its ids decoded with the special tokens.
 */
import type { ToolCallFormat } from '../shared/index.js';

/** A call format, as SGLang's `--tool-call-parser` names it (src/shared/tools). */
type SimToolCallFormat = ToolCallFormat;

type Role = 'system' | 'user' | 'assistant' | 'tool';

/** How a family's template opens each message, and what closes one. */
interface Dialect {
  starts: readonly (readonly [marker: string, role: Role])[];
  ends: readonly string[];
}

const llamaHeader = (role: string): string => `<|start_header_id|>${role}<|end_header_id|>`;

const DIALECTS: Record<SimToolCallFormat, Dialect> = {
  hermes: {
    starts: [
      ['<|im_start|>system\n', 'system'],
      ['<|im_start|>user\n', 'user'],
      ['<|im_start|>assistant\n', 'assistant'],
      ['<|im_start|>tool\n', 'tool'],
    ],
    ends: ['<|im_end|>'],
  },
  llama3: {
    starts: [
      [llamaHeader('system'), 'system'],
      [llamaHeader('user'), 'user'],
      [llamaHeader('assistant'), 'assistant'],
      [llamaHeader('ipython'), 'tool'],
      [llamaHeader('tool'), 'tool'],
    ],
    ends: ['<|eot_id|>', '<|eom_id|>'],
  },
  deepseekv3: {
    starts: [
      ['<｜User｜>', 'user'],
      ['<｜Assistant｜>', 'assistant'],
      ['<｜tool▁output▁begin｜>', 'tool'],
    ],
    ends: ['<｜end▁of▁sentence｜>', '<｜tool▁output▁end｜>', '<｜tool▁outputs▁end｜>'],
  },
  kimi_k2: {
    starts: [
      ['<|im_system|>system<|im_middle|>', 'system'],
      ['<|im_user|>user<|im_middle|>', 'user'],
      ['<|im_assistant|>assistant<|im_middle|>', 'assistant'],
      ['<|im_system|>tool<|im_middle|>', 'tool'],
    ],
    ends: ['<|im_end|>'],
  },
};

interface PromptMessage {
  role: Role;
  content: string;
  /** Where the message's content ends in the prompt text. */
  end: number;
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

const dialectPatterns = new Map<SimToolCallFormat, RegExp>();

function dialectPattern(format: SimToolCallFormat): RegExp {
  let re = dialectPatterns.get(format);
  if (re === undefined) {
    re = new RegExp(DIALECTS[format].starts.map(([marker]) => escapeRegExp(marker)).join('|'), 'g');
    dialectPatterns.set(format, re);
  }
  return re;
}

/** The messages of a rendered prompt, in order, each's content without the marker that closes it. */
function promptMessages(text: string, format: SimToolCallFormat): PromptMessage[] {
  const dialect = DIALECTS[format];
  const roleOf = new Map(dialect.starts);
  const found = [...text.matchAll(dialectPattern(format))];
  return found.map((m, i) => {
    const start = m.index + m[0].length;
    const end = found[i + 1]?.index ?? text.length;
    let content = text.slice(start, end);
    for (const close of dialect.ends) {
      const at = content.indexOf(close);
      if (at >= 0) content = content.slice(0, at);
    }
    let role = roleOf.get(m[0]) ?? 'user';
    // Hermes templates (Qwen3) render tool results as a user turn of `<tool_response>` blocks.
    if (role === 'user' && /^\s*<tool_response>/.test(content)) role = 'tool';
    return { role, content, end: start + content.length };
  });
}

/** A tool the prompt offers: its name and its parameters' JSON schema. */
export interface OfferedTool {
  name: string;
  parameters: unknown;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** An OpenAI tool (`{type: function, function: {name, …}}`) or a bare function schema (`{name, parameters}`). */
function toolOf(value: unknown): OfferedTool | undefined {
  if (!isObject(value)) return undefined;
  const fn = isObject(value.function) ? value.function : undefined;
  if (fn !== undefined && typeof fn.name === 'string') return { name: fn.name, parameters: fn.parameters };
  if (typeof value.name === 'string' && isObject(value.parameters))
    return { name: value.name, parameters: value.parameters };
  return undefined;
}

/** Longest JSON object the scan tries to read, in characters. */
const MAX_OBJECT_CHARS = 200_000;

/** The end (exclusive) of the balanced `{…}` starting at `from`, strings respected; -1 if it does not close. */
function objectEnd(text: string, from: number): number {
  let depth = 0;
  let inString = false;
  const limit = Math.min(text.length, from + MAX_OBJECT_CHARS);
  for (let i = from; i < limit; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{') depth++;
    else if (c === '}') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

/** The tool schemas written as JSON objects in `text` (one object may not hold another tool). */
function toolsInJson(text: string): OfferedTool[] {
  const tools: OfferedTool[] = [];
  for (let i = text.indexOf('{'); i >= 0; i = text.indexOf('{', i + 1)) {
    if (!/^\{\s*"/.test(text.slice(i, i + 64))) continue;
    const end = objectEnd(text, i);
    if (end < 0) continue;
    let value: unknown;
    try {
      value = JSON.parse(text.slice(i, end));
    } catch {
      continue;
    }
    const tool = toolOf(value);
    if (tool !== undefined) {
      tools.push(tool);
      i = end - 1;
    }
  }
  return tools;
}

/**
 * The tools the chat template rendered into the prompt: Hermes' `<tools>` block of JSON lines
 * (Qwen3), else the tool schemas written as JSON before the end of the first user message
 * (a system block, Llama 3.1's first user turn, Kimi's `tool_declare`).
 */
function offeredTools(text: string, messages: readonly PromptMessage[]): OfferedTool[] {
  const block = /<tools>\n?([\s\S]*?)\n?<\/tools>/.exec(text);
  if (block?.[1] !== undefined) {
    const tools = toolsInJson(block[1]);
    if (tools.length > 0) return tools;
  }
  const firstUser = messages.find((m) => m.role === 'user');
  return toolsInJson(text.slice(0, firstUser?.end ?? text.length));
}

/** Where a conversation with tools stands when the model is asked to answer. */
export interface ToolPrompt {
  tools: OfferedTool[];
  /** The last user message (not a tool result): the request the model works on, trimmed. */
  request: string;
  /** Answers the model already gave since that request (each earlier assistant message). */
  rounds: number;
  /** Whether the prompt ends with tool results (else with the request). */
  afterToolResults: boolean;
  /** Calls written in the prompt's earlier answers (Kimi K2 numbers its calls across a conversation). */
  earlierCalls: number;
}

/** The call-open marker of each format, counted in a prompt's earlier answers. */
const CALL_MARKERS: Record<SimToolCallFormat, RegExp> = {
  hermes: /<tool_call>/g,
  llama3: /"parameters"\s*:/g,
  deepseekv3: /<｜tool▁call▁begin｜>/g,
  kimi_k2: /<\|tool_call_begin\|>/g,
};

function isGenerationPrompt(m: PromptMessage): boolean {
  return m.role === 'assistant' && m.content.replace(/<think>\s*<\/think>/, '').trim() === '';
}

/**
 * Reads a decoded prompt: undefined when it offers no tool, has no user request, or does not
 * ask for an answer (it must end with the template's generation prompt, or with tool results
 * where the family answers them without one, as DeepSeek-V3).
 */
export function readToolPrompt(text: string, format: SimToolCallFormat): ToolPrompt | undefined {
  const messages = promptMessages(text, format);
  const last = messages.at(-1);
  if (last === undefined) return undefined;
  const history = isGenerationPrompt(last)
    ? messages.slice(0, -1)
    : last.role === 'tool' && format === 'deepseekv3'
      ? messages
      : undefined;
  if (history === undefined) return undefined;
  let request = -1;
  for (let i = history.length - 1; i >= 0; i--) {
    if (history[i]?.role === 'user') {
      request = i;
      break;
    }
  }
  if (request < 0) return undefined;
  const tools = offeredTools(text, messages);
  if (tools.length === 0) return undefined;
  const after = history.slice(request + 1);
  const answers = after.filter((m) => m.role === 'assistant');
  let earlierCalls = 0;
  for (const m of messages)
    if (m.role === 'assistant') earlierCalls += m.content.match(CALL_MARKERS[format])?.length ?? 0;
  return {
    tools,
    request: (history[request] as PromptMessage).content.trim(),
    rounds: answers.length,
    afterToolResults: history.at(-1)?.role === 'tool',
    earlierCalls,
  };
}
