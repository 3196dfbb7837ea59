/**
 * The eval split holds out by content as well as by id, across every dataset of the run (real CLI
 * processes, real Redis, the simulator over HTTP): a held-out prompt's twins — the same prompt
 * under a second id in its own dataset, in another dataset beside a system prompt, and in a
 * dataset generated before the split existed — are neither generated nor in the training dataset,
 * and `status` counts them.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { evalHoldoutKey } from '../../src/producers/eval-split.js';
import { readHfDataset, type ConfigInput } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, sampleIdOfRid, spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 11, outputLength: { distribution: 'fixed', mean: 8 } },
  tmp: 'tm-eval-content-',
  cli: true,
});

const SHARED = 'Which river runs through the capital of the country with the most castles?';

describe('evalHoldout by content', () => {
  it("a held-out prompt's twins in any dataset, under any id, are neither generated nor trained on", async () => {
    // Dataset a holds out one prompt (evalHoldout: 1): the one with the smallest key.
    const aIds = Array.from({ length: 6 }, (_, i) => `a-${i}`);
    const held = [...aIds].sort((x, y) => (evalHoldoutKey('a', x) < evalHoldoutKey('a', y) ? -1 : 1))[0] ?? '';
    const dup = aIds.find((id) => id !== held) ?? '';
    writePrompts(tmp.dir, 'a', 6, (i) => {
      const id = `a-${i}`;
      // Its twin in the same dataset: another id, the same words spaced otherwise.
      if (id === held) return { id, prompt: SHARED };
      if (id === dup) return { id, prompt: `  ${SHARED.replace(/ /g, '   ')}\n` };
      return { id, prompt: `Prompt ${i} of a: describe the number ${i * 7}.` };
    });
    // Generated before the split existed: its twin b-1 has rows already.
    writePrompts(tmp.dir, 'b', 4, (i) => ({
      id: `b-${i}`,
      prompt: i === 1 ? SHARED : `Prompt ${i} of b: name ${i + 2} colours.`,
    }));
    // Another dataset: its twin c-2 under a system prompt.
    writePrompts(tmp.dir, 'c', 4, (i) => ({
      id: `c-${i}`,
      messages: [
        { role: 'system', content: 'You answer briefly.' },
        { role: 'user', content: i === 2 ? SHARED : `Prompt ${i} of c: count to ${i + 3}.` },
      ],
    }));
    const ds = (name: string, extra: object = {}): NonNullable<ConfigInput['datasets']>[number] => ({
      name,
      prompts: `${name}.jsonl`,
      tokenBudget: 1_000_000,
      maxNewTokens: 8,
      batchSize: 2,
      ...extra,
    });
    const target = path.join(tmp.dir, 'train-dataset');
    const config = (datasets: ConfigInput['datasets'], name: string): string =>
      writeConfig(
        tmp.dir,
        {
          run: 'twins',
          redis: { url: redis.url, prefix: redis.prefix },
          sglang: { endpoints: [sim.url], concurrency: 8, contextLength: 4096 },
          datasets,
          output: { dir: 'out' },
          postprocess: { keepTruncated: true, target },
        },
        name,
      );
    const runDir = path.join(tmp.dir, 'out', 'twins');

    // 1. b alone, generated without any split (its post-process round queued, not run yet).
    const first = config([ds('b')], 'first.yaml');
    const worker = spawnCli(['worker', '-c', first]);
    try {
      const producer = spawnCli(['produce', '-c', first]);
      expect(await producer.exited, producer.output()).toBe(0);
    } finally {
      worker.child.kill('SIGTERM');
      await worker.exited;
    }
    expect(
      readGenerations(runDir, 'b')
        .map((r) => r.id)
        .sort(),
    ).toEqual(['b-0', 'b-1', 'b-2', 'b-3']);
    const sentBefore = sim.stats().requests.length;

    // 2. a with its split, b and c: the whole pipeline.
    const second = config([ds('a', { evalHoldout: 1 }), ds('b'), ds('c')], 'second.yaml');
    const run = spawnCli(['run', '-c', second]);
    expect(await run.exited, run.output()).toBe(0);
    // The round queued by step 1 (b) ran in step 2; one more over every dataset.
    const pp = spawnCli(['postprocess', '-c', second]);
    expect(await pp.exited, pp.output()).toBe(0);

    const split = readFileSync(path.join(runDir, 'a', 'eval-prompts.jsonl'), 'utf8')
      .trim()
      .split('\n');
    expect(split.map((l) => (JSON.parse(l) as { id: string }).id)).toEqual([held]);

    // Never sent, never generated.
    const sent = sim
      .stats()
      .requests.slice(sentBefore)
      .map((r) => `${r.rid.slice(0, r.rid.indexOf('/'))}/${sampleIdOfRid(r.rid)}`);
    expect(sent.filter((s) => [`a/${held}`, `a/${dup}`, 'c/c-2'].includes(s))).toEqual([]);
    const generated = (name: string): string[] =>
      readGenerations(runDir, name)
        .map((r) => r.id)
        .sort();
    expect(generated('a')).toEqual(aIds.filter((id) => id !== held && id !== dup).sort());
    expect(generated('c')).toEqual(['c-0', 'c-1', 'c-3']);

    // Not in the training dataset: b-1's rows from before the split included.
    const rows: string[] = [];
    for await (const r of (await readHfDataset(target)).rows()) {
      const row = r as { dataset: string; id: string };
      rows.push(`${row.dataset}/${row.id}`);
    }
    const want = [
      ...aIds.filter((id) => id !== held && id !== dup).map((id) => `a/${id}`),
      'b/b-0',
      'b/b-2',
      'b/b-3',
      'c/c-0',
      'c/c-1',
      'c/c-3',
    ];
    expect(rows.sort()).toEqual(want.sort());

    // Said: the file the tokenize step reads, and status.
    const ids = JSON.parse(readFileSync(path.join(runDir, 'b', 'eval-held-out-ids.json'), 'utf8')) as {
      sameContent: { id: string; as: string }[];
    };
    expect(ids.sameContent).toEqual([{ id: 'b-1', as: `a/${held}` }]);
    const status = spawnCli(['status', '-c', second]);
    expect(await status.exited, status.output()).toBe(0);
    expect(status.stdout()).toContain(
      'a: held out for eval: 1 by id (eval-prompts.jsonl), 1 same content as a held-out prompt',
    );
    expect(status.stdout()).toContain('b: held out for eval: 0 by id (eval-prompts.jsonl), 1 same content');
    expect(status.stdout()).toContain('c: held out for eval: 0 by id (eval-prompts.jsonl), 1 same content');
  }, 240_000);
});
