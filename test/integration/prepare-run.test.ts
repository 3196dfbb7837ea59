// `run` prepares the datasets' sources first, `status` shows the prepare numbers, and a run
// whose prompts changed under it is refused (the dataset named, --fresh offered) until --fresh.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { RunStatus } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli } from '../helpers/pipeline.js';

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: { timeScale: 100, maxRunningRequests: 16, seed: 3, outputLength: { distribution: 'fixed', mean: 20 } },
  tmp: 'tm-prepare-run-',
  cli: true,
});
let configPath: string;

const sourceFile = (): string => path.join(tmp.dir, 'chats.jsonl');
const promptsFile = (): string => path.join(tmp.dir, 'out', 'prep', 'chats', 'prompts.jsonl');

function writeSource(n: number, variant = ''): void {
  const rows = [];
  for (let i = 0; i < n; i += 1) {
    rows.push(
      JSON.stringify({
        id: `c${i}`,
        conversations: [
          { from: 'human', value: `question ${i}${variant}` },
          { from: 'gpt', value: `answer ${i}` },
        ],
      }),
    );
  }
  rows.push(JSON.stringify({ id: 'dup', conversations: [{ from: 'human', value: 'question 0' + variant }] }));
  rows.push('{"id": "broken", ');
  writeFileSync(sourceFile(), `${rows.join('\n')}\n`);
}

beforeAll(() => {
  writeSource(12);
  writeFileSync(path.join(tmp.dir, 'plain.jsonl'), `${JSON.stringify({ id: 'p1', prompt: 'plain prompt' })}\n`);
  configPath = writeTestConfig(tmp.dir, {
    run: 'prep',
    redis,
    sim,
    sglang: { concurrency: 8 },
    datasets: [
      { name: 'chats', source: { path: 'chats.jsonl' }, tokenBudget: 100_000, maxNewTokens: 32, batchSize: 4 },
      { name: 'plain', prompts: 'plain.jsonl', tokenBudget: 100_000, maxNewTokens: 32, batchSize: 4 },
    ],
  });
});

async function cli(args: string[], expectCode = 0): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  if (code !== expectCode)
    throw new Error(`tokenmill ${args.join(' ')} exited ${code}, expected ${expectCode}:\n${p.output()}`);
  return p.output();
}

async function status(): Promise<RunStatus> {
  const out = await cli(['status', '-c', configPath, '--json']);
  return JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as RunStatus;
}

describe('run with a source', () => {
  it('prepares the source, generates from the prompt file, and status shows the prepare numbers', async () => {
    const out = await cli(['run', '-c', configPath]);
    expect(out).toMatch(/tokenmill prepare: chats: prepared 12 prompts into/);
    const gens = readGenerations(path.join(tmp.dir, 'out', 'prep'), 'chats');
    expect(gens.map((g) => g.id).sort()).toEqual(Array.from({ length: 12 }, (_, i) => `c${i}`).sort());
    const s = await status();
    const prepare = s.phases.find((p) => p.name === 'prepare');
    expect(prepare?.status).toBe('completed');
    expect(prepare?.detail).toMatch(/^1 source: 14 rows read, 12 kept, 1 duplicates, 0 too long, 0 empty, 1 malformed/);
    expect(s.datasets.find((d) => d.name === 'chats')?.prepared).toEqual({
      rows: 14,
      kept: 12,
      duplicates: 1,
      tooLong: 0,
      empty: 0,
      malformed: 1,
    });
    expect(s.datasets.find((d) => d.name === 'plain')?.prepared).toBeNull();
    const table = await cli(['status', '-c', configPath]);
    expect(table).toMatch(/prepare: 1 source: 14 rows read, 12 kept/);
  });

  it('a second run on the unchanged source keeps the prompt file and resumes', async () => {
    const before = readFileSync(promptsFile());
    const out = await cli(['run', '-c', configPath]);
    expect(out).toMatch(/chats: unchanged since the last prepare/);
    expect(readFileSync(promptsFile()).equals(before)).toBe(true);
    expect(readGenerations(path.join(tmp.dir, 'out', 'prep'), 'chats')).toHaveLength(12);
  });

  it('refuses to resume when the source changed, naming the dataset, until --fresh', async () => {
    const before = readFileSync(promptsFile());
    writeSource(15, ' (edited)');
    const out = await cli(['run', '-c', configPath], 1);
    expect(out).toMatch(/dataset "chats": its prompts changed since run "prep" started/);
    expect(out).toMatch(/--fresh/);
    expect(out).toMatch(/new run name/);
    // The run's prompt file stays as it was.
    expect(readFileSync(promptsFile()).equals(before)).toBe(true);
    const prepareCli = await cli(['prepare', '-c', configPath], 1);
    expect(prepareCli).toMatch(/dataset "chats": its prompts changed/);

    const fresh = await cli(['run', '-c', configPath, '--fresh']);
    expect(fresh).toMatch(/--fresh: run "prep" starts over/);
    expect(fresh).toMatch(/chats: prepared 15 prompts/);
    const gens = readGenerations(path.join(tmp.dir, 'out', 'prep'), 'chats');
    expect(gens).toHaveLength(15);
    expect(readFileSync(promptsFile(), 'utf8')).toMatch(/\(edited\)/);
    const s = await status();
    expect(s.datasets.find((d) => d.name === 'chats')).toMatchObject({ records: 15, status: 'completed' });
    expect(s.datasets.find((d) => d.name === 'plain')).toMatchObject({ records: 1, status: 'completed' });
  });
});
