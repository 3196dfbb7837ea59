/**
 * `evalHoldout` on a `source` dataset: `tokenmill prepare` writes the prompt file and the eval
 * split beside it and says how many it held out; `run` generates the rest; a changed
 * `evalHoldout` keeps the split with one warning naming the file; `run --fresh` splits again.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { parsePromptLine, type ConfigInput } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, writeConfig } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 9, outputLength: { distribution: 'fixed', mean: 8 } },
  tmp: 'tm-eval-prepare-',
  cli: true,
});

const runDir = (): string => path.join(tmp.dir, 'out', 'src');
const evalFile = (): string => path.join(runDir(), 'chats', 'eval-prompts.jsonl');
const promptsFile = (): string => path.join(runDir(), 'chats', 'prompts.jsonl');
const linesOf = (file: string): string[] =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '');
const idOf = (line: string): string => (JSON.parse(line) as { id: string }).id;

function configWith(evalHoldout: number): string {
  const cfg: ConfigInput = {
    run: 'src',
    redis: { url: redis.url, prefix: redis.prefix },
    sglang: { endpoints: [sim.url], concurrency: 8, contextLength: 4096 },
    datasets: [
      {
        name: 'chats',
        source: { path: 'chats.jsonl' },
        tokenBudget: 1_000_000,
        maxNewTokens: 8,
        batchSize: 4,
        evalHoldout,
      },
    ],
    output: { dir: 'out' },
    postprocess: { keepTruncated: true },
  };
  return writeConfig(tmp.dir, cfg);
}

async function cli(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  if (code !== 0) throw new Error(`tokenmill ${args.join(' ')} exited ${code}:\n${p.output()}`);
  return p.output();
}

beforeAll(() => {
  const rows = Array.from({ length: 30 }, (_, i) =>
    JSON.stringify({
      id: `c${i}`,
      conversations: [
        { from: 'human', value: `question ${i}: how does ${i} relate to ${i + 1}?` },
        { from: 'gpt', value: `answer ${i}` },
      ],
    }),
  );
  rows.push('{"id": "broken", ');
  writeFileSync(path.join(tmp.dir, 'chats.jsonl'), `${rows.join('\n')}\n`);
});

describe('evalHoldout with a source', () => {
  it('prepare splits the prepared prompts, run generates the rest, the split stays until --fresh', async () => {
    let cfg = configWith(0.2);
    const prepared = await cli(['prepare', '-c', cfg]);
    expect(prepared).toMatch(/chats: prepared 30 prompts into .*; 6 held out for eval in .*eval-prompts\.jsonl/);
    const report = JSON.parse(readFileSync(path.join(runDir(), 'chats', 'prepare-report.json'), 'utf8')) as {
      evalHeldOut?: number;
    };
    expect(report.evalHeldOut).toBe(6);
    // The lines of the prepared prompt file, verbatim, in its order; read by the producer's parser.
    const held = linesOf(evalFile());
    const ids = new Set(held.map(idOf));
    expect(ids.size).toBe(6);
    expect(held).toEqual(linesOf(promptsFile()).filter((l) => ids.has(idOf(l))));
    for (const [i, l] of held.entries()) expect(parsePromptLine(l, evalFile(), i + 1).ok).toBe(true);
    const written = readFileSync(evalFile(), 'utf8');

    const run = await cli(['run', '-c', cfg]);
    expect(run).toMatch(/unchanged since the last prepare.*; 6 held out for eval in/);
    const gen = readGenerations(runDir(), 'chats').map((r) => r.id);
    expect(gen.sort()).toEqual(
      Array.from({ length: 30 }, (_, i) => `c${i}`)
        .filter((id) => !ids.has(id))
        .sort(),
    );
    expect(readFileSync(evalFile(), 'utf8')).toBe(written);

    // Another rule on the same run: the split is kept, said once (prepare and producer are one process).
    cfg = configWith(10);
    const again = await cli(['run', '-c', cfg]);
    expect(again.split('is kept as it was written (6 prompts)').length - 1, again).toBe(1);
    expect(again).toContain(evalFile());
    expect(again).toContain('datasets[].evalHoldout changed from 0.2 to 10');
    expect(readFileSync(evalFile(), 'utf8')).toBe(written);
    expect(readGenerations(runDir(), 'chats')).toHaveLength(24);

    // Starting over splits again, by the new rule.
    const fresh = await cli(['run', '-c', cfg, '--fresh']);
    expect(fresh).toMatch(/10 held out for eval in/);
    const heldNow = linesOf(evalFile()).map(idOf);
    expect(heldNow).toHaveLength(10);
    // The same order of keys: the 6 of the old split are among the 10 smallest.
    for (const id of ids) expect(heldNow).toContain(id);
    expect(
      readGenerations(runDir(), 'chats')
        .map((r) => r.id)
        .filter((id) => heldNow.includes(id)),
    ).toEqual([]);
    expect(readGenerations(runDir(), 'chats')).toHaveLength(20);
  }, 240_000);
});
