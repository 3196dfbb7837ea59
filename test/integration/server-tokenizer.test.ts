// Server-side tokenization (`tokenizer.kind: server`) against the simulator serving a Kimi-like
// tiktoken tokenizer (test/fixtures/tokenizers/kimi-like): the chat template is rendered here and
// the ids come from the server's /tokenize, in batches; the start-up probe accepts the matching
// server and refuses one whose template or special tokens differ, naming the endpoint and the
// first differing position; transient failures are retried, persistent ones fail clearly; the
// post-processing format is fetched once; conversation datasets are refused; and `tokenmill run`
// produces the ids a local tokenizer would.
import { cp, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { ConfigError, UnavailableError } from '../../src/shared/errors.js';
import { readDatasetMeta } from '../../src/shared/hf-dataset/reader.js';
import { checkTokenizerKindFits, loadTokenizer } from '../../src/shared/tokenizer/load.js';
import { ServerTokenizeClient } from '../../src/shared/tokenizer/server-client.js';
import type { ChatMessage, ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { type SimulatorHandle } from '../../src/sim/index.js';
import { checkServerTokenizer } from '../../src/cli/tokenizer-check.js';
import { createTokenizeContext, recordToRow } from '../../src/workers/postprocess/tokenize.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, writePrompts } from '../helpers/pipeline.js';
import { makeKimiLikeTokenizer } from '../helpers/tiktoken-fixture.js';
import {
  byConversation,
  expectTurnChains,
  readConversationFile,
  writeConversations,
  type TurnRecord,
} from '../helpers/conversations.js';

const MODEL = 'moonshotai/Kimi-K2.5';

const { redis, tmp, startSim } = useHarness({ redis: true, tmp: 'tokenmill-server-tok-', cli: true });
let kimiDir: string;
let local: ChatTokenizer;
let remote: ChatTokenizer;
let sim: SimulatorHandle;
let otherTemplateSim: SimulatorHandle;
let qwenSim: SimulatorHandle;

beforeAll(async () => {
  kimiDir = await makeKimiLikeTokenizer(path.join(tmp.dir, 'Kimi-K2.5'));
  // The same tokenizer with a template that writes the system turn differently.
  const otherDir = path.join(tmp.dir, 'Kimi-other-template');
  await cp(kimiDir, otherDir, { recursive: true });
  const cfgFile = path.join(otherDir, 'tokenizer_config.json');
  const cfg = JSON.parse(await readFile(cfgFile, 'utf8')) as { chat_template: string };
  cfg.chat_template = cfg.chat_template.replace(
    '<|im_system|>system<|im_middle|>\n',
    '<|im_system|>System<|im_middle|>\n',
  );
  await writeFile(cfgFile, JSON.stringify(cfg));
  const simOptions = {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 5,
    outputLength: { distribution: 'fixed' as const, mean: 12 },
  };
  [sim, otherTemplateSim, qwenSim] = await Promise.all([
    startSim({ ...simOptions, modelPath: MODEL, tokenizerPath: kimiDir }),
    startSim({ ...simOptions, modelPath: MODEL, tokenizerPath: otherDir }),
    startSim(simOptions),
  ]);
  local = await loadTokenizer(kimiDir);
  remote = await loadTokenizer(kimiDir, { kind: 'server', server: { endpoints: [sim.url] } });
}, 120_000);

const conversations = (n: number): ChatMessage[][] =>
  Array.from({ length: n }, (_, i) => [
    ...(i % 3 === 0 ? [{ role: 'system' as const, content: `System ${i}` }] : []),
    { role: 'user' as const, content: `Question ${i}: 你好 🙂 café ${i * 7}` },
  ]);

describe('server-side tokenization', () => {
  it('loads from tokenizer_config.json alone: added tokens, EOS and end-of-turn ids, no local encoder', () => {
    expect(remote.encoderKind).toBe('server');
    expect(remote.eosTokenId).toBe(local.eosTokenId);
    expect(remote.endOfTurnTokenIds).toEqual(local.endOfTurnTokenIds);
    expect(remote.tokenBytes(5)).toBeUndefined();
    expect(() => remote.encode('not asked of the server yet')).toThrow(/tokenizer\.kind server/);
  });

  it('tokenizes many prompts on the server in batched requests, as the local tokenizer would', async () => {
    const client = remote.serverClient;
    if (client === undefined) throw new Error('no server client');
    let requests = 0;
    const tokenize = client.tokenize.bind(client);
    client.tokenize = (texts, only) => {
      requests += 1;
      return tokenize(texts, only);
    };
    const convs = conversations(200);
    try {
      const ids = await remote.encodePrompts([...convs, []]);
      expect(ids.slice(0, 200)).toEqual(convs.map((c) => local.encodePrompt(c)));
      // A conversation the template rejects is that entry's error, not the call's.
      expect(ids[200]).toBeInstanceOf(Error);
    } finally {
      client.tokenize = tokenize;
    }
    expect(requests).toBe(Math.ceil(200 / 64));
  });

  it('fetches the few ids post-processing needs once, and makes the rows a local tokenizer makes', async () => {
    const ctx = await remote.withServerTokens(() => createTokenizeContext(remote));
    const localCtx = createTokenizeContext(local);
    expect(ctx.format).toEqual(localCtx.format);
    const prompt = local.encodePrompt([{ role: 'user', content: 'Hi' }]);
    const record = {
      id: 'r',
      prompt_ids: prompt,
      output_ids: [...local.encode('Hello!'), ctx.format.endOfTurnTokenId],
      finish_reason: { type: 'stop' as const, matched: 0 },
    };
    expect(recordToRow(record, ctx, 'B1')).toEqual(recordToRow(record, localCtx, 'B1'));
  });

  it("the simulator's /tokenize {messages} applies the template, with the generation prompt unless told not to", async () => {
    const client = new ServerTokenizeClient({ endpoints: [sim.url] });
    const messages: ChatMessage[] = [
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello' },
    ];
    const tools = [{ type: 'function', function: { name: 'f' } }];
    const withPrompt = (await client.post(sim.url, '/tokenize', { messages, tools })) as { tokens: number[] };
    expect(withPrompt.tokens).toEqual(local.encodePrompt(messages, { tools }));
    const without = (await client.post(sim.url, '/tokenize', { messages, add_generation_prompt: false })) as {
      tokens: number[];
    };
    expect(without.tokens).toEqual(local.encode(local.applyChatTemplate(messages, { addGenerationPrompt: false })));
    expect(without.tokens.length).toBeLessThan(local.encodePrompt(messages).length);
  });

  it('the start-up probe accepts the server of the same tokenizer and template', async () => {
    const client = remote.serverClient;
    if (client === undefined) throw new Error('no server client');
    await expect(checkServerTokenizer(remote, client, sim.url)).resolves.toBeUndefined();
  });

  it('the probe refuses a server whose chat template differs, naming the endpoint and the first differing token', async () => {
    const client = new ServerTokenizeClient({ endpoints: [otherTemplateSim.url] });
    await expect(checkServerTokenizer(remote, client, otherTemplateSim.url)).rejects.toThrow(
      new RegExp(
        `renders a probe conversation differently from ${otherTemplateSim.url}'s own: .*differ from token \\d+ on`,
      ),
    );
  });

  it("the probe refuses a server whose special tokens are not the folder's", async () => {
    const client = new ServerTokenizeClient({ endpoints: [qwenSim.url] });
    await expect(checkServerTokenizer(remote, client, qwenSim.url)).rejects.toThrow(
      new RegExp(`${qwenSim.url}/tokenize gives the special token ".*" as \\[.*\\], not its id \\d+`),
    );
  });

  it('retries a failing endpoint on the next one, and fails clearly when every attempt fails', async () => {
    const dead = 'http://127.0.0.1:9'; // discard port: connection refused
    const flaky = new ServerTokenizeClient({ endpoints: [dead, sim.url], backoffMs: 5 });
    expect(await flaky.tokenize(['Hello'])).toEqual([local.encode('Hello')]);
    const down = new ServerTokenizeClient({ endpoints: [dead], attempts: 2, backoffMs: 5 });
    const err = await down.tokenize(['Hello']).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnavailableError);
    expect(String(err)).toMatch(/\/tokenize failed 2 times on http:\/\/127\.0\.0\.1:9/);
  });

  it('refuses conversation datasets, saying to use a local tokenizer', () => {
    const config = {
      tokenizer: { kind: 'server' as const },
      datasets: [{ name: 'p' }, { name: 'conv', conversations: '/x.jsonl' }],
    };
    expect(() => checkTokenizerKindFits(config)).toThrow(ConfigError);
    expect(() => checkTokenizerKindFits(config)).toThrow(
      /datasets\[1\]\.conversations: dataset "conv" .*tokenizer\.kind huggingface .* or tiktoken/,
    );
    expect(() => checkTokenizerKindFits({ ...config, tokenizer: { kind: 'tiktoken' as const } })).not.toThrow();
  });

  it("`turns: all` with tokenizer.kind server: every later turn rendered with the server's ids, as the local tokenizer would", async () => {
    const run = 'server-turns';
    const file = writeConversations(tmp.dir, run, 3, 3);
    const c: TestConfigSpec = {
      run,
      redis,
      sim,
      sglang: { concurrency: 4, requestTimeoutMs: 30_000 },
      tokenizer: { path: kimiDir, kind: 'server' },
      datasets: [
        { name: 'ds', prompts: `${run}.jsonl`, turns: 'all', tokenBudget: 1_000_000, maxNewTokens: 32, batchSize: 2 },
      ],
      postprocess: { keepTruncated: true },
    };
    const p = spawnCli(['run', '-c', writeTestConfig(tmp.dir, c, `${run}.yaml`)]);
    expect(await p.exited, p.output().slice(-3_000)).toBe(0);
    const records = readGenerations(path.join(tmp.dir, 'out', run), 'ds') as unknown as TurnRecord[];
    // Before, turn 2 of every conversation threw for the ids the server had not given yet.
    expect(records).toHaveLength(9);
    expectTurnChains(local, readConversationFile(file), byConversation(records), { complete: true });
  }, 90_000);

  it('`tokenmill run` with tokenizer.kind server sends the ids the local tokenizer makes', async () => {
    const run = 'server-kind';
    writePrompts(tmp.dir, run, 6);
    const c: TestConfigSpec = {
      run,
      redis,
      sim,
      sglang: { concurrency: 4, requestTimeoutMs: 30_000 },
      tokenizer: { path: kimiDir, kind: 'server' },
      dataset: { tokenBudget: 1_000_000, maxNewTokens: 32, batchSize: 2 },
    };
    const p = spawnCli(['run', '-c', writeTestConfig(tmp.dir, c, `${run}.yaml`)]);
    const code = await p.exited;
    expect(code, p.output()).toBe(0);
    const records = readGenerations(path.join(tmp.dir, 'out', run), 'ds');
    expect(records).toHaveLength(6);
    const prompts = (await readFile(path.join(tmp.dir, `${run}.jsonl`), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; prompt: string });
    for (const r of records) {
      const prompt = prompts.find((x) => x.id === r.id)?.prompt ?? '';
      expect(r.prompt_ids).toEqual(local.encodePrompt([{ role: 'user', content: prompt }]));
    }
    // Post-processing ran with the server's ids too: the training dataset was written.
    const meta = await readDatasetMeta(path.join(tmp.dir, 'out', run, 'train-dataset'));
    expect(meta.shards.length).toBeGreaterThan(0);
  }, 90_000);
});
