// The simulator's tool calls over real HTTP (/generate on loopback): a Qwen3 prompt that offers
// tools is answered with Hermes `<tool_call>` blocks whose JSON names the prompt's tools, as the
// agent's plan for the request says, at the configured rates of no call, parallel, divergent and
// malformed calls on a seeded run; the ids end with the end-of-turn token; a prompt after tool
// results continues the plan and ends it with text; a prompt without tools never gets a call; a
// dataset's own rates apply to the rids that name it.
import { beforeAll, describe, expect, it } from 'vitest';

import { bundledTokenizerPath, loadTokenizer, type ChatMessage, type ChatTokenizer } from '../../src/shared/index.js';
import { agentPlan } from '../../src/sim/index.js';
import { useHarness } from '../helpers/fixture.js';

const EOS = 151645; // <|im_end|>
const RATES = { probability: 0.8, parallel: 0.3, divergent: 0.2, malformed: 0.15 };

const TOOLS = [
  ['run_shell', { command: { type: 'string' }, timeout_s: { type: 'integer' } }, ['command']],
  ['read_file', { path: { type: 'string' }, start_line: { type: 'integer' } }, ['path']],
  ['edit_file', { path: { type: 'string' }, old_str: { type: 'string' }, new_str: { type: 'string' } }, ['path']],
  ['submit', { summary: { type: 'string' } }, ['summary']],
] as const;
const NAMES = TOOLS.map(([name]) => name as string);
const SCHEMAS = TOOLS.map(([name, properties, required]) => ({
  type: 'function',
  function: { name, description: `The ${name} tool.`, parameters: { type: 'object', properties, required } },
}));

const { sim } = useHarness({
  sim: {
    seed: 11,
    timeScale: 1000,
    maxRunningRequests: 256,
    outputLength: { distribution: 'fixed', mean: 24 },
    output: 'text',
    toolCalls: {
      ...RATES,
      perDataset: { exact: { probability: 1, divergent: 0, malformed: 0 }, quiet: { probability: 0 } },
    },
  },
});

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await loadTokenizer(bundledTokenizerPath());
});

interface Answer {
  text: string;
  ids: number[];
  finish: { type: string; matched?: number };
}

