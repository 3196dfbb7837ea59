// `tokenmill export` as users run it, checked against Python: generation records for a seeded
// corpus of 400 varied prompts (system prompts, multi-turn history, long and unicode text, three
// prompt-file shapes) are post-processed into the training dataset, exported as SpecForge
// conversation JSONL and as token-row JSONL, and Python transformers re-derives each row from
// the exported conversation (apply_chat_template + SpecForge's mask rule, test/python/
// export_parity.py). The records are what a model writes after the generation prompt: the
// encoded answer (with its <think> block) and <|im_end|>; a few are what a model sometimes
// does instead (no <think> block, stopping on <|endoftext|>, a non-canonical token split), and
// each such row must come out as the one explained difference it is. Each line's `text` must be
// its row's tokens, and the export must count exactly the rows whose text encodes to other ids. Truncated, aborted and empty generations and a repeated
// record must be left out, as tokenize leaves them out.
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it, vi } from 'vitest';

import {
  bundledTokenizerPath,
  loadTokenizer,
  parsePromptLine,
  type ChatMessage,
  type ChatTokenizer,
} from '../../src/shared/index.js';
import { generationCorpus, Rng } from '../fixtures/conversations/corpus.js';
import { REASONING } from '../fixtures/conversations/fragments.js';
import { exportSpecForgeDataset } from '../../src/cli/export/specforge.js';
import { SpecForgeOutput } from '../../src/cli/export/specforge-files.js';
import type { SpecForgeRunResult } from '../../src/cli/export/specforge-run.js';
import { createTokenizeContext } from '../../src/workers/postprocess/tokenize.js';
import { buildProgram } from '../../src/cli/main.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, writeConfig } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';

const PROMPTS = 400;
const DATASET = 'B1';

interface PyResult {
  id: string;
  dataset: string;
  prompt_tokens?: number;
  prompt_has_assistant?: boolean;
  input_ids_equal?: boolean;
  mask_equal_after_prompt?: boolean;
  kind: 'identical' | 'empty-think' | 'stop-without-end-of-turn' | 'non-canonical' | 'unexplained' | 'no-row';
  detail: string;
  /** The line's `text` is the row's ids decoded (special tokens kept). */
  text_is_row?: boolean;
  /** Encoding the line's `text` gives the row's ids. */
  text_reencodes?: boolean;
}

interface PyReport {
  versions: Record<string, string>;
  target_rows: number;
  jsonl_rows: number;
  jsonl_equal: number;
  results: PyResult[];
}

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-export-', cli: true });

/** Runs `tokenmill <args>` in this process; resolves to what it printed, rejects with its error. */
async function inProcess(args: string[]): Promise<string> {
  let out = '';
  const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    out += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    return true;
  });
  try {
    await buildProgram().parseAsync(['node', 'tokenmill', ...args]);
  } finally {
    spy.mockRestore();
  }
  return out;
}

async function cli(args: string[]): Promise<{ code: number | string; out: string }> {
  const p = spawnCli(args);
  const code = await p.exited;
  return { code, out: p.output() };
}

/** A prompt-file line for `messages` in one of the three shapes the producer reads. */
function promptLine(i: number, messages: ChatMessage[]): Record<string, unknown> {
  const id = i % 11 === 0 ? i : `p-${i}`;
  if (messages.length === 1 && messages[0]?.role === 'user' && i % 3 === 0) return { id, prompt: messages[0].content };
  if (i % 5 === 1)
    return {
      id,
      conversations: messages.map((m) => ({
        from: m.role === 'user' ? 'human' : m.role === 'assistant' ? 'gpt' : m.role,
        value: m.content,
      })),
    };
  return { id, messages };
}

interface Built {
  /** Sample ids whose row should differ from the rendering, by the kind of difference. */
  expected: Map<string, PyResult['kind']>;
  /** Sample ids that must not be exported. */
  leftOut: Set<string>;
}

