// vLLM speculators (0.9.0) trains on what tokenmill makes, through its own code (Python env
// `trainers`, test/python/speculators_loaders.py). The training dataset is made as a user makes
// it: `tokenmill demo` as a child process; then `export --format speculators` and
// `export --format jsonl` as child processes. Checked:
// - speculators' training loader (ArrowDataset over the export, hidden states cached where its
//   FileTransfer looks, items through ds[i] and CollateFn) yields every training row's input_ids
//   and loss_mask (every row of the agentic B8_sweagent among them); its lengths are tokenmill's
//   num_tokens; the folder has prepare-data's column types and format;
// - save_token_frequency_distribution on the loaded dataset gives tokenmill's token_freq.pt
//   (written in TypeScript), so d2t/t2d come out the same;
// - prepare-data's code passes the jsonl export's rows through unchanged, with the same token
//   frequencies, and saves a folder of the export's shape;
// - the training folder itself as prepare-data's --data fails (speculators globs *.json), which
//   is why the export exists;
// - the export refuses a folder holding anything else, replaces an earlier one, keeps rows in
//   order across shards and leaves out rows without a supervised token.
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  bundledTokenizerPath,
  describeHfDataset,
  readHfDataset,
  writeHfDataset,
  type HfRow,
} from '../../src/shared/index.js';
import { exportSpeculators, torchSaveIntDict, type SpeculatorsExportStats } from '../../src/cli/export/index.js';
import { useHarness } from '../helpers/fixture.js';
import { sharedDemo } from '../helpers/shared-demo.js';
import { spawnCli } from '../helpers/pipeline.js';
import { runPythonJson } from '../helpers/python.js';

/** Qwen3-8B's vocabulary size (its config.json), the target of the demo's tokenizer. */
const QWEN3_VOCAB_SIZE = 151_936;
const PY_TIMEOUT_MS = 600_000;
/** The demo's agentic dataset. */
const AGENTIC = 'B8_sweagent';

const { tmp } = useHarness({ tmp: 'tm-speculators-', cli: true });

let configPath = '';
let target = '';
let exportDir = '';
let jsonlPath = '';
let stats: SpeculatorsExportStats & { format: string; train: string };

async function cli(args: string[]): Promise<{ code: number | string; out: string; stdout: string }> {
  const p = spawnCli(args);
  const code = await p.exited;
  return { code, out: p.output(), stdout: p.stdout() };
}

function work(name: string): string {
  const dir = path.join(tmp.dir, 'work', name);
  mkdirSync(dir, { recursive: true });
  return dir;
}

beforeAll(async () => {
  const demo = await sharedDemo();
  configPath = demo.config;
  target = path.join(demo.runDir, 'train-dataset');
  expect(existsSync(configPath), 'the demo writes its config').toBe(true);
  exportDir = path.join(tmp.dir, 'speculators-data');
  jsonlPath = path.join(tmp.dir, 'rows.jsonl');
  const spec = await cli(['export', '-c', configPath, '--format', 'speculators', '--out', exportDir, '--json']);
  expect(spec.code, spec.out.slice(-4_000)).toBe(0);
  stats = JSON.parse(spec.stdout.trim()) as typeof stats;
  const rows = await cli(['export', '-c', configPath, '--format', 'jsonl', '--out', jsonlPath]);
  expect(rows.code, rows.out.slice(-4_000)).toBe(0);
}, 420_000);