/** One batch /generate of `prompts`, rids given. */
async function generate(prompts: number[][], rids: string[]): Promise<Answer[]> {
  const res = await fetch(`${sim.url}/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ input_ids: prompts, rid: rids, sampling_params: { max_new_tokens: 2048 } }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as {
    text: string;
    output_ids: number[];
    meta_info: { finish_reason: Answer['finish'] };
  }[];
  return body.map((b) => ({ text: b.text, ids: b.output_ids, finish: b.meta_info.finish_reason }));
}

/** The `<tool_call>` blocks of an answer, each as written and parsed (undefined: not JSON). */
function calls(text: string): { raw: string; json: { name?: unknown; arguments?: unknown } | undefined }[] {
  return [...text.matchAll(/<tool_call>\n([\s\S]*?)\n<\/tool_call>/g)].map((m) => {
    const raw = m[1] as string;
    try {
      return { raw, json: JSON.parse(raw) as { name?: unknown; arguments?: unknown } };
    } catch {
      return { raw, json: undefined };
    }
  });
}

const request = (i: number): string => `Issue ${i}: the parser drops the last line of file ${i % 17}.txt; fix it.`;

/** The Qwen3 prompt of `messages`, offering `tools` (null: none). */
function prompt(messages: ChatMessage[], tools: unknown[] | null = SCHEMAS): number[] {
  return tok.encodePrompt(messages, tools === null ? {} : { tools });
}

describe('simulated tool calls (hermes, Qwen3)', () => {
  it('answers a request that offers tools with calls of its tools, at the configured rates', async () => {
    const n = 400;
    const prompts = Array.from({ length: n }, (_, i) => prompt([{ role: 'user', content: request(i) }]));
    const answers = await generate(
      prompts,
      prompts.map((_, i) => `rates/r${i}`),
    );
    let withCalls = 0;
    let parallel = 0;
    let divergent = 0;
    let malformed = 0;
    for (const [i, a] of answers.entries()) {
      // Every answer ends its turn with the end-of-turn token, its ids valid.
      expect(a.finish).toEqual({ type: 'stop', matched: EOS });
      expect(a.ids.at(-1)).toBe(EOS);
      expect(a.ids.every((id) => Number.isInteger(id) && id >= 0 && id < tok.vocabSize)).toBe(true);
      const found = calls(a.text);
      if (found.length === 0) continue;
      withCalls++;
      // The ids are the text's own encoding.
      expect(tok.decode(a.ids.slice(0, -1))).toBe(a.text);
      const planned = agentPlan(request(i), NAMES, RATES.parallel)[0] ?? [];
      expect(found).toHaveLength(planned.length);
      if (found.length > 1) parallel++;
      const names = found.map((c) => (c.json === undefined ? /"name": "([^"]+)"/.exec(c.raw)?.[1] : c.json.name));
      if (names.some((name, j) => name !== planned[j])) divergent++;
      if (found.some((c) => c.json === undefined)) malformed++;
      for (const [j, c] of found.entries()) {
        if (c.json === undefined) continue;
        expect(typeof c.json.name).toBe('string');
        expect(c.json.arguments).toBeTypeOf('object');
        // A call named as the plan says names one of the prompt's tools, with its required parameters.
        if (c.json.name === planned[j]) {
          const spec = TOOLS.find(([name]) => name === c.json?.name);
          expect(spec).toBeDefined();
          for (const key of spec?.[2] ?? []) expect(c.json.arguments).toHaveProperty(key);
          for (const key of Object.keys(c.json.arguments as object))
            expect(Object.keys(spec?.[1] ?? {})).toContain(key);
        }
      }
    }
    const near = (count: number, of: number, rate: number): void => {
      expect(Math.abs(count / of - rate), `${count} / ${of} vs ${rate}`).toBeLessThan(0.07);
    };
    near(withCalls, n, RATES.probability);
    near(parallel, withCalls, RATES.parallel);
    near(divergent, withCalls, RATES.divergent);
    near(malformed, withCalls, RATES.malformed);
    // The same request and rid answer the same.
    const again = await generate([prompts[0] as number[], prompts[1] as number[]], ['rates/r0', 'rates/r1']);
    expect(again.map((a) => a.ids)).toEqual(answers.slice(0, 2).map((a) => a.ids));
  });

  it("goes on with its plan after tool results, and answers in text once it is done; a dataset's rates apply", async () => {
    const n = 30;
    const prompts: number[][] = [];
    const expected: string[][] = [];
    for (let i = 0; i < n; i++) {
      const plan = agentPlan(request(i), NAMES, RATES.parallel);
      expect(plan.length).toBeGreaterThanOrEqual(2);
      const rounds = i % (plan.length + 1);
      const messages: ChatMessage[] = [{ role: 'user', content: request(i) }];
      for (const [k, round] of plan.slice(0, rounds).entries()) {
        const ids = round.map((_, j) => `call_${k}_${j}`);
        messages.push({
          role: 'assistant',
          content: '',
          tool_calls: round.map((name, j) => ({
            id: ids[j] as string,
            type: 'function' as const,
            function: { name, arguments: { path: 'src/a.py' } },
          })),
        } as ChatMessage);
        for (const id of ids)
          messages.push({ role: 'tool', content: `result of ${id}`, tool_call_id: id } as ChatMessage);
      }
      prompts.push(prompt(messages));
      expected.push(plan[rounds] ?? []);
    }
    const answers = await generate(
      prompts,
      prompts.map((_, i) => `exact/r${i}`),
    );
    for (const [i, a] of answers.entries()) {
      const names = calls(a.text).map((c) => c.json?.name);
      expect(names, `conversation ${i}`).toEqual(expected[i]);
      expect(a.ids.at(-1)).toBe(EOS);
    }
    expect(expected.some((e) => e.length === 0)).toBe(true);
    // A dataset whose probability is 0 never calls.
    const quiet = await generate(
      prompts.slice(0, 10).map(() => prompt([{ role: 'user', content: request(1) }])),
      prompts.slice(0, 10).map((_, i) => `quiet/r${i}`),
    );
    expect(quiet.every((a) => !a.text.includes('<tool_call>'))).toBe(true);
  });

  it('never calls where the prompt offers no tool', async () => {
    const prompts = Array.from({ length: 100 }, (_, i) => prompt([{ role: 'user', content: request(i) }], null));
    const answers = await generate(
      prompts,
      prompts.map((_, i) => `plain/r${i}`),
    );
    for (const a of answers) {
      expect(a.text).not.toContain('<tool_call>');
      expect(a.ids).toHaveLength(24);
      expect(a.ids.at(-1)).toBe(EOS);
    }
  });
});
