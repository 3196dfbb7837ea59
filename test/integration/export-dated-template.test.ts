/**
 * A chat template that writes the date (`strftime_now`, as Llama 3.2's `Today Date: 26 Jul 2024`
 * line does) rendered the prompt on the day it was generated. `export --format specforge`, run
 * on another day, renders each record's prompt again to check it against the record's
 * `prompt_ids`: it must render the day of the generation (the record's `ts`), so the records are
 * exported, while a prompt line edited since generation is still refused.
 *
 * The fixture is the bundled Qwen3 tokenizer with a template that opens with a dated system
 * line; the records' prompt ids are encoded from the same template with that day's date written
 * out, so they do not depend on how tokenmill renders `strftime_now`.
 */
import { cp, readFile, writeFile } from 'node:fs/promises';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { bundledTokenizerPath, loadTokenizer, type ChatMessage } from '../../src/shared/index.js';
import type { SpecForgeRunResult } from '../../src/cli/export/specforge-run.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, writeConfig } from '../helpers/pipeline.js';

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-dated-', cli: true });

/** Qwen3's turn format after a dated system line; `DATE` is where the date goes. */
const TEMPLATE = (date: string): string =>
  `{{- '<|im_start|>system\\nToday Date: ' + ${date} + '<|im_end|>\\n' }}` +
  "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/** When the records were generated: another day than today, whenever the test runs. */
const GENERATED_AT = '2025-07-26T12:00:00.000Z';
const GENERATED_DAY = '2025-07-26';

async function tokenizerFolder(dir: string, template: string): Promise<string> {
  await cp(bundledTokenizerPath(), dir, { recursive: true, dereference: true });
  const file = path.join(dir, 'tokenizer_config.json');
  const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
  await writeFile(file, JSON.stringify({ ...config, chat_template: template }));
  return dir;
}

describe('export with a chat template that writes the date', () => {
  let configPath: string;

  beforeAll(async () => {
    const dated = await tokenizerFolder(path.join(tmp.dir, 'tok-dated'), TEMPLATE("strftime_now('%Y-%m-%d')"));
    // The same template with the generation day written out: what rendered the records' prompts.
    const thatDay = await loadTokenizer(
      await tokenizerFolder(path.join(tmp.dir, 'tok-that-day'), TEMPLATE(`'${GENERATED_DAY}'`)),
    );
    const eot = thatDay.tokenToId('<|im_end|>') as number;
    const prompts: { id: string; messages: ChatMessage[] }[] = [
      { id: 'a', messages: [{ role: 'user', content: 'What day is it?' }] },
      { id: 'b', messages: [{ role: 'user', content: 'Name a colour.' }] },
      { id: 'edited', messages: [{ role: 'user', content: 'Name a fruit.' }] },
    ];
    const record = (id: string, messages: ChatMessage[], extra: Record<string, unknown> = {}): string => {
      const promptIds = thatDay.encodePrompt(messages);
      const outputIds = [...thatDay.encode('An answer.'), eot];
      return JSON.stringify({
        id,
        dataset: extra.conversation_id === undefined ? 'single' : 'turns',
        prompt_ids: promptIds,
        output_ids: outputIds,
        prompt_tokens: promptIds.length,
        completion_tokens: outputIds.length,
        finish_reason: { type: 'stop', matched: eot },
        endpoint: 'http://127.0.0.1:1',
        worker: 'w',
        attempt: 1,
        ts: GENERATED_AT,
        ...extra,
      });
    };
    const runDir = path.join(tmp.dir, 'out', 'dated');
    for (const ds of ['single', 'turns']) mkdirSync(path.join(runDir, ds, 'generations'), { recursive: true });
    writeFileSync(
      path.join(runDir, 'single', 'generations', 'part-0.jsonl'),
      `${prompts.map((p) => record(p.id, p.messages)).join('\n')}\n`,
    );
    // A conversation regenerated turn by turn (one turn): its turn 1 prompt is checked the same way.
    const conv: ChatMessage[] = [{ role: 'user', content: 'Tell me a joke.' }];
    writeFileSync(
      path.join(runDir, 'turns', 'generations', 'part-0.jsonl'),
      `${record('talk#t1', conv, { conversation_id: 'talk', turn: 1, turns: 1, spliced: false, history_outputs: [] })}\n`,
    );
    // The prompt files as they are now: one line edited since its generation.
    const edited = prompts.map((p) =>
      p.id === 'edited' ? { ...p, messages: [{ role: 'user', content: 'Name a vegetable.' }] } : p,
    );
    writeFileSync(path.join(tmp.dir, 'single.jsonl'), `${edited.map((p) => JSON.stringify(p)).join('\n')}\n`);
    writeFileSync(path.join(tmp.dir, 'turns.jsonl'), `${JSON.stringify({ id: 'talk', messages: conv })}\n`);
    configPath = writeConfig(tmp.dir, {
      run: 'dated',
      redis: { url: redis.url, prefix: redis.prefix },
      sglang: { endpoints: ['http://127.0.0.1:9'] },
      tokenizer: { path: dated },
      datasets: [
        { name: 'single', prompts: 'single.jsonl', tokenBudget: 1000 },
        { name: 'turns', prompts: 'turns.jsonl', turns: 'all', tokenBudget: 1000 },
      ],
      output: { dir: 'out' },
    });
  });

  it('renders strftime_now as the day of the generation, and still refuses an edited prompt', async () => {
    const out = path.join(tmp.dir, 'export', 'sf.jsonl');
    const sf = spawnCli(['export', '-c', configPath, '--format', 'specforge', '--out', out, '--json']);
    expect(await sf.exited, sf.output()).toBe(0);
    const result = JSON.parse(
      sf
        .stdout()
        .split('\n')
        .find((l) => l.startsWith('{"format"')) ?? 'null',
    ) as SpecForgeRunResult;
    const single = result.datasets.find((d) => d.dataset === 'single');
    const turns = result.datasets.find((d) => d.dataset === 'turns');
    expect(single, sf.output()).toMatchObject({ lines: 3, exported: 2, promptChanged: 1, promptMissing: 0 });
    expect(single?.examples.join('\n')).toContain('sample edited: its prompt line in');
    expect(turns, sf.output()).toMatchObject({ lines: 1, exported: 1, promptChanged: 0 });
    const read = async (file: string): Promise<{ id: string; text: string }[]> =>
      (await readFile(file, 'utf8'))
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as { id: string; text: string });
    const lines = [...(await read(out)), ...(await read(path.join(tmp.dir, 'export', 'sf.all-turns.jsonl')))];
    expect(lines.map((l) => l.id).sort()).toEqual(['a', 'b', 'talk']);
    for (const l of lines) expect(l.text, l.id).toContain(`Today Date: ${GENERATED_DAY}<|im_end|>`);
  }, 60_000);
});
