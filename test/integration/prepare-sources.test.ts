// `prepare` over real JSONL sources: the prompt files it writes, their ids, dedupe, the length
// filter with the bundled Qwen3 tokenizer, limit/shuffle, idempotence and the report.
import { readFileSync, statSync, writeFileSync, utimesSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  contentSampleId,
  loadConfig,
  loadConfiguredTokenizer,
  readPromptFile,
  type ChatTokenizer,
  type Config,
  type ConfigInput,
  type PromptLine,
} from '../../src/shared/index.js';
import { prepareSources, type DatasetPrepareOutcome } from '../../src/producers/prepare/prepare.js';
import type { PrepareReport } from '../../src/producers/prepare/prepare-report.js';
import { useHarness } from '../helpers/fixture.js';

const { tmp } = useHarness({ tmp: 'tm-prepare-' });
let tokenizer: ChatTokenizer;

beforeAll(async () => {
  tokenizer = await loadConfiguredTokenizer(
    loadConfig({ object: { datasets: [{ name: 'x', prompts: 'x.jsonl', tokenBudget: 1 }] }, baseDir: tmp.dir }),
  );
});

function writeJsonl(name: string, rows: readonly (object | string)[]): string {
  const file = path.join(tmp.dir, name);
  writeFileSync(file, `${rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n')}\n`);
  return file;
}

function config(run: string, datasets: ConfigInput['datasets'], prepare: ConfigInput['prepare'] = {}): Config {
  return loadConfig({ object: { run, datasets, prepare, output: { dir: 'out' } }, baseDir: tmp.dir });
}

async function promptsOf(file: string): Promise<{ id: string; messages: { role: string; content: string }[] }[]> {
  const out = [];
  for await (const p of readPromptFile(file) as AsyncIterable<PromptLine>) {
    if (!p.ok) throw new Error(`the prompt file reader rejects ${file}:${p.reject.line}: ${p.reject.reason}`);
    out.push({ id: p.record.id, messages: p.record.messages });
  }
  return out;
}

function reportOf(o: DatasetPrepareOutcome): PrepareReport {
  return JSON.parse(readFileSync(o.report, 'utf8')) as PrepareReport;
}

const conv = (id: string | undefined, ...turns: [string, string][]) => ({
  ...(id === undefined ? {} : { id }),
  conversations: turns.map(([from, value]) => ({ from, value })),
});