describe('export --format speculators', () => {
  it('writes the folder alone, reports what speculators needs, and replaces an earlier export', async () => {
    const summary = await describeHfDataset(target);
    expect(stats.format).toBe('speculators');
    expect(stats.rows).toBe(summary.rows);
    // The demo's rows all have a supervised token: every one is exported.
    expect(stats.unsupervised).toBe(0);
    expect(stats.exported).toBe(summary.rows);
    expect(stats.tokens).toBe(summary.totalTokens);
    expect(stats.supervisedTokens).toBe(summary.supervisedTokens);
    expect(stats.distinctSupervisedIds).toBeGreaterThan(100);
    let longest = 0;
    for await (const r of (await readHfDataset(target)).rows()) longest = Math.max(longest, r['num_tokens'] as number);
    expect(stats.longest?.tokens).toBe(longest);
    expect(stats.train).toBe(
      `speculators train --verifier-name-or-path Qwen/Qwen3-8B --data-path ${exportDir} --total-seq-len ${longest} --draft-vocab-size ${Math.min(32_000, stats.distinctSupervisedIds)}`,
    );
    // Nothing but what prepare-data writes: speculators globs the folder.
    const names = readdirSync(exportDir).sort();
    expect(names).toEqual([...stats.shards, 'dataset_info.json', 'state.json', 'token_freq.pt'].sort());
    expect(readdirSync(tmp.dir).filter((n) => n.includes('.staging-') || n.includes('.old-'))).toEqual([]);

    // Again, in text, over the first export and the vocabulary caches speculators train leaves
    // beside it (stale once token_freq.pt is rewritten): replaced whole, the same bytes.
    const before = Object.fromEntries(names.map((n) => [n, readFileSync(path.join(exportDir, n)).toString('hex')]));
    writeFileSync(path.join(exportDir, 'd2t-500.npy'), 'stale');
    writeFileSync(path.join(exportDir, 't2d-500.npy'), 'stale');
    const again = await cli(['export', '-c', configPath, '--format', 'speculators', '--out', exportDir]);
    expect(again.code, again.out).toBe(0);
    expect(again.stdout).toContain(`exported ${stats.exported.toLocaleString('en-US')} of`);
    expect(again.stdout).toContain(`longest row: ${longest.toLocaleString('en-US')} tokens`);
    expect(again.stdout).toContain('replaced the earlier export and its vocabulary caches (d2t-500.npy, t2d-500.npy)');
    expect(again.stdout).toContain(`train: speculators train --verifier-name-or-path Qwen/Qwen3-8B --data-path`);
    expect(readdirSync(exportDir).sort()).toEqual(names);
    for (const n of names) {
      if (n === 'state.json') continue; // its _fingerprint is new, as datasets' is for new data
      expect(readFileSync(path.join(exportDir, n)).toString('hex'), n).toBe(before[n]);
    }
  }, 120_000);

  it(
    "is read by speculators' training loader: every row's input_ids and loss_mask, its token_freq.pt and d2t/t2d",
    async () => {
      const draftVocab = Math.floor(stats.distinctSupervisedIds / 2);
      const r = await runPythonJson<{
        target_rows: number;
        rows: number;
        dataset_rows: number;
        approx_lengths_equal: boolean;
        equal: number;
        by_dataset: Record<string, { rows: number; equal: number }>;
        differences: { index: number; id: string; kind: string; detail: string }[];
        item_dtypes: string[][];
        format: string;
        format_columns: string[];
        shard_types: Record<string, string>;
        state: Record<string, unknown>;
        freq_equal: boolean;
        freq_order_equal: boolean;
        freq_types: string[];
        freq_equal_rows: boolean;
        distinct: number;
        supervised: number;
        d2t_equal: boolean;
        t2d_equal: boolean;
        t2d_selected: number;
      }>(
        'speculators_loaders.py',
        [],
        {
          mode: 'train-loader',
          export_dir: exportDir,
          target_dir: target,
          work_dir: work('loader'),
          hidden_size: 8,
          target_vocab_size: QWEN3_VOCAB_SIZE,
          draft_vocab_size: draftVocab,
        },
        { env: 'trainers', timeoutMs: PY_TIMEOUT_MS },
      );
      expect(r.target_rows).toBe(stats.rows);
      expect(r.rows).toBe(stats.exported);
      expect(r.dataset_rows).toBe(stats.exported);
      expect(r.approx_lengths_equal, 'ArrowDataset.approx_lengths (seq_len) = num_tokens').toBe(true);
      // Every row, in the training dataset's order (the hidden states are found by position).
      expect(r.differences).toEqual([]);
      expect(r.equal).toBe(r.rows);
      expect(r.equal / r.rows).toBeGreaterThanOrEqual(0.99);
      // The agentic dataset (tools, calls, tool results; whole conversations and turns of their
      // own) among them: every row of it, as tokenmill made it.
      let agenticRows = 0;
      for await (const row of (await readHfDataset(target)).rows()) if (row['dataset'] === AGENTIC) agenticRows += 1;
      expect(agenticRows, AGENTIC).toBeGreaterThan(0);
      expect(r.by_dataset[AGENTIC], AGENTIC).toEqual({ rows: agenticRows, equal: agenticRows });
      expect(r.item_dtypes).toEqual([['torch.int64', 'torch.int64']]);
      // What prepare-data saves: torch format over the three columns, int64 lists.
      expect(r.format).toBe('torch');
      expect(r.format_columns).toEqual(['input_ids', 'loss_mask', 'seq_len']);
      expect(r.shard_types).toEqual({
        input_ids: 'list<item: int64>',
        loss_mask: 'list<item: int64>',
        seq_len: 'int64',
      });
      expect(r.state).toEqual({
        _format_type: 'torch',
        _format_columns: ['input_ids', 'loss_mask', 'seq_len'],
        _format_kwargs: {},
        _output_all_columns: false,
        _split: null,
      });
      // token_freq.pt equals speculators' own count, down to the dict's order; so do d2t and t2d.
      expect(r.freq_equal).toBe(true);
      expect(r.freq_order_equal).toBe(true);
      expect(r.freq_types).toEqual(['int:int']);
      expect(r.freq_equal_rows).toBe(true);
      expect(r.distinct).toBe(stats.distinctSupervisedIds);
      expect(r.supervised).toBe(stats.supervisedTokens);
      expect(r.d2t_equal).toBe(true);
      expect(r.t2d_equal).toBe(true);
      expect(r.t2d_selected).toBe(draftVocab);
    },
    PY_TIMEOUT_MS,
  );

  it('refuses a folder that holds anything else, naming it, and leaves it as it was', async () => {
    // The loader test cached hidden states in the export: they belong to its rows by position.
    expect(existsSync(path.join(exportDir, 'hidden_states'))).toBe(true);
    const hs = readdirSync(path.join(exportDir, 'hidden_states')).length;
    const refused = await cli(['export', '-c', configPath, '--format', 'speculators', '--out', exportDir]);
    expect(refused.code).not.toBe(0);
    expect(refused.out).toContain(`--out ${exportDir} is not empty and is not an earlier speculators export`);
    expect(refused.out).toContain('hidden_states/ (hidden states cached for the earlier rows');
    expect(readdirSync(path.join(exportDir, 'hidden_states')).length).toBe(hs);
    expect(readdirSync(tmp.dir).filter((n) => n.includes('.staging-'))).toEqual([]);

    const other = path.join(tmp.dir, 'not-an-export');
    mkdirSync(other);
    writeFileSync(path.join(other, 'notes.txt'), 'mine');
    const opts = { target, shardSizeMiB: 500 };
    await expect(exportSpeculators({ ...opts, out: other })).rejects.toThrow(
      `--out ${other} is not empty and is not an earlier speculators export (no state.json of the columns input_ids, loss_mask, seq_len): it holds notes.txt`,
    );
    expect(readdirSync(other)).toEqual(['notes.txt']);
    await expect(exportSpeculators({ ...opts, out: target })).rejects.toThrow(
      /is the training dataset .* or inside it/,
    );
    await expect(exportSpeculators({ ...opts, out: path.join(target, 'x') })).rejects.toThrow(/or inside it/);
    writeFileSync(path.join(tmp.dir, 'a-file'), '');
    await expect(exportSpeculators({ ...opts, out: path.join(tmp.dir, 'a-file') })).rejects.toThrow(
      /is a file, not a folder/,
    );

    // --dataset: only the chosen datasets' rows, counted.
    const some = await exportSpeculators({
      ...opts,
      out: path.join(tmp.dir, 'two-datasets'),
      datasets: ['B1_glaive', 'B8_sweagent'],
    });
    expect(Object.keys(some.byDataset).sort()).toEqual(['B1_glaive', 'B8_sweagent']);
    expect(some.exported + some.otherDatasets).toBe(stats.rows);
    expect(some.exported).toBe((stats.byDataset['B1_glaive'] ?? 0) + (stats.byDataset['B8_sweagent'] ?? 0));
  }, 120_000);

  it('keeps rows in order across shards and leaves out rows without a supervised token', async () => {
    const small = path.join(tmp.dir, 'small-target');
    const rows: HfRow[] = Array.from({ length: 60 }, (_, i) => {
      const n = 50 + i;
      const ids = Array.from({ length: n }, (_, k) => (i * 131 + k * 17) % 151_000);
      return {
        id: `r${i}`,
        dataset: i % 2 === 0 ? 'A' : 'B',
        input_ids: ids,
        loss_mask: ids.map((_, k) => (i % 10 === 3 ? 0 : k >= n / 2 ? 1 : 0)),
        num_tokens: n,
        finish_reason: 'stop',
      };
    });
    await writeHfDataset(small, rows, { shardSizeMiB: 1 });
    const out = path.join(tmp.dir, 'small-export');
    const s = await exportSpeculators({ target: small, out, shardSizeMiB: 0.005 });
    expect(s.shards.length).toBeGreaterThan(3);
    const kept = rows.filter((_, i) => i % 10 !== 3);
    expect(s.unsupervised).toBe(rows.length - kept.length);
    expect(s.exported).toBe(kept.length);
    const back: Record<string, unknown>[] = [];
    for await (const r of (await readHfDataset(out)).rows()) back.push(r);
    expect(back).toEqual(kept.map((r) => ({ input_ids: r.input_ids, loss_mask: r.loss_mask, seq_len: r.num_tokens })));
    expect(s.longest).toEqual({ tokens: 109, id: 'r59', dataset: 'B' });

    // Rows to export but none with a supervised token: refused, saying why, nothing written.
    const none = path.join(tmp.dir, 'none-target');
    await writeHfDataset(
      none,
      rows.slice(0, 2).map((r) => ({ ...r, loss_mask: r.loss_mask.map(() => 0) })),
      { shardSizeMiB: 1 },
    );
    const noneOut = path.join(tmp.dir, 'none-export');
    await expect(exportSpeculators({ target: none, out: noneOut, shardSizeMiB: 1 })).rejects.toThrow(
      `nothing to export from ${none}: 2 rows read, 2 without a supervised token`,
    );
    expect(existsSync(noneOut)).toBe(false);
  }, 60_000);

  it(
    "passes prepare-data's pre-tokenized route: the jsonl export's rows come through unchanged",
    async () => {
      const r = await runPythonJson<{
        rows: number;
        want_rows: number;
        multiset_equal: boolean;
        missing: number;
        extra: number;
        freq_equal: boolean;
        shard_types_equal: boolean;
        state_equal: boolean;
        features_equal: boolean;
        format_equal: boolean;
        format: string;
      }>(
        'speculators_loaders.py',
        [],
        {
          mode: 'prepare-data',
          jsonl: jsonlPath,
          tokenizer: bundledTokenizerPath(),
          target_dir: target,
          export_dir: exportDir,
          work_dir: work('prepare'),
          seq_length: stats.longest?.tokens ?? 0,
        },
        { env: 'trainers', timeoutMs: PY_TIMEOUT_MS },
      );
      // It shuffles: the same rows as a multiset, none lost or cut, and its token counts are ours.
      expect(r.want_rows).toBe(stats.exported);
      expect(r.rows).toBe(stats.exported);
      expect({ missing: r.missing, extra: r.extra }).toEqual({ missing: 0, extra: 0 });
      expect(r.multiset_equal).toBe(true);
      expect(r.freq_equal).toBe(true);
      // The folder prepare-data saves has the export's shape: column types, format, features.
      expect(r.shard_types_equal).toBe(true);
      expect(r.state_equal).toBe(true);
      expect(r.features_equal).toBe(true);
      expect(r.format_equal).toBe(true);
      expect(r.format).toBe('torch');
    },
    PY_TIMEOUT_MS,
  );

  it(
    "fails in prepare-data given the training folder itself: it globs the folder's *.json",
    async () => {
      const r = await runPythonJson<{ ok: boolean; error?: string; cause?: string; cause_message?: string }>(
        'speculators_loaders.py',
        [],
        { mode: 'target-as-data', target_dir: target, work_dir: work('as-data') },
        { env: 'trainers', timeoutMs: PY_TIMEOUT_MS },
      );
      // dataset_info.json, state.json and .tokenmill/*.json read as rows of one JSON dataset.
      expect(r.ok).toBe(false);
      expect(r.error).toBe('DatasetGenerationError');
      expect(r.cause).toBe('CastError');
      expect(r.cause_message).toMatch(/Couldn't cast/);
    },
    PY_TIMEOUT_MS,
  );
});

describe('token_freq.pt without Python', () => {
  it(
    'torch.load(weights_only=True) reads a 150,000-entry dict written in TypeScript, byte for byte pickle',
    async () => {
      const n = 150_000;
      const file = path.join(work('torch-load'), 'token_freq.pt');
      const entries: [number, number][] = [];
      for (let i = 0; i < n; i++) entries.push([(i * 7919) % 1_000_003, i * 31 + (i % 7) * 2 ** 33]);
      await torchSaveIntDict(file, entries);
      const r = await runPythonJson<{
        entries: number;
        equal: boolean;
        order_equal: boolean;
        pickle_identical: boolean;
        names: string[];
        crc_ok: boolean;
      }>('speculators_loaders.py', [], { mode: 'torch-load', file, n }, { env: 'trainers', timeoutMs: PY_TIMEOUT_MS });
      expect(r.entries).toBe(n);
      expect(r.equal).toBe(true);
      expect(r.order_equal).toBe(true);
      expect(r.pickle_identical).toBe(true);
      expect(r.crc_ok).toBe(true);
      expect(r.names).toEqual([
        'token_freq/data.pkl',
        'token_freq/.format_version',
        'token_freq/.storage_alignment',
        'token_freq/byteorder',
        'token_freq/version',
        'token_freq/.data/serialization_id',
      ]);
    },
    PY_TIMEOUT_MS,
  );
});
