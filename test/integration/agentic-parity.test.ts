// Token-for-token parity of agentic turn prompts (docs/agentic.md, "The model's calls") with
// Python transformers, for Qwen3 (answers without reasoning, with it, and with enable_thinking:
// false), Llama 3.1 (its tool-use template), DeepSeek-V3 (DeepSeek-V3-0324's template) and the
// Kimi K2 family (the tool-capable folders of test/helpers/tool-tokenizers.ts).
//
// Each seeded conversation offers tools and has turns that call one tool, or two or three in
// parallel (where the template renders more than one), with content before the calls (where the
// template renders it), the tool results that answer them, and a final text answer; some go on
// with a second question. The source's assistant messages are the ground truth: turn k's model
// output is the template's own rendering of the source's k-th assistant message (after the
// generation prompt, up to and including the end-of-turn token; for Qwen3 without reasoning, the
// empty think block it writes into the last turn left out), as ids. The conversation is then
// regenerated as the worker's driver does it: readToolTurn reads each output's calls
// (answerTextWithSpecials + parseToolCalls) and places the source's results after them
// (matchSourceResults), turnHistory builds turn k's history from the parsed answers and those
// results, and renderTurnPrompt gives turn k's prompt with the record's tools, spliced from turn
// k − 1's ids where the template continues exactly.
//
// For every turn, the history tokenmill built must be the source's history (the parsed calls'
// names, arguments, ids and content, the results' tool_call_id), and the prompt ids must equal
// Python apply_chat_template(history, tools=…, add_generation_prompt=True) on that history
// (test/python/agentic_parity.py; one process for all tokenizers). A spliced prompt may differ
// from a fresh encoding by design (the model's ids are kept, never re-encoded): such a turn is
// accepted only for a reason in KNOWN, predicted by the plan, with tokenmill's text equal to
// Python's and a fresh encoding of it equal to Python's ids; each is counted, none skipped. The
// turns spliced and rendered are counted per family, and whether each turn splices must be what
// the template implies (`splices` below).
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { conversationTurns, turnHistory } from '../../src/shared/prompts/conversation.js';
import {
  loadTokenizer,
  renderTurnPrompt,
  type ChatMessage,
  type ChatTokenizer,
  type RegeneratedAnswer,
} from '../../src/shared/tokenizer/index.js';
import { callArgumentsObject, type ToolCall, type ToolCallFormat } from '../../src/shared/tools/index.js';
import { readToolTurn } from '../../src/workers/inference/conversation-tools.js';
import { Rng } from '../fixtures/conversations/corpus.js';
import { runPythonJson } from '../helpers/python.js';
import {
  deepseekV3ToolsFolder,
  kimiEncodingSpec,
  kimiK2ToolsFolder,
  llama31ToolsFolder,
  qwen3Folder,
  type KimiEncodingSpec,
} from '../helpers/tool-tokenizers.js';
import { useTempDir } from '../helpers/temp.js';
import { idsDifference } from '../helpers/token-diff.js';

