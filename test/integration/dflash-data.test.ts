// Data checks for DFlash drafters, on real dataset folders, real child processes and a real
// Redis: the merge report counts rows with fewer than 2 adjacent supervised tokens and the rows
// by anchor positions (over the merged dataset and the new rows), `postprocess` prints them and
// `status` shows the count; `export --drafter dflash` (jsonl, speculators) leaves exactly those
// rows out and says how many; `postprocess.dflash.maskToken` is checked against the bundled Qwen3
// tokenizer by `config -c`, by `export` and by the merge, each failure named.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  DatasetMergeError,
  indexFileOf,
  loadTokenizer,
  bundledTokenizerPath,
  mergeIntoTarget,
  readHfDataset,
  type AnchorHistogram,
  type HfRow,
  type MergeJobResult,
  type MergeReport,
} from '../../src/shared/index.js';
import { DflashRows } from '../../src/cli/export/dflash-rows.js';
import { emitRow, emptyStats, type SpecForgeLine, type SpecForgeRowKind } from '../../src/cli/export/specforge-rows.js';
import { createTokenizeContext } from '../../src/workers/index.js';
import { spawnCli } from '../helpers/pipeline.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';

const { redis, tmp } = useHarness({ redis: true, tmp: true, cli: true });

/** Bundled Qwen3: a special token no chat row holds. */
const MASK = '<|vision_pad|>';
const MASK_ID = 151654;

/** A row of dataset `dataset` whose loss mask is `mask` (ids: ordinary tokens). */
function row(dataset: string, id: string, mask: number[], ids?: number[]): HfRow {
  return {
    id,
    dataset,
    input_ids: ids ?? mask.map((_, i) => 1000 + i),
    loss_mask: mask,
    num_tokens: mask.length,
    finish_reason: 'stop',
  };
}

/** A mask of `prompt` zeros then `supervised` ones. */
function tail(prompt: number, supervised: number): number[] {
  return [...Array<number>(prompt).fill(0), ...Array<number>(supervised).fill(1)];
}

// Anchor positions: supervised positions followed by a supervised one.
const FIRST = [
  row('old', 'none', [0, 0, 0, 0]), // 0 supervised: 0
  row('old', 'one', [0, 1, 0, 0]), // 1 supervised: 0
  row('old', 'apart', [0, 1, 0, 1, 0, 1]), // 3 supervised, none adjacent: 0
  row('old', 'pair', [0, 1, 1, 0]), // exactly 2 adjacent: 1
  row('old', 'twenty', tail(3, 20)), // 19
];
const SECOND = [
  row('new', 'three', tail(2, 3)), // 2
  row('new', 'sixty-five', tail(1, 65)), // 64
  row('new', 'three-hundred', tail(1, 300)), // 299
  row('new', 'long', tail(4, 1100)), // 1099
  row('new', 'ends', [1, 0, 1]), // 0
];
const SHORT_IDS = ['none', 'one', 'apart', 'ends'];

function histogram(over: Partial<AnchorHistogram>): AnchorHistogram {
  return { '0': 0, '1': 0, '2-15': 0, '16-63': 0, '64-255': 0, '256-1023': 0, '1024+': 0, ...over };
}

async function cli(args: string[]): Promise<{ code: number | string; out: string }> {
  const p = spawnCli(args);
  const code = await p.exited;
  return { code, out: p.output() };
}

function jsonLine<T>(out: string, startsWith: string): T {
  const line = out.split('\n').find((l) => l.startsWith(startsWith));
  if (line === undefined) throw new Error(`no line starting with ${startsWith} in:\n${out}`);
  return JSON.parse(line) as T;
}

