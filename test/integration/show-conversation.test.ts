/**
 * `tokenmill show` as users run it (a real CLI child process), after a real `run` of a `turns: all`
 * dataset and a single-turn dataset with two samples per prompt against the simulator over HTTP,
 * with real Redis: each turn's source messages, the source's answer, the regenerated answer (the
 * record's output ids decoded), whether its prompt was spliced or rendered, its finish reason and
 * how the conversation ended; a conversation that outgrew the context shows its reason at the turn
 * it ended on; `--json`; a prompt's samples; an unknown id or dataset is a clear error; without
 * Redis the end is unknown and the files are still shown. `status` names an example per cause.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  bundledTokenizerPath,
  loadTokenizer,
  RunKeys,
  withScripts,
  type ChatMessage,
  type ChatTokenizer,
  type ConfigInput,
  type RunStatus,
} from '../../src/shared/index.js';
import type { ConversationView } from '../../src/cli/conversation-view.js';
import { writeTestConfig } from '../helpers/config.js';
import { SOURCE_ANSWER, byConversation, writeConversations, type TurnRecord } from '../helpers/conversations.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';

const CONTEXT_LENGTH = 1000;

const { redis, tmp, sim } = useHarness({
  redis: true,
  tmp: 'tm-show-',
  cli: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 61,
    contextLength: CONTEXT_LENGTH,
    outputLength: { distribution: 'uniform', mean: 30, min: 20, max: 40 },
  },
});

let dir: string;
let cfg: string;
let tok: ChatTokenizer;
let records: TurnRecord[];
let singles: TurnRecord[];

/** A conversation of `turns` user turns of about `words` tokens each: turn 3's prompt outgrows the context. */
function longConversation(id: string, turns: number, words: number): object {
  const messages: object[] = [];
  for (let k = 1; k <= turns; k += 1) {
    messages.push({ role: 'user', content: `Question ${k}: ${Array.from({ length: words }, () => 'word').join(' ')}` });
    messages.push({ role: 'assistant', content: `source answer ${k}` });
  }
  return { id, messages };
}

async function cli(args: string[]): Promise<{ code: number | string; out: string; stdout: string }> {
  const p = spawnCli(args);
  const code = await p.exited;
  return { code, out: p.output(), stdout: p.stdout() };
}

async function ok(args: string[]): Promise<string> {
  const r = await cli(args);
  expect(r.code, r.out.slice(-4_000)).toBe(0);
  return r.stdout;
}

/** The text as `show` prints a block: every non-empty line indented by four spaces. */
function indented(text: string): string {
  return text
    .split('\n')
    .map((l) => (l === '' ? '' : `    ${l}`))
    .join('\n');
}

function config(redisUrl: string): ConfigInput {
  return {
    run: 'show',
    redis: { url: redisUrl, prefix: redis.prefix },
    sglang: { endpoints: [sim.url], concurrency: 4, contextLength: CONTEXT_LENGTH },
    datasets: [
      { name: 'c', prompts: 'c.jsonl', turns: 'all', tokenBudget: 1_000_000, maxNewTokens: 64, batchSize: 2 },
      { name: 's', prompts: 's.jsonl', samplesPerPrompt: 2, tokenBudget: 1_000_000, maxNewTokens: 64, batchSize: 4 },
    ],
    output: { dir: 'out' },
    postprocess: { keepTruncated: true },
  };
}

beforeAll(async () => {
  dir = path.join(tmp.dir, 'run');
  mkdirSync(dir, { recursive: true });
  writeConversations(dir, 'c', 2, 3, [longConversation('long', 4, 400)]);
  writePrompts(dir, 's', 3);
  cfg = writeConfig(dir, config(redis.url), 'show.yaml');
  await ok(['run', '-c', cfg]);
  tok = await loadTokenizer(bundledTokenizerPath());
  records = readGenerations(path.join(dir, 'out', 'show'), 'c') as unknown as TurnRecord[];
  singles = readGenerations(path.join(dir, 'out', 'show'), 's') as unknown as TurnRecord[];
}, 180_000);