/** Writes the prompt file and one generations file the way the producer and the sink do. */
function buildRun(tok: ChatTokenizer, promptsFile: string, generationsDir: string): Built {
  const rng = new Rng(4_242);
  const cases = generationCorpus(PROMPTS, { thinking: false }, 31_337);
  const imEnd = tok.tokenToId('<|im_end|>');
  const endOfText = tok.tokenToId('<|endoftext|>');
  if (imEnd === undefined || endOfText === undefined) throw new Error('not the Qwen3 tokenizer');
  const reasoning = REASONING.filter((r) => r !== '' && !/^\n|\n$/.test(r));
  const promptLines: string[] = [];
  const records: string[] = [];
  const expected = new Map<string, PyResult['kind']>();
  const leftOut = new Set<string>();
  cases.forEach((c, i) => {
    const raw = promptLine(i, c.messages);
    const text = JSON.stringify(raw);
    promptLines.push(text);
    const parsed = parsePromptLine(text, promptsFile, i + 1);
    if (!parsed.ok) throw new Error(`corpus prompt ${i} rejected: ${parsed.reject.reason}`);
    const { id, messages } = parsed.record;
    const promptIds = tok.encodePrompt(messages);
    let answer = `<think>\n${rng.pick(reasoning)}\n</think>\n\n${c.answer}`;
    let outputIds: number[];
    let finish: Record<string, unknown> = { type: 'stop', matched: imEnd };
    // About 1 % of the rows: what a model sometimes does, and what the rendering cannot give back.
    if (i === 37) {
      answer = c.answer; // thinking mode, but no <think> block
      expected.set(id, 'empty-think');
    }
    outputIds = [...tok.encode(answer), imEnd];
    if (i === 211) {
      // A non-canonical split the server produced: " the" as " t" + "he", which encoding the text merges.
      outputIds = [...tok.encode(answer), ...tok.encode(' t'), ...tok.encode('he'), imEnd];
      expected.set(id, 'non-canonical');
    }
    if (i === 123) {
      outputIds = [...tok.encode(answer), endOfText];
      finish = { type: 'stop', matched: endOfText };
      expected.set(id, 'stop-without-end-of-turn');
    }
    // Left out as tokenize leaves them out.
    if (i % 50 === 7) {
      outputIds = tok.encode(answer).slice(0, 20);
      finish = { type: 'length', length: 20 };
      leftOut.add(id);
    }
    if (i === 99 || i === 301) {
      finish = { type: 'abort', message: 'client disconnected' };
      leftOut.add(id);
    }
    if (i === 250) {
      outputIds = [];
      leftOut.add(id);
    }
    const rec = {
      id,
      dataset: DATASET,
      prompt_ids: promptIds,
      output_ids: outputIds,
      prompt_tokens: promptIds.length,
      completion_tokens: outputIds.length,
      finish_reason: finish,
      endpoint: 'http://gpu-node:30000',
      worker: 'w1',
      attempt: 1,
      ts: '2026-01-01T00:00:00.000Z',
    };
    records.push(JSON.stringify(rec));
    // A repeated record (a re-delivered result imported twice): the first wins.
    if (i === 5)
      records.push(
        JSON.stringify({ ...rec, output_ids: [...tok.encode('a different answer'), imEnd], completion_tokens: 4 }),
      );
  });
  writeFileSync(promptsFile, `${promptLines.join('\n')}\n`);
  mkdirSync(generationsDir, { recursive: true });
  writeFileSync(path.join(generationsDir, 'imported-00000.jsonl'), `${records.join('\n')}\n`);
  return { expected, leftOut };
}