describe('prepare', () => {
  it('writes prompts that end with a user turn, with stable, unique ids, and reports what it dropped with file and line', async () => {
    const src = writeJsonl('chat.jsonl', [
      conv(
        'a',
        ['system', 'be kind'],
        ['human', 'first question'],
        ['gpt', 'first answer'],
        ['human', 'second question'],
        ['gpt', 'second answer'],
      ),
      conv(undefined, ['human', 'no id here'], ['gpt', 'answer']),
      conv('b', ['human', 'first question']),
      conv('a', ['human', 'other content, same id']),
      conv('c', ['gpt', 'an answer with no question']),
      '{"id": "d", "conversations": [ {"from": "human", "value": "cut off',
      conv('e', ['human', 'first question'], ['gpt', 'a different answer, same prompt']),
    ]);
    const cfg = config('shape', [{ name: 'chat', source: { path: src }, tokenBudget: 1000 }]);
    const [o] = await prepareSources({ config: cfg, tokenizer });
    expect(o?.outcome).toBe('prepared');
    const prompts = await promptsOf(o?.prompts ?? '');
    expect(prompts.map((p) => p.id)).toEqual([
      'a',
      contentSampleId([{ role: 'user', content: 'no id here' }]),
      'b',
      'a~2',
    ]);
    expect(prompts[0]?.messages).toEqual([
      { role: 'system', content: 'be kind' },
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: 'first answer' },
      { role: 'user', content: 'second question' },
    ]);
    expect(prompts[1]?.id).toMatch(/^h:[0-9a-f]{16}$/);
    const report = reportOf(o as DatasetPrepareOutcome);
    expect(report.counts).toMatchObject({
      rowsRead: 7,
      kept: 4,
      duplicates: 1,
      empty: 1,
      malformed: 1,
      idsRenamed: 1,
      tooLong: 0,
    });
    expect(report.examples.malformed?.[0]).toMatchObject({ file: src, row: 5, line: 6 });
    expect(report.examples.empty?.[0]).toMatchObject({ file: src, row: 4, line: 5, id: 'c' });
    expect(report.examples.duplicates?.[0]).toMatchObject({ line: 7, id: 'e' });
    expect(report.examples.idsRenamed?.[0]).toMatchObject({ line: 4, id: 'a~2' });
  });

  it('drops prompts over maxPromptTokens as counted by the target tokenizer and chat template; the source setting wins', async () => {
    const rows = Array.from({ length: 12 }, (_, i) => ({
      id: `p${i}`,
      messages: [{ role: 'user', content: 'word '.repeat(i * 10) + `number ${i}` }],
    }));
    const src = writeJsonl('lengths.jsonl', rows);
    const lengths = rows.map((r) => tokenizer.encodePrompt(r.messages as never).length);
    const limit = lengths[6] ?? 0;
    const cfg = config('len', [{ name: 'len', source: { path: src, maxPromptTokens: limit }, tokenBudget: 1000 }], {
      maxPromptTokens: 1,
    });
    const [o] = await prepareSources({ config: cfg, tokenizer });
    const kept = (await promptsOf(o?.prompts ?? '')).map((p) => p.id);
    expect(kept).toEqual(rows.filter((_, i) => (lengths[i] ?? 0) <= limit).map((r) => r.id));
    expect(kept).toContain('p6');
    expect(kept).not.toContain('p7');
    const report = reportOf(o as DatasetPrepareOutcome);
    expect(report.counts.tooLong).toBe(5);
    expect(report.examples.tooLong?.[0]?.reason).toBe(`${lengths[7]} prompt tokens > maxPromptTokens ${limit}`);
  });

  it('dedupes across datasets with prepare.dedupeAcross: the first dataset in config order keeps a prompt', async () => {
    const one = writeJsonl('one.jsonl', [conv('1', ['human', 'shared']), conv('2', ['human', 'only in one'])]);
    const two = writeJsonl('two.jsonl', [
      conv('x', ['human', 'only in two']),
      conv('y', ['human', 'shared'], ['gpt', 'whatever']),
    ]);
    const datasets = [
      { name: 'one', source: { path: one }, tokenBudget: 10 },
      { name: 'two', source: { path: two }, tokenBudget: 10 },
    ];
    const within = await prepareSources({ config: config('within', datasets), tokenizer });
    expect((await promptsOf(within[1]?.prompts ?? '')).map((p) => p.id)).toEqual(['x', 'y']);
    const across = await prepareSources({ config: config('across', datasets, { dedupeAcross: true }), tokenizer });
    expect((await promptsOf(across[0]?.prompts ?? '')).map((p) => p.id)).toEqual(['1', '2']);
    expect((await promptsOf(across[1]?.prompts ?? '')).map((p) => p.id)).toEqual(['x']);
    expect(across[1]?.counts.duplicatesAcross).toBe(1);
    expect(reportOf(across[1] as DatasetPrepareOutcome).examples.duplicatesAcross?.[0]?.reason).toMatch(
      /dataset "one"/,
    );

    // Only the second source changes: the first is kept as it was and still dedupes the second.
    writeJsonl('two.jsonl', [
      conv('x', ['human', 'only in two']),
      conv('y', ['human', 'shared']),
      conv('z', ['human', 'new']),
    ]);
    const again = await prepareSources({ config: config('across', datasets, { dedupeAcross: true }), tokenizer });
    expect(again.map((o) => o.outcome)).toEqual(['unchanged', 'prepared']);
    expect((await promptsOf(again[1]?.prompts ?? '')).map((p) => p.id)).toEqual(['x', 'z']);
  });

  it('with shuffle and limit, dedupeAcross drops only the prompts an earlier dataset kept, not those it left out', async () => {
    const rows = Array.from({ length: 40 }, (_, i) => conv(`s${i}`, ['human', `shared question ${i}`]));
    const one = writeJsonl('sub-one.jsonl', rows);
    const two = writeJsonl(
      'sub-two.jsonl',
      rows.map((r, i) => ({ ...r, id: `t${i}` })),
    );
    const [a, b] = await prepareSources({
      config: config(
        'sub',
        [
          { name: 'one', source: { path: one, limit: 10, shuffle: { seed: 3 } }, tokenBudget: 10 },
          { name: 'two', source: { path: two }, tokenBudget: 10 },
        ],
        { dedupeAcross: true },
      ),
      tokenizer,
    });
    const keptByOne = new Set((await promptsOf(a?.prompts ?? '')).map((p) => p.messages[0]?.content));
    const keptByTwo = (await promptsOf(b?.prompts ?? '')).map((p) => p.messages[0]?.content);
    expect(keptByOne.size).toBe(10);
    expect(keptByTwo).toHaveLength(30);
    expect(keptByTwo.filter((c) => keptByOne.has(c))).toEqual([]);
    expect(b?.counts.duplicatesAcross).toBe(10);
  });

  it('a source that cannot be opened, or that is its own prompt file, names the dataset and its config path', async () => {
    await expect(
      prepareSources({
        config: config('missing', [{ name: 'gone', source: { path: 'nope.jsonl' }, tokenBudget: 10 }]),
        tokenizer,
      }),
    ).rejects.toThrow(/dataset "gone" \(datasets\[0\]\.source\): .*nope\.jsonl/);
    const src = writeJsonl('self.jsonl', [conv('1', ['human', 'q'])]);
    const before = readFileSync(src);
    await expect(
      prepareSources({
        config: config('self', [{ name: 'self', source: { path: src }, prompts: src, tokenBudget: 10 }]),
        tokenizer,
      }),
    ).rejects.toThrow(/dataset "self" \(datasets\[0\]\.source\): the source .* is also the dataset's prompt file/);
    expect(readFileSync(src).equals(before)).toBe(true);
  });

  it('limit keeps the first prompts; with shuffle a reproducible subset in rank order', async () => {
    const rows = Array.from({ length: 300 }, (_, i) => conv(`r${i}`, ['human', `question ${i}`]));
    const src = writeJsonl('many.jsonl', rows);
    const first = await prepareSources({
      config: config('lim', [{ name: 'm', source: { path: src, limit: 10 }, tokenBudget: 10 }]),
      tokenizer,
    });
    expect((await promptsOf(first[0]?.prompts ?? '')).map((p) => p.id)).toEqual(rows.slice(0, 10).map((r) => r.id));
    expect(first[0]?.counts.rowsRead).toBe(10);

    const shuffled = async (run: string, seed: number, file = src): Promise<string[]> => {
      const [o] = await prepareSources({
        config: config(run, [{ name: 'm', source: { path: file, limit: 25, shuffle: { seed } }, tokenBudget: 10 }]),
        tokenizer,
      });
      expect(o?.counts).toMatchObject({ kept: 25, overLimit: 275, rowsRead: 300 });
      return (await promptsOf(o?.prompts ?? '')).map((p) => p.id);
    };
    const a = await shuffled('s1', 7);
    const b = await shuffled('s2', 7);
    const c = await shuffled('s3', 8);
    expect(b).toEqual(a);
    expect(c).not.toEqual(a);
    expect(a).not.toEqual(rows.slice(0, 25).map((r) => r.id));
    // The subset does not depend on the order the rows come in.
    const reversed = writeJsonl('many-reversed.jsonl', [...rows].reverse());
    expect(await shuffled('s4', 7, reversed)).toEqual(a);
  });

  it('is idempotent: unchanged sources keep the file; a rewrite is byte-identical; a changed source gives a new file', async () => {
    const src = writeJsonl('idem.jsonl', [conv('1', ['human', 'q1']), conv('2', ['human', 'q2'], ['gpt', 'a2'])]);
    const cfg = () => config('idem', [{ name: 'i', source: { path: src, maxPromptTokens: 100 }, tokenBudget: 10 }]);
    const [first] = await prepareSources({ config: cfg(), tokenizer });
    const file = first?.prompts ?? '';
    const bytes = readFileSync(file);
    const st = statSync(file);
    const [second] = await prepareSources({ config: cfg(), tokenizer });
    expect(second?.outcome).toBe('unchanged');
    expect(statSync(file).mtimeMs).toBe(st.mtimeMs);
    expect(second?.counts).toEqual(first?.counts);

    // Touched, not changed: prepared again, the same bytes.
    const later = new Date(Date.now() + 5_000);
    utimesSync(src, later, later);
    const [third] = await prepareSources({ config: cfg(), tokenizer });
    expect(third?.outcome).toBe('prepared');
    expect(readFileSync(file).equals(bytes)).toBe(true);
    expect(third?.promptsSha256).toBe(first?.promptsSha256);

    writeJsonl('idem.jsonl', [conv('1', ['human', 'q1 changed']), conv('2', ['human', 'q2'])]);
    const [fourth] = await prepareSources({ config: cfg(), tokenizer });
    expect(fourth?.outcome).toBe('prepared');
    expect(fourth?.promptsSha256).not.toBe(first?.promptsSha256);
    expect((await promptsOf(file))[0]?.messages[0]?.content).toBe('q1 changed');
  });
});