const TOOLS: unknown[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', description: 'The city, e.g. Paris' },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        },
        required: ['city'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'search_web',
      description: 'Searches the web and returns the top results',
      parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
    },
  },
  {
    type: 'function',
    function: {
      name: 'read_file',
      description: 'Reads a file of the repository',
      parameters: {
        type: 'object',
        properties: { path: { type: 'string' }, start_line: { type: 'integer' } },
        required: ['path'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'edit_file',
      description: 'Replaces lines of a file',
      parameters: {
        type: 'object',
        properties: {
          path: { type: 'string' },
          edits: {
            type: 'array',
            items: { type: 'object', properties: { line: { type: 'integer' }, text: { type: 'string' } } },
          },
        },
        required: ['path', 'edits'],
      },
    },
  },
];

/** Why a turn's prompt may differ from transformers' fresh encoding of the same history, by design. */
const KNOWN = {
  mergedNewline:
    "a spliced answer that starts with a newline after a generation prompt that ends with one (Qwen3's " +
    "`assistant\\n`): the prompt keeps the model's two ids, a fresh encoding merges them into one " +
    '(docs/multi-turn.md, Token-exact). The template writes no answer that way (it strips the newline), so ' +
    'none of these plans has one; a model that did would be counted here',
} as const;
type KnownReason = keyof typeof KNOWN;

interface Family {
  label: string;
  folder: (tmp: string) => Promise<string>;
  format: ToolCallFormat;
  /** Kimi's folder: Python renders its template and encodes with tiktoken. */
  kimi?: boolean;
  /** The calls' arguments as the template takes them: JSON text where it concatenates strings (DeepSeek-V3). */
  argsAsText?: boolean;
  /** The template renders no content beside calls (Llama 3.1). */
  dropsContent?: boolean;
  /** The most calls one message may make (Llama 3.1's template raises for more than one). */
  maxCalls: number;
  /** Answers carry reasoning (a `<think>` block the model writes before its content). */
  reasoning?: boolean;
  /** The model writes no think block, though the template puts an empty one into the last turn (Qwen3). */
  noThinkBlock?: boolean;
  /** The dataset's `chatTemplateKwargs`. */
  templateKwargs?: Record<string, unknown>;
  /** Whether turn k splices from turn k − 1, given whether turn k − 1 called tools. */
  splices: (previousCalled: boolean) => boolean;
  /** Spliced turns whose ids differ from a fresh encoding, and why (none by default). */
  known?: (turn: TurnStep) => KnownReason | undefined;
}

const FAMILIES: Family[] = [
  {
    // Earlier answers render as `<|im_start|>assistant\n` + content + calls + `<|im_end|>\n`, their
    // reasoning (none here) dropped: the model's output exactly, so every turn splices.
    label: 'Qwen3',
    folder: () => qwen3Folder(),
    format: 'hermes',
    maxCalls: 3,
    noThinkBlock: true,
    splices: () => true,
    known: (s) => (s.previousOutput.startsWith('\n') ? 'mergedNewline' : undefined),
  },
  {
    // An answer followed by tool results (after the last user query) keeps its reasoning in the
    // history, as the model wrote it: the next turn splices. A final answer before the next user
    // question loses it: that turn is rendered.
    label: 'Qwen3 (reasoning)',
    folder: () => qwen3Folder(),
    format: 'hermes',
    maxCalls: 3,
    reasoning: true,
    splices: (previousCalled) => previousCalled,
    known: (s) => (s.previousOutput.startsWith('\n') ? 'mergedNewline' : undefined),
  },
  {
    // The generation prompt holds an empty think block that no earlier answer is rendered with:
    // every later turn is rendered (docs/multi-turn.md, Token-exact).
    label: 'Qwen3 (enable_thinking: false)',
    folder: () => qwen3Folder(),
    format: 'hermes',
    maxCalls: 3,
    templateKwargs: { enable_thinking: false },
    splices: () => false,
  },
  {
    // One call per message (as `{"name": …, "parameters": …}`, content not rendered), tool results
    // as `ipython` turns; answers have no surrounding whitespace, which the template would trim.
    label: 'Llama 3.1',
    folder: (tmp) => llama31ToolsFolder(path.join(tmp, 'llama31-tools')),
    format: 'llama3',
    maxCalls: 1,
    dropsContent: true,
    splices: () => true,
  },
  {
    // No assistant header after tool outputs: the prompt ends with `<｜tool▁outputs▁end｜>`, which
    // the rendering of the answer after them starts with; it splices throughout.
    label: 'DeepSeek-V3',
    folder: (tmp) => deepseekV3ToolsFolder(path.join(tmp, 'deepseek-v3')),
    format: 'deepseekv3',
    maxCalls: 3,
    argsAsText: true,
    splices: () => true,
  },
  {
    label: 'Kimi K2',
    folder: (tmp) => kimiK2ToolsFolder(path.join(tmp, 'kimi-k2')),
    format: 'kimi_k2',
    kimi: true,
    maxCalls: 3,
    splices: () => true,
  },
];

const CONVERSATIONS_PER_FAMILY = 8;
const SEED = 20_250_311;

const SYSTEMS = [
  'You are a helpful assistant with tools.',
  'You are a coding agent. Use the tools to inspect the repository.',
];
const QUESTIONS = [
  'Do I need an umbrella in Paris today?',
  'What is the weather in Zürich and in 東京 right now?',
  'Find out which Node.js version is the active LTS.',
  'Read src/main.ts and tell me what it does.',
  'Compare the weather in São Paulo with the top search result for "rain tomorrow".',
];
const CONTENTS = [
  'Let me check.',
  'I will look that up first.',
  'Checking both at once — one moment.',
  '先に確認します。',
];
const ANSWERS = [
  'It is 21 °C and clear in Paris: no umbrella needed.',
  'Node.js 22 is the active LTS.',
  'The file starts the server on port 8080 and reads its settings from the environment.',
  'Zürich is mild; 東京 has rain («雨») all afternoon.',
  'Nothing came up for that search.',
];
const REASONING = [
  'The user wants the weather; I should call get_weather.',
  'Two independent look-ups: I can make both calls at once.',
  'The results are in, so I can answer now.',
];
const RESULTS = [
  '{"temp_c": 21, "sky": "clear"}',
  '{"results": ["Node.js 22 is the active LTS"]}',
  'No results.',
  '{"temp_c": 28, "sky": "雨"}',
  'export function main() {\n  serve(Number(process.env.PORT ?? 8080));\n}',
  '',
];

function callArgs(rng: Rng, name: string): Record<string, unknown> {
  switch (name) {
    case 'get_weather':
      return rng.int(0, 1) === 0
        ? { city: rng.pick(['Paris', 'Zürich', '東京', 'São Paulo']) }
        : { city: rng.pick(['Oslo', 'Lima']), unit: rng.pick(['celsius', 'fahrenheit']) };
    case 'search_web':
      return { query: rng.pick(['node lts', 'rain tomorrow "Paris"', 'speculative decoding drafter']) };
    case 'read_file':
      return rng.int(0, 1) === 0 ? { path: 'src/main.ts' } : { path: 'README.md', start_line: rng.int(1, 40) };
    default:
      return {
        path: 'src/main.ts',
        edits: [
          { line: rng.int(1, 9), text: '  serve(8080); // «port»' },
          { line: rng.int(10, 20), text: '' },
        ],
      };
  }
}

const toolName = (t: unknown): string => (t as { function: { name: string } }).function.name;

/**
 * One seeded conversation: a source whose assistant messages are the ground truth (calls with the
 * ids tokenmill gives the parsed calls: Kimi's own `functions.NAME:IDX`, else `call_<turn>_<i>`).
 */
function conversation(family: Family, rng: Rng): ChatMessage[] {
  const messages: ChatMessage[] = rng.int(0, 1) === 0 ? [{ role: 'system', content: rng.pick(SYSTEMS) }] : [];
  let turn = 0;
  let kimiIndex = 0;
  const questions = rng.int(1, 2);
  for (let q = 0; q < questions; q++) {
    messages.push({ role: 'user', content: rng.pick(QUESTIONS) });
    const callingTurns = rng.int(1, 2);
    for (let c = 0; c < callingTurns; c++) {
      turn += 1;
      const n = family.maxCalls === 1 ? 1 : rng.int(1, family.maxCalls);
      const calls: ToolCall[] = Array.from({ length: n }, (_, i) => {
        const name = toolName(rng.pick(TOOLS));
        const args = callArgs(rng, name);
        const id = family.kimi === true ? `functions.${name}:${String(kimiIndex++)}` : `call_${turn}_${i}`;
        return {
          id,
          type: 'function',
          function: { name, arguments: family.argsAsText === true ? JSON.stringify(args) : args },
        };
      });
      const content = family.dropsContent === true || rng.int(0, 2) === 0 ? '' : rng.pick(CONTENTS);
      messages.push({
        role: 'assistant',
        content,
        ...(family.reasoning === true ? { reasoning_content: rng.pick(REASONING) } : {}),
        tool_calls: calls,
      });
      for (const call of calls) messages.push({ role: 'tool', content: rng.pick(RESULTS), tool_call_id: call.id });
    }
    turn += 1;
    messages.push({
      role: 'assistant',
      content: rng.pick(ANSWERS),
      ...(family.reasoning === true ? { reasoning_content: rng.pick(REASONING) } : {}),
    });
  }
  return messages;
}

/** One regenerated turn. */
interface TurnStep {
  conversation: number;
  turn: number;
  /** tokenmill's history and prompt. */
  history: ChatMessage[];
  ids: number[];
  text: string;
  spliced: boolean;
  /** The source's history of the turn: what transformers renders. */
  source: ChatMessage[];
  /** Whether the turn before called tools. */
  previousCalled: boolean;
  /** The text of the turn before's output (decoded with its special tokens). */
  previousOutput: string;
}

interface FamilyRun {
  tok: ChatTokenizer;
  folder: string;
  steps: TurnStep[];
}

/** The model's output for `message` after `before`: the template's rendering of it, as ids (see the file's comment). */
function modelOutput(tok: ChatTokenizer, family: Family, before: ChatMessage[], message: ChatMessage): number[] {
  const eot = tok.templateEndOfTurnTokenId;
  if (eot === undefined) throw new Error(`${family.label}: no end-of-turn token`);
  const opts = {
    tools: TOOLS,
    ...(family.templateKwargs === undefined ? {} : { templateKwargs: family.templateKwargs }),
  };
  const prompt = tok.applyChatTemplate(before, { ...opts, addGenerationPrompt: true });
  const full = tok.applyChatTemplate([...before, message], { ...opts, addGenerationPrompt: false });
  if (!full.startsWith(prompt)) throw new Error(`${family.label}: the rendering does not continue its prompt`);
  let part = full.slice(prompt.length);
  const end = part.indexOf(tok.idToToken(eot) ?? '\u0000');
  if (end < 0) throw new Error(`${family.label}: the turn does not end with its end-of-turn token`);
  part = part.slice(0, end);
  if (family.noThinkBlock === true) part = part.replace(/^<think>\n\n<\/think>\n\n/, '');
  return [...tok.encode(part), eot];
}

/** Regenerates `messages` turn by turn, as the driver does (conversation-driver.ts). */
async function regenerate(tok: ChatTokenizer, family: Family, c: number, messages: ChatMessage[]): Promise<TurnStep[]> {
  const turns = conversationTurns(messages);
  if (typeof turns === 'string') throw new Error(turns);
  const total = turns.starts.length;
  const answers: RegeneratedAnswer[] = [];
  const results: (ChatMessage[] | undefined)[] = [];
  const steps: TurnStep[] = [];
  let previous: { promptIds: number[]; history: ChatMessage[]; text: string } | undefined;
  for (let k = 1; k <= total; k++) {
    const history = turnHistory(
      messages,
      turns,
      k,
      answers.map((a) => a.message),
      results,
    );
    const prompt = renderTurnPrompt(tok, {
      history,
      tools: TOOLS,
      ...(family.templateKwargs === undefined ? {} : { templateKwargs: family.templateKwargs }),
      ...(previous === undefined ? {} : { previous: { ...previous, answer: answers[k - 2] as RegeneratedAnswer } }),
    });
    const start = turns.starts[k - 1] as number;
    const source = messages.slice(0, start);
    const outputIds = modelOutput(tok, family, source, messages[start] as ChatMessage);
    const read = await readToolTurn(
      tok,
      { dataset: 'd', conversationId: `c${c}`, turn: k, total, outputIds, messages, turns },
      { format: family.format, tools: TOOLS },
    );
    if (read.kind === 'end') throw new Error(`${family.label} #${c} turn ${k}: ${read.reason}`);
    answers.push({ outputIds, message: read.message });
    if (read.results !== undefined) results[k - 1] = read.results;
    const before = steps.at(-1);
    steps.push({
      conversation: c,
      turn: k,
      history,
      ids: prompt.ids,
      text: prompt.text,
      spliced: prompt.spliced,
      source,
      previousCalled: before === undefined ? false : (answers[k - 2]?.message.tool_calls?.length ?? 0) > 0,
      previousOutput: k === 1 ? '' : tok.decode(answers[k - 2]?.outputIds ?? [], { skipSpecialTokens: false }),
    });
    previous = { promptIds: prompt.ids, history, text: prompt.text };
  }
  return steps;
}

/** A history with every call's arguments as an object: the parsed text and the source's object compare alike. */
function normalized(history: readonly ChatMessage[]): unknown[] {
  return history.map((m) =>
    m.tool_calls === undefined
      ? m
      : {
          ...m,
          tool_calls: (m.tool_calls as ToolCall[]).map((c) => ({
            ...c,
            function: { ...c.function, arguments: callArgumentsObject(c) },
          })),
        },
  );
}

interface PyCase {
  rendered?: string;
  input_ids?: number[];
  error?: string;
}

const tmp = useTempDir('agentic-parity-');
const runs = new Map<Family, FamilyRun>();
const python = new Map<Family, PyCase[]>();

beforeAll(async () => {
  const jobs: { tokenizer_dir: string; kimi: KimiEncodingSpec | null; cases: unknown[] }[] = [];
  for (const family of FAMILIES) {
    const folder = await family.folder(tmp);
    const tok = await loadTokenizer(folder);
    const rng = new Rng(SEED);
    const steps: TurnStep[] = [];
    for (let c = 0; c < CONVERSATIONS_PER_FAMILY; c++) {
      steps.push(...(await regenerate(tok, family, c, conversation(family, rng))));
    }
    runs.set(family, { tok, folder, steps });
    jobs.push({
      tokenizer_dir: folder,
      kimi: family.kimi === true ? kimiEncodingSpec(tok) : null,
      cases: steps.map((s) => ({ messages: s.source, tools: TOOLS, kwargs: family.templateKwargs ?? null })),
    });
  }
  const report = await runPythonJson<{ jobs: { cases: PyCase[] }[] }>(
    'agentic_parity.py',
    [],
    { jobs },
    { timeoutMs: 300_000 },
  );
  FAMILIES.forEach((family, i) => python.set(family, report.jobs[i]?.cases ?? []));
}, 600_000);

const counts = new Map<string, { spliced: number; rendered: number; known: Partial<Record<KnownReason, number>> }>();

describe.each(FAMILIES)('$label agentic turns', (family) => {
  const run = (): FamilyRun => {
    const r = runs.get(family);
    if (r === undefined) throw new Error('not regenerated');
    return r;
  };

  it('covers single and parallel calls, content before calls, results and final answers', () => {
    const { steps } = run();
    const answers = steps.flatMap((s) => s.source).filter((m) => m.role === 'assistant');
    const callCounts = new Set(answers.map((m) => m.tool_calls?.length ?? 0));
    expect(callCounts.has(0) && callCounts.has(1)).toBe(true);
    if (family.maxCalls > 1) expect([...callCounts].some((n) => n >= 2)).toBe(true);
    if (family.dropsContent !== true) {
      expect(answers.some((m) => (m.tool_calls?.length ?? 0) > 0 && m.content !== '')).toBe(true);
    }
    expect(steps.filter((s) => s.turn >= 2).length).toBeGreaterThanOrEqual(2 * CONVERSATIONS_PER_FAMILY);
  });

  it("builds each turn's history from the parsed calls and the results that answer them", () => {
    for (const step of run().steps) {
      expect(normalized(step.history), `#${step.conversation} turn ${step.turn}`).toEqual(normalized(step.source));
    }
  });

  it("gives transformers' prompt ids for every turn, splicing where the template continues exactly", () => {
    const { tok, steps } = run();
    const py = python.get(family) ?? [];
    expect(py).toHaveLength(steps.length);
    const count = { spliced: 0, rendered: 0, known: {} as Partial<Record<KnownReason, number>> };
    for (const [i, step] of steps.entries()) {
      const where = `${family.label} #${step.conversation} turn ${step.turn}`;
      const ref = py[i] ?? {};
      expect(ref.error, where).toBeUndefined();
      expect(step.text, `${where}: the rendering`).toBe(ref.rendered);
      if (step.turn >= 2) {
        expect(step.spliced, `${where}: spliced`).toBe(family.splices(step.previousCalled));
        if (step.spliced) count.spliced += 1;
        else count.rendered += 1;
      }
      const diff = idsDifference(tok, step.ids, ref.input_ids ?? []);
      if (diff === '') continue;
      const reason = step.spliced ? family.known?.(step) : undefined;
      expect(reason, `${where}: ${diff}`).toBeDefined();
      // The difference is the splice's alone: a fresh encoding of the same text is Python's.
      expect(tok.encode(step.text), `${where}: a fresh encoding`).toEqual(ref.input_ids);
      if (reason !== undefined) count.known[reason] = (count.known[reason] ?? 0) + 1;
    }
    counts.set(family.label, count);
    // Turns after the first: spliced where the template continues exactly, rendered elsewhere.
    expect(count.spliced + count.rendered).toBe(steps.filter((s) => s.turn >= 2).length);
    if (family.splices(false) && family.splices(true)) expect(count.rendered).toBe(0);
    if (family.splices(false) || family.splices(true)) expect(count.spliced).toBeGreaterThan(0);
  });
});

describe('splicing across families', () => {
  it('splices agentic turns where the template continues exactly, and counts every known difference', () => {
    const table = FAMILIES.map((f) => ({ family: f.label, ...counts.get(f.label) }));
    const reasons = new Set(table.flatMap((row) => Object.keys(row.known ?? {}) as KnownReason[]));
    const explained = [...reasons].map((r) => `  ${r}: ${KNOWN[r]}`).join('\n');
    console.info(`agentic turn prompts (turns >= 2):\n${JSON.stringify(table, null, 1)}\n${explained}`);
    expect(counts.get('Qwen3')?.rendered).toBe(0);
    expect(counts.get('Qwen3 (reasoning)')?.rendered).toBeGreaterThan(0);
    expect(counts.get('Qwen3 (enable_thinking: false)')?.spliced).toBe(0);
    for (const f of FAMILIES) expect(counts.get(f.label), f.label).toBeDefined();
  });
});