describe('export --format specforge | jsonl', () => {
  const run = 'exp';
  let configPath: string;
  let built: Built;

  beforeAll(async () => {
    const tok = await loadTokenizer(bundledTokenizerPath());
    const runDir = path.join(tmp.dir, 'out', run);
    built = buildRun(tok, path.join(tmp.dir, 'prompts.jsonl'), path.join(runDir, DATASET, 'generations'));
    configPath = writeConfig(tmp.dir, {
      run,
      redis: { url: redis.url, prefix: redis.prefix },
      sglang: { endpoints: ['http://127.0.0.1:9'] },
      datasets: [{ name: DATASET, prompts: 'prompts.jsonl', tokenBudget: 1_000_000 }],
      output: { dir: 'out' },
    });
  });

  it('re-derives the rows tokenmill made from the exported conversations for >= 99 % of them, every difference explained', async () => {
    const pp = await cli(['postprocess', '-c', configPath]);
    expect(pp.code, pp.out).toBe(0);

    const sfOut = path.join(tmp.dir, 'export', 'sf.jsonl');
    const sf = await cli(['export', '-c', configPath, '--format', 'specforge', '--out', sfOut, '--json']);
    expect(sf.code, sf.out).toBe(0);
    const sfResult = JSON.parse(
      sf.out.split('\n').find((l) => l.startsWith('{"format"')) ?? 'null',
    ) as SpecForgeRunResult;
    const leftOut = built.leftOut.size;
    expect(sfResult.exported).toBe(PROMPTS - leftOut);
    expect(sfResult.datasets[0]).toMatchObject({
      lines: PROMPTS + 1,
      exported: PROMPTS - leftOut,
      droppedAborted: 2,
      droppedEmpty: 1,
      duplicates: 1,
      stopWithoutEndOfTurn: 1,
      byKind: { 'last-turn': { rows: PROMPTS - leftOut, reencodeDiffers: 1 }, 'all-turns': { rows: 0 } },
    });
    // The settings SpecForge reads the file with: one file (no whole-conversation rows), Qwen3's template.
    expect(sfResult.chatTemplate).toMatchObject({ name: 'qwen3-instruct', fitting: ['qwen3-instruct'] });
    expect(sfResult.files).toEqual([
      expect.objectContaining({
        kind: 'last-turn',
        file: sfOut,
        rows: PROMPTS - leftOut,
        reencodeDiffers: 1,
        sidecar: `${sfOut}.specforge.yaml`,
        data: {
          train_data_path: sfOut,
          chat_template: 'qwen3-instruct',
          is_preformatted: true,
          train_only_last_turn: true,
          max_length: sfResult.files[0]?.longest,
        },
      }),
    ]);
    expect(sfResult.reencodeDiffers).toBe(1);
    expect(sfResult.datasets[0]?.reencodeExamples).toEqual(
      [...built.expected].filter(([, k]) => k === 'non-canonical').map(([id]) => id),
    );
    const sidecar = readFileSync(`${sfOut}.specforge.yaml`, 'utf8');
    expect(sidecar).toContain('1 row re-encodes differently (non-canonical token splits the server produced)');
    expect(sidecar).toContain('train_only_last_turn: true');
    const text = await inProcess(['export', '-c', configPath, '--format', 'specforge', '--out', sfOut]);
    expect(text).toContain(`${sfOut}: ${PROMPTS - leftOut} rows, train_only_last_turn: true, max_length: `);
    expect(text).toContain(
      "1 row re-encodes differently (non-canonical token splits the server produced); for those, SpecForge's conversation loader cannot reproduce the ids — use `export --format jsonl` as `data.prompts_path` (exact)",
    );
    const lines = readFileSync(sfOut, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; dataset: string; conversations: ChatMessage[] });
    expect(lines.length).toBe(PROMPTS - leftOut);
    for (const l of lines) {
      expect(built.leftOut.has(l.id)).toBe(false);
      expect(l.conversations.at(-1)?.role).toBe('assistant');
      expect(l.conversations.at(-1)?.content).not.toContain('<|im_end|>');
    }
    // The first of the two records of sample p-5 is the one exported.
    expect(lines.find((l) => l.id === 'p-5')?.conversations.at(-1)?.content).not.toBe('a different answer');

    // The prompt index in 11 partitions (a prompt file too big for one) gives the same lines.
    const partOut = path.join(tmp.dir, 'export', 'partitioned.jsonl');
    const writer = await SpecForgeOutput.open(partOut);
    const partStats = await exportSpecForgeDataset({
      dataset: DATASET,
      promptsFile: path.join(tmp.dir, 'prompts.jsonl'),
      generationsDir: path.join(tmp.dir, 'out', run, DATASET, 'generations'),
      ctx: createTokenizeContext(await loadTokenizer(bundledTokenizerPath())),
      sink: writer,
      turns: 'last',
      rows: 'conversation',
      samplesPerPrompt: 1,
      partitionMaxLines: 37,
    });
    await writer.commit([partStats], undefined);
    expect(partStats).toMatchObject({ lines: PROMPTS + 1, exported: PROMPTS - leftOut, duplicates: 1 });
    const sorted = (file: string): string[] => readFileSync(file, 'utf8').trim().split('\n').sort();
    expect(sorted(partOut)).toEqual(sorted(sfOut));

    // With postprocess.keepTruncated, the truncated and aborted generations are rows, so they are exported too.
    const truncWriter = await SpecForgeOutput.open(path.join(tmp.dir, 'export', 'with-truncated.jsonl'));
    const truncStats = await exportSpecForgeDataset({
      dataset: DATASET,
      promptsFile: path.join(tmp.dir, 'prompts.jsonl'),
      generationsDir: path.join(tmp.dir, 'out', run, DATASET, 'generations'),
      ctx: createTokenizeContext(await loadTokenizer(bundledTokenizerPath()), { keepTruncated: true }),
      sink: truncWriter,
      turns: 'last',
      rows: 'conversation',
      samplesPerPrompt: 1,
    });
    await truncWriter.abort();
    expect(truncStats).toMatchObject({
      exported: PROMPTS - 1,
      keptTruncated: 10,
      droppedTruncated: 0,
      droppedAborted: 0,
      droppedEmpty: 1,
    });

    const rowsOut = path.join(tmp.dir, 'export', 'rows.jsonl');
    const rows = await inProcess(['export', '-c', configPath, '--format', 'jsonl', '--out', rowsOut]);
    expect(rows).toContain(`exported ${PROMPTS - leftOut} of ${PROMPTS - leftOut} rows`);
    const chosen = await inProcess([
      'export',
      '-c',
      configPath,
      '--format',
      'jsonl',
      '--dataset',
      DATASET,
      '--out',
      path.join(tmp.dir, 'export', 'b1.jsonl'),
      '--json',
    ]);
    expect(JSON.parse(chosen)).toMatchObject({
      exported: PROMPTS - leftOut,
      byDataset: { [DATASET]: PROMPTS - leftOut },
    });
    expect(readFileSync(path.join(tmp.dir, 'export', 'b1.jsonl'), 'utf8')).toBe(readFileSync(rowsOut, 'utf8'));

    const py = await runPythonJson<PyReport>(
      'export_parity.py',
      [],
      {
        tokenizer_dir: bundledTokenizerPath(),
        specforge: sfOut,
        rows: rowsOut,
        target: path.join(tmp.dir, 'out', run, 'train-dataset'),
      },
      { timeoutMs: 180_000 },
    );

    expect(py.target_rows).toBe(PROMPTS - leftOut);
    expect(py.jsonl_rows).toBe(py.target_rows);
    expect(py.jsonl_equal).toBe(py.target_rows);

    const identical = py.results.filter((r) => r.kind === 'identical');
    const differing = py.results.filter((r) => r.kind !== 'identical');
    const rate = identical.length / py.results.length;
    process.stdout.write(
      `export re-derivation (transformers ${py.versions['transformers'] ?? '?'}, datasets ${py.versions['datasets'] ?? '?'}): ` +
        `${identical.length} of ${py.results.length} rows identical (${(100 * rate).toFixed(2)} %); differences:\n` +
        differing.map((r) => `  ${r.id}: ${r.kind}${r.detail === '' ? '' : ` (${r.detail})`}\n`).join(''),
    );
    expect(rate).toBeGreaterThanOrEqual(0.99);
    expect(Object.fromEntries(differing.map((r) => [r.id, r.kind]))).toEqual(Object.fromEntries(built.expected));
    // Each line's text is its row's tokens; the rows whose text does not encode back are the ones the export counted.
    expect(py.results.filter((r) => r.text_is_row !== true).map((r) => r.id)).toEqual([]);
    expect(py.results.filter((r) => r.text_reencodes !== true).map((r) => r.id)).toEqual(
      sfResult.datasets[0]?.reencodeExamples,
    );
    // Where the ids agree, so does the mask on what the model generated (the prompt's own
    // history is never supervised in a generation row, while SpecForge's rule supervises it).
    expect(identical.filter((r) => r.mask_equal_after_prompt !== true).map((r) => r.id)).toEqual([]);
    expect(identical.some((r) => r.prompt_has_assistant === true)).toBe(true);
  }, 240_000);

  it('refuses bad input with a clear message', async () => {
    // In process (the messages are what the CLI prints after "tokenmill: "), to keep the file fast.
    const exportCmd = (...args: string[]): Promise<string> => inProcess(['export', ...args]);
    await expect(exportCmd('-c', configPath, '--format', 'parquet')).rejects.toThrow(
      'unknown --format "parquet": expected one of specforge, jsonl, speculators',
    );
    await expect(exportCmd('-c', configPath, '--format', 'specforge', '--dataset', 'B9')).rejects.toThrow(
      `--dataset "B9" is not in the config's datasets (${DATASET})`,
    );

    const noTarget = writeConfig(
      tmp.dir,
      {
        run: 'empty',
        datasets: [{ name: DATASET, prompts: 'prompts.jsonl', tokenBudget: 1000 }],
        output: { dir: 'out' },
      },
      'empty.yaml',
    );
    await expect(exportCmd('-c', noTarget, '--format', 'jsonl')).rejects.toThrow(
      `no training dataset at ${path.join(tmp.dir, 'out', 'empty', 'train-dataset')} (postprocess.target): run \`tokenmill postprocess -c <config>\` first`,
    );

    // Nothing generated: an empty export that says so.
    const nothing = await exportCmd('-c', noTarget, '--format', 'specforge');
    expect(nothing).toContain(`${DATASET}: not exported, nothing generated yet`);
    expect(readFileSync(path.join(tmp.dir, 'out', 'empty', 'export', 'specforge.jsonl'), 'utf8')).toBe('');

    // A prompt file that changed since generation: the record no longer matches its prompt.
    const promptsFile = path.join(tmp.dir, 'prompts.jsonl');
    const original = readFileSync(promptsFile, 'utf8');
    try {
      const edited = original
        .trimEnd()
        .split('\n')
        .map((line) => {
          const rec = JSON.parse(line) as { id: unknown; messages?: ChatMessage[] };
          if (rec.id === 'p-1') rec.id = 'p-1-renamed';
          const last = rec.messages?.at(-1);
          if (rec.id === 'p-2' && last !== undefined) last.content += ' (edited)';
          return JSON.stringify(rec);
        });
      expect(edited.join('\n')).not.toBe(original.trimEnd());
      writeFileSync(promptsFile, `${edited.join('\n')}\n`);
      const changed = await exportCmd(
        '-c',
        configPath,
        '--format',
        'specforge',
        '--out',
        path.join(tmp.dir, 'export', 'changed.jsonl'),
      );
      expect(changed).toContain('1 without a prompt line, 1 whose prompt line changed');
      expect(changed).toContain('sample p-1: no line of');
      expect(changed).toContain('sample p-2: its prompt line in');
    } finally {
      writeFileSync(promptsFile, original);
    }
  }, 60_000);
});