describe('tokenmill show', () => {
  it('prints a complete conversation turn by turn: source, source answer, regenerated answer, prompt, finish reason, the end', async () => {
    const out = await ok(['show', '-c', cfg, 'c', 'c-0']);
    const turns = byConversation(records).get('c-0') ?? [];
    expect(turns.map((t) => t.turn)).toEqual([1, 2, 3]);
    expect(out).toMatch(/^c \/ c-0 · conversation of 3 turn\(s\)/);
    expect(out).toMatch(/\nend: complete: 3 of 3 turns committed\n/);
    expect(out).toContain('[system]\n    You are helper 0.');
    for (const t of turns) {
      const finish = t.finish_reason as unknown as { type: string };
      const header = new RegExp(
        `── turn ${t.turn} of 3 · c-0#t${t.turn} · prompt ${t.spliced ? 'spliced' : 'rendered'} · finish: ${finish.type}\\b[^\\n]* · ${t.prompt_ids.length} prompt \\+ ${t.output_ids.length} output tokens\\n`,
      );
      expect(out).toMatch(header);
      // The turn's section: its source question, the source's answer, then the answer regenerated.
      const section = out.slice(out.indexOf(`── turn ${t.turn} of 3`));
      expect(section).toContain(`[user]\n    Conversation 0, question ${t.turn}: tell me about topic ${t.turn}.`);
      expect(section).toContain(`source answer (never sent):\n    ${SOURCE_ANSWER} 0.${t.turn}\n`);
      expect(section).toContain(`regenerated answer:\n${indented(tok.decode(t.output_ids))}`);
    }
    // A turn's id shows its whole conversation.
    expect(await ok(['show', '-c', cfg, 'c', 'c-0#t2'])).toBe(out);
  }, 60_000);

  it('a conversation ended early shows its reason, where it ended, and the turns never generated', async () => {
    const turns = byConversation(records).get('long') ?? [];
    expect(turns.map((t) => t.turn)).toEqual([1, 2]);
    const out = await ok(['show', '-c', cfg, 'c', 'long']);
    const reason = `context: turn 3's prompt has \\d+ tokens; the context length is ${CONTEXT_LENGTH}[^\\n]*`;
    expect(out).toMatch(new RegExp(`\\nend: ended early at turn 3: ${reason}; 2 of 4 turns committed\\n`));
    expect(out).toMatch(
      new RegExp(`── turn 3 of 4 · long#t3 · not generated: the conversation ended here: ${reason}\\n`),
    );
    expect(out).toMatch(/── turn 4 of 4 · long#t4 · not generated: the conversation ended at turn 3\n/);
    expect(out).toContain(`regenerated answer:\n${indented(tok.decode(turns[1]!.output_ids))}`);
    // `status` names it as the example of its cause.
    const status = await ok(['status', '-c', cfg]);
    expect(status).toMatch(/c: ended early \(1 context\); the latest:\n {2}long at turn 3: context: /);
    expect(status).toContain('an example of each cause (tokenmill show c <id>): context: long');
    const json = JSON.parse(await ok(['status', '-c', cfg, '--json'])) as RunStatus;
    expect(json.datasets.find((d) => d.name === 'c')?.conversations).toMatchObject({
      ended: 1,
      endedBy: { context: 1 },
      endedExample: { context: 'long' },
    });
  }, 60_000);

  it('--json: one object per conversation, its turns with source, text, prompt and finish reason', async () => {
    const stdout = await ok(['show', '-c', cfg, 'c', 'c-1', '--json']);
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const v = JSON.parse(lines[0]!) as ConversationView;
    expect(v).toMatchObject({
      dataset: 'c',
      kind: 'conversation',
      id: 'c-1',
      promptId: 'c-1',
      promptFound: true,
      tools: [],
      turnCount: 3,
      end: { state: 'complete', turnsDone: 3 },
    });
    expect(v.promptFile).toBe(path.join(dir, 'c.jsonl'));
    const turns = byConversation(records).get('c-1') ?? [];
    expect(v.turns.map((t) => t.turn)).toEqual([1, 2, 3]);
    for (const [i, t] of v.turns.entries()) {
      const r = turns[i]!;
      expect(t).toMatchObject({
        id: `c-1#t${i + 1}`,
        generated: true,
        prompt: r.spliced ? 'spliced' : 'rendered',
        promptTokens: r.prompt_ids.length,
        outputTokens: r.output_ids.length,
        text: tok.decode(r.output_ids),
        sourceAnswer: { role: 'assistant', content: `${SOURCE_ANSWER} 1.${i + 1}` },
      });
      expect(t.finish?.raw).toEqual(r.finish_reason);
      expect(t.source).toEqual([
        { role: 'user', content: `Conversation 1, question ${i + 1}: tell me about topic ${7 + i + 1}.` },
      ]);
    }
    // Ended early, in JSON.
    const long = JSON.parse(await ok(['show', '-c', cfg, 'c', 'long', '--json'])) as ConversationView;
    expect(long.end).toMatchObject({ state: 'ended', turn: 3, cause: 'context', turnsDone: 2 });
    expect(long.turns.map((t) => t.generated)).toEqual([true, true, false, false]);
  }, 60_000);

  it('a single-turn prompt: its prompt and answer; a prompt id shows each sample, a sample id only that one', async () => {
    const both = await ok(['show', '-c', cfg, 's', 's-1']);
    for (const j of [1, 2]) {
      const r = singles.find((x) => x.id === `s-1#s${j}`)!;
      expect(both).toContain(`s / s-1#s${j} · prompt (one answer)`);
      expect(both).toMatch(new RegExp(`── answer · s-1#s${j} · finish: `));
      const section = both.slice(both.indexOf(`s / s-1#s${j}`));
      expect(section).toContain(
        'prompt:\n  [user]\n    Prompt 1 of s: explain the idea numbered 13 in a few sentences.',
      );
      expect(section).toContain(`regenerated answer:\n${indented(tok.decode(r.output_ids))}`);
    }
    const one = await ok(['show', '-c', cfg, 's', 's-1#s2', '--json']);
    const views = one
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as ConversationView);
    expect(views.map((v) => [v.kind, v.id, v.promptId, v.end.state])).toEqual([
      ['prompt', 's-1#s2', 's-1', 'complete'],
    ]);
  }, 60_000);

  it('an unknown id or dataset is an error that says what was looked for, and where', async () => {
    const r = await cli(['show', '-c', cfg, 'c', 'nope']);
    expect(r.code).toBe(1);
    expect(r.out).toContain(
      `tokenmill: no conversation "nope" in dataset "c": no line with id "nope" in its prompt file ${path.join(dir, 'c.jsonl')}, and no generation record of it under ${path.join(dir, 'out', 'show', 'c', 'generations')} or in Redis`,
    );
    const d = await cli(['show', '-c', cfg, 'zzz', 'c-0']);
    expect(d.code).toBe(1);
    expect(d.out).toContain('tokenmill: no dataset "zzz" in the config of run "show" (datasets: c, s)');
  }, 60_000);

  it('without Redis, the end is unknown and the turns on disk are still shown', async () => {
    // A port nothing listens on.
    const port = await new Promise<number>((resolve) => {
      const s = createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
    const offline = writeConfig(dir, config(`redis://127.0.0.1:${port}`), 'offline.yaml');
    const out = await ok(['show', '-c', offline, 'c', 'long']);
    expect(out).toMatch(/\nend: unknown \(Redis not reachable\); 2 of 4 turns found\n/);
    expect(out).toMatch(/── turn 2 of 4 · long#t2 · prompt (spliced|rendered) · finish: /);
    expect(out).toMatch(/── turn 3 of 4 · long#t3 · not generated: no record of it\n/);
  }, 60_000);

  it("a tool-calling conversation: each turn's calls as the model wrote them, the results placed after them and their origin, an end by a tool cause", async () => {
    // The records as a `turns: all` run with tools writes them (fields `tools`, `tool_results`),
    // and the end as finish-conversation-4.lua records it: the view reads only these.
    const tools = [
      {
        type: 'function',
        function: {
          name: 'get_weather',
          description: 'The weather in a city',
          parameters: { type: 'object', properties: { city: { type: 'string' } } },
        },
      },
    ];
    const call = { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } };
    const messages: ChatMessage[] = [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [call] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 18}' },
      { role: 'assistant', content: 'It is 18 °C in Paris.' },
      { role: 'user', content: 'And in Rome?' },
      { role: 'assistant', content: 'Sunny.' },
    ];
    const agentDir = path.join(tmp.dir, 'agent');
    mkdirSync(path.join(agentDir, 'out', 'agent', 'a', 'generations'), { recursive: true });
    writeFileSync(path.join(agentDir, 'a.jsonl'), `${JSON.stringify({ id: 'agent-1', tools, messages })}\n`);
    const callText = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>';
    const answerText = 'It is 18 degrees in Paris.<|im_end|>';
    const p1 = tok.encodePrompt(messages.slice(0, 1), { tools });
    const o1 = tok.encode(callText);
    const placed = [{ role: 'tool', tool_call_id: 'call_1', name: 'get_weather', content: '{"temp_c": 18}' }];
    const p2 = [
      ...p1,
      ...o1,
      ...tok.encode(
        '\n<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
      ),
    ];
    const o2 = tok.encode(answerText);
    const stop = { type: 'stop', matched: tok.tokenToId('<|im_end|>') };
    const rec = (turn: number, promptIds: number[], outputIds: number[], extra: object): string =>
      JSON.stringify({
        id: `agent-1#t${turn}`,
        dataset: 'a',
        prompt_ids: promptIds,
        output_ids: outputIds,
        prompt_tokens: promptIds.length,
        completion_tokens: outputIds.length,
        finish_reason: stop,
        ts: new Date().toISOString(),
        conversation_id: 'agent-1',
        turn,
        turns: 3,
        tools,
        ...extra,
      });
    writeFileSync(
      path.join(agentDir, 'out', 'agent', 'a', 'generations', 'part-00000.jsonl'),
      `${rec(1, p1, o1, { spliced: false })}\n${rec(2, p2, o2, { spliced: true, tool_results: { origin: 'source', messages: placed } })}\n`,
    );
    const agentCfg = writeTestConfig(
      agentDir,
      {
        run: 'agent',
        redis,
        sim,
        datasets: [{ name: 'a', prompts: 'a.jsonl', turns: 'all', tokenBudget: 1_000 }],
      },
      'agent.yaml',
    );
    const keys = new RunKeys(redis.prefix, 'agent');
    const reason = 'tool-mismatch: turn 3 called get_time; the source answered get_weather';
    await withScripts(redis.connection('client')).finishConversation(
      keys.conversations('a'),
      keys.stats('a'),
      keys.failed('a'),
      keys.done('a'),
      'agent-1',
      JSON.stringify({ id: 'agent-1', kind: 'ended', turnsDone: 2, turns: 3, turn: 3, reason, spliced: 1 }),
      'ended',
      '',
      'tool-mismatch',
    );

    const out = await ok(['show', '-c', agentCfg, 'a', 'agent-1']);
    expect(out).toContain('tools: get_weather\n');
    expect(out).toContain(`end: ended early at turn 3: ${reason}; 2 of 3 turns committed\n`);
    const turn1 = out.slice(out.indexOf('── turn 1 of 3'), out.indexOf('── turn 2 of 3'));
    expect(turn1).toContain('· prompt rendered · finish: stop (token ');
    // The call as the model wrote it, then the results placed after it, and where they came from.
    expect(turn1).toContain(`regenerated answer:\n${indented(tok.decode(o1))}\n`);
    // …and read as calls in the model's format (Qwen3's template writes `<tool_call>`: hermes).
    expect(turn1).toMatch(/ {2}tool calls \(1, read as hermes\):\n {4}get_weather \{"city": "Paris"\} · id \S+\n/);
    expect(turn1).toContain(
      'tool results placed after it (spliced from the source):\n  [tool get_weather call_1]\n    {"temp_c": 18}',
    );
    expect(turn1).toContain(`source answer (never sent):\n    call: ${JSON.stringify(call)}\n`);
    const turn2 = out.slice(out.indexOf('── turn 2 of 3'), out.indexOf('── turn 3 of 3'));
    expect(turn2).toContain('· prompt spliced · ');
    expect(turn2).toContain('source (before this turn):\n  [tool call_1]\n    {"temp_c": 18}');
    expect(turn2).not.toContain('tool results placed after it');
    expect(turn2).not.toContain('tool calls');
    expect(out).toContain(`── turn 3 of 3 · agent-1#t3 · not generated: the conversation ended here: ${reason}\n`);
    const v = JSON.parse(await ok(['show', '-c', agentCfg, 'a', 'agent-1', '--json'])) as ConversationView;
    expect(v.tools).toEqual(['get_weather']);
    expect(v.toolCallFormat).toBe('hermes');
    expect(v.turns[0]?.toolCalls).toMatchObject([
      { type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } },
    ]);
    expect(v.turns[1]?.toolCalls).toBeUndefined();
    expect(v.turns[0]?.toolResults).toEqual({ origin: 'source', messages: placed });
    expect(v.turns[0]?.sourceAnswer).toMatchObject({ role: 'assistant', tool_calls: [call] });
    expect(v.end).toMatchObject({ state: 'ended', cause: 'tool-mismatch', turn: 3 });
    // `status` names it as its cause's example.
    const status = JSON.parse(await ok(['status', '-c', agentCfg, '--json'])) as RunStatus;
    expect(status.datasets[0]?.conversations).toMatchObject({
      endedBy: { 'tool-mismatch': 1 },
      endedExample: { 'tool-mismatch': 'agent-1' },
    });
  }, 60_000);
});