describe('DFlash data checks', () => {
  let target: string;
  let first: MergeReport;
  let second: MergeReport;

  beforeAll(async () => {
    target = path.join(tmp.dir, 'train-dataset');
    const runDir = path.join(tmp.dir, 'reports');
    first = (await mergeIntoTarget({ target, newRows: FIRST, runDir, shardSizeMiB: 1 })).report;
    second = (await mergeIntoTarget({ target, newRows: SECOND, runDir, shardSizeMiB: 1 })).report;
  });

  it('the merge report counts rows with 0, 1 and 2 adjacent supervised tokens right, and the anchor-position histogram', () => {
    expect(first.dflash).toEqual({
      rowsWithoutAnchor: 3,
      newRowsWithoutAnchor: 3,
      anchorPositions: histogram({ '0': 3, '1': 1, '16-63': 1 }),
      newAnchorPositions: histogram({ '0': 3, '1': 1, '16-63': 1 }),
      maskToken: null,
    });
    // The second merge reads only its new shards; the old ones' counts come from the index.
    expect(second.dflash).toEqual({
      rowsWithoutAnchor: 4,
      newRowsWithoutAnchor: 1,
      anchorPositions: histogram({
        '0': 4,
        '1': 1,
        '2-15': 1,
        '16-63': 1,
        '64-255': 1,
        '256-1023': 1,
        '1024+': 1,
      }),
      newAnchorPositions: histogram({ '0': 1, '2-15': 1, '64-255': 1, '256-1023': 1, '1024+': 1 }),
      maskToken: null,
    });
  });

  it('an index file of an earlier version (no anchor counts) is rebuilt by the next merge, so the totals stay exact', async () => {
    const old = path.join(tmp.dir, 'earlier-target');
    const runDir = path.join(tmp.dir, 'reports');
    await mergeIntoTarget({ target: old, newRows: FIRST, runDir, shardSizeMiB: 1 });
    const shard = (await readHfDataset(old)).meta.shards[0] as string;
    // Drop the counts from the header, keeping its length (JSON padded with spaces).
    const file = indexFileOf(old, shard);
    const buf = readFileSync(file);
    const len = buf.readUInt32LE(8);
    const header = JSON.parse(buf.subarray(12, 12 + len).toString('utf8')) as Record<string, unknown>;
    expect(header['anchorPositions']).toEqual(histogram({ '0': 3, '1': 1, '16-63': 1 }));
    delete header['anchorPositions'];
    buf.write(JSON.stringify(header).padEnd(len, ' '), 12, len, 'utf8');
    writeFileSync(file, buf);
    const again = await mergeIntoTarget({ target: old, newRows: SECOND, runDir, shardSizeMiB: 1 });
    expect(again.report.dflash?.anchorPositions).toEqual(second.dflash?.anchorPositions);
    expect(again.report.dflash?.rowsWithoutAnchor).toBe(4);
  });

  it('a merge refuses new rows that hold the mask token, naming the config key; the target is unchanged', async () => {
    const runDir = path.join(tmp.dir, 'reports');
    const rows = [row('bad', 'holds-mask', tail(1, 4), [1, 2, MASK_ID, 3, 4]), row('bad', 'fine', tail(1, 4))];
    const before = (await readHfDataset(target)).meta.shards;
    const err = await mergeIntoTarget({
      target,
      newRows: rows,
      runDir,
      shardSizeMiB: 1,
      dflashMaskToken: { token: MASK, id: MASK_ID },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetMergeError);
    expect((err as Error).message).toContain(
      `postprocess.dflash.maskToken "${MASK}" (id ${MASK_ID}) is in the data: 1 new row holds it (row 10)`,
    );
    expect((await readHfDataset(target)).meta.shards).toEqual(before);
    // Without the token in the rows, the same check passes and the report names it.
    const ok = await mergeIntoTarget({
      target: path.join(tmp.dir, 'other-target'),
      newRows: [rows[1] as HfRow],
      runDir,
      shardSizeMiB: 1,
      dflashMaskToken: { token: MASK, id: MASK_ID },
    });
    expect(ok.report.dflash?.maskToken).toEqual({ token: MASK, id: MASK_ID });
  });

  it('`export --drafter dflash` leaves out exactly the rows with fewer than 2 adjacent supervised tokens and counts them (jsonl, speculators)', async () => {
    const config = writeTestConfig(tmp.dir, {
      run: 'export',
      redis,
      postprocess: { target, dflash: { maskToken: MASK } },
    });
    const out = path.join(tmp.dir, 'rows.jsonl');
    const jsonl = await cli([
      'export',
      '-c',
      config,
      '--format',
      'jsonl',
      '--drafter',
      'dflash',
      '--out',
      out,
      '--json',
    ]);
    expect(jsonl.code, jsonl.out).toBe(0);
    const result = jsonLine<{ rows: number; exported: number; dflash: unknown }>(jsonl.out, '{"format":"jsonl"');
    expect(result.rows).toBe(10);
    expect(result.exported).toBe(6);
    expect(result.dflash).toEqual({
      leftOut: 4,
      anchorPositions: second.dflash?.anchorPositions,
      maskToken: { token: MASK, id: MASK_ID },
    });
    const written = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { id: string }).id);
    expect(written).toEqual(['pair', 'twenty', 'three', 'sixty-five', 'three-hundred', 'long']);
    expect(written.some((id) => SHORT_IDS.includes(id))).toBe(false);

    // Printed for people; without --drafter nothing is left out.
    const text = await cli(['export', '-c', config, '--format', 'jsonl', '--drafter', 'dflash', '--out', out]);
    expect(text.code, text.out).toBe(0);
    expect(text.out).toContain('DFlash: left out 4 rows with fewer than 2 adjacent supervised tokens');
    expect(text.out).toContain('DFlash anchor positions per row: 0: 4, 1: 1, 2-15: 1, 16-63: 1, 64-255: 1');
    const plain = await cli(['export', '-c', config, '--format', 'jsonl', '--out', out, '--json']);
    expect(jsonLine<{ exported: number }>(plain.out, '{"format":"jsonl"').exported).toBe(10);

    const spec = await cli([
      'export',
      '-c',
      config,
      '--format',
      'speculators',
      '--drafter',
      'dflash',
      '--out',
      path.join(tmp.dir, 'speculators'),
      '--json',
    ]);
    expect(spec.code, spec.out).toBe(0);
    const s = jsonLine<{ exported: number; unsupervised: number; dflash: { leftOut: number } }>(
      spec.out,
      '{"format":"speculators"',
    );
    expect(s).toMatchObject({ exported: 6, unsupervised: 0, dflash: { leftOut: 4 } });

    const unknown = await cli(['export', '-c', config, '--format', 'jsonl', '--drafter', 'medusa', '--out', out]);
    expect(unknown.code).not.toBe(0);
    expect(unknown.out).toContain('unknown --drafter "medusa": expected one of eagle3, dflash');
  });

  it('the SpecForge export with --drafter dflash writes no line for a row without an anchor position, and counts it', async () => {
    const ctx = createTokenizeContext(await loadTokenizer(bundledTokenizerPath()));
    const dflash = new DflashRows({ token: MASK, id: MASK_ID });
    const lines: SpecForgeLine[] = [];
    const sink = { write: (_k: SpecForgeRowKind, l: SpecForgeLine) => Promise.resolve(void lines.push(l)), dflash };
    const stats = emptyStats('sf');
    for (const r of [...FIRST, ...SECOND]) await emitRow(sink, ctx, stats, 'last-turn', r, []);
    expect(lines.map((l) => l.id)).toEqual(['pair', 'twenty', 'three', 'sixty-five', 'three-hundred', 'long']);
    expect(stats.dflashLeftOut).toBe(4);
    expect(stats.exported).toBe(6);
    expect(dflash.finish('sf').leftOut).toBe(4);
  });

  it('`export --drafter dflash` refuses a dataset whose rows hold the mask token, naming the rows', async () => {
    const holding = path.join(tmp.dir, 'holding-target');
    await mergeIntoTarget({
      target: holding,
      newRows: [row('m', 'clean', tail(1, 3)), row('m', 'dirty', tail(1, 3), [7, 8, MASK_ID, 9])],
      runDir: path.join(tmp.dir, 'reports'),
      shardSizeMiB: 1,
    });
    const config = writeTestConfig(tmp.dir, {
      run: 'holding',
      redis,
      postprocess: { target: holding, dflash: { maskToken: MASK } },
    });
    const out = path.join(tmp.dir, 'holding.jsonl');
    const r = await cli(['export', '-c', config, '--format', 'jsonl', '--drafter', 'dflash', '--out', out]);
    expect(r.code).not.toBe(0);
    expect(r.out).toContain(
      `postprocess.dflash.maskToken: "${MASK}" (id ${MASK_ID}) is in the data: 1 row of ${holding} hold it (row 1 (id "dirty"))`,
    );
  });

  it('`config -c` checks the mask token against the tokenizer: unknown, pad, eos, not special; a reserved special token passes', async () => {
    const tokenizer = await loadTokenizer(bundledTokenizerPath());
    expect(tokenizer.tokenToId(MASK)).toBe(MASK_ID);
    const cases: { token: string | number; says: string }[] = [
      { token: '<|mask|>', says: '"<|mask|>" is not in the vocabulary of the tokenizer' },
      // An id inside the vocabulary is checked as its token is.
      { token: 151643, says: 'id 151643 ("<|endoftext|>") is the pad token of the tokenizer' },
      { token: '<|endoftext|>', says: '"<|endoftext|>" (id 151643) is the pad token of the tokenizer' },
      { token: '<|im_end|>', says: '"<|im_end|>" (id 151645) is the eos token of the tokenizer' },
      { token: '<|fim_pad|>', says: '"<|fim_pad|>" (id 151662) is not a special token of the tokenizer' },
    ];
    for (const [i, c] of cases.entries()) {
      const config = writeTestConfig(tmp.dir, {
        run: `mask${i}`,
        redis,
        postprocess: { dflash: { maskToken: c.token } },
      });
      const r = await cli(['config', '-c', config]);
      expect(r.code, r.out).not.toBe(0);
      expect(r.out).toContain(`postprocess.dflash.maskToken: ${c.says}`);
    }
    const good = writeTestConfig(tmp.dir, { run: 'maskok', redis, postprocess: { dflash: { maskToken: MASK } } });
    const r = await cli(['config', '-c', good]);
    expect(r.code, r.out).toBe(0);
    expect(r.out).toContain(`"maskToken": "${MASK}"`);
    // An id past the vocabulary: the drafter's own mask row (z-lab's <|MASK|> for Qwen3), which no text encodes to.
    const pastVocab = writeTestConfig(tmp.dir, {
      run: 'maskrow',
      redis,
      postprocess: { dflash: { maskToken: tokenizer.vocabSize } },
    });
    const p = await cli(['config', '-c', pastVocab]);
    expect(p.code, p.out).toBe(0);
    // The export checks the same before reading a row.
    const pad = writeTestConfig(tmp.dir, {
      run: 'exportpad',
      redis,
      postprocess: { target, dflash: { maskToken: '<|endoftext|>' } },
    });
    const e = await cli(['export', '-c', pad, '--format', 'jsonl', '--drafter', 'dflash']);
    expect(e.code).not.toBe(0);
    expect(e.out).toContain('postprocess.dflash.maskToken: "<|endoftext|>" (id 151643) is the pad token');
  });

  it('`postprocess` prints the DFlash counts of the merged dataset and `status` shows them; a bad mask token fails the merge', async () => {
    const run = 'pp';
    const ppTarget = path.join(tmp.dir, 'out', run, 'train-dataset');
    // The target already holds rows, two of them without an anchor position.
    await mergeIntoTarget({
      target: ppTarget,
      newRows: [row('pre', 'short', [0, 1, 0]), row('pre', 'empty', [0, 0]), row('pre', 'fine', tail(1, 5))],
      runDir: path.join(tmp.dir, 'reports'),
      shardSizeMiB: 1,
    });
    const conv = path.join(tmp.dir, 'talk.jsonl');
    const lines = [0, 1, 2].map((i) =>
      JSON.stringify({
        id: `t${i}`,
        messages: [
          { role: 'user', content: `Question ${i}: what is a drafter?` },
          { role: 'assistant', content: `A drafter proposes tokens that the target model checks, answer ${i}.` },
        ],
      }),
    );
    writeFileSync(conv, `${lines.join('\n')}\n`);
    const config = writeTestConfig(tmp.dir, {
      run,
      redis,
      datasets: [{ name: 'talk', conversations: 'talk.jsonl' }],
      postprocess: { dflash: { maskToken: MASK } },
    });
    const pp = await cli(['postprocess', '-c', config, '--json']);
    expect(pp.code, pp.out).toBe(0);
    const result = jsonLine<MergeJobResult>(pp.out, '{"flowId"');
    expect(result.report?.newRows).toBe(3);
    expect(result.report?.dflash).toMatchObject({
      rowsWithoutAnchor: 2,
      newRowsWithoutAnchor: 0,
      maskToken: { token: MASK, id: MASK_ID },
    });
    expect(Object.values(result.report?.dflash?.anchorPositions ?? {}).reduce((a, n) => a + n, 0)).toBe(6);

    const status = await cli(['status', '-c', config]);
    expect(status.code, status.out).toBe(0);
    expect(status.out).toMatch(
      /6 rows, [\d,]+ tokens in \d+ shards \(3 new\), 2 with fewer than 2 adjacent supervised tokens \(left out by a DFlash export\)/,
    );

    // The printed summary, and a merge refused at once for a mask token that is the eos token.
    const more = path.join(tmp.dir, 'talk2.jsonl');
    writeFileSync(
      more,
      `${JSON.stringify({
        id: 'u0',
        messages: [
          { role: 'user', content: 'Hi?' },
          { role: 'assistant', content: 'Hello there, friend.' },
        ],
      })}\n`,
    );
    const printed = writeTestConfig(tmp.dir, {
      run,
      redis,
      datasets: [
        { name: 'talk', conversations: 'talk.jsonl' },
        { name: 'talk2', conversations: 'talk2.jsonl' },
      ],
      postprocess: { dflash: { maskToken: MASK } },
    });
    const text = await cli(['postprocess', '-c', printed]);
    expect(text.code, text.out).toBe(0);
    expect(text.out).toMatch(/DFlash {14}2 rows with fewer than 2 adjacent supervised tokens \(new: 0\)/);
    expect(text.out).toMatch(/anchor positions {4}per row: 0: 2, /);
    expect(text.out).toContain(`DFlash mask token   ${MASK} (id ${MASK_ID}): special, in no new row`);

    const eos = path.join(tmp.dir, 'talk3.jsonl');
    writeFileSync(
      eos,
      `${JSON.stringify({
        id: 'v0',
        messages: [
          { role: 'user', content: 'Yes?' },
          { role: 'assistant', content: 'Yes indeed.' },
        ],
      })}\n`,
    );
    const bad = writeTestConfig(tmp.dir, {
      run,
      redis,
      datasets: [{ name: 'talk3', conversations: 'talk3.jsonl' }],
      postprocess: { dflash: { maskToken: '<|im_end|>' } },
    });
    const failed = await cli(['postprocess', '-c', bad]);
    expect(failed.code).not.toBe(0);
    expect(failed.out).toContain('postprocess.dflash.maskToken: "<|im_end|>" (id 151645) is the eos token');
  });
});
