/**
 * `datasets[].evalHoldout` end to end (real CLI processes, real Redis, the simulator over HTTP):
 * the held-out prompts are never sent — in a plain run, with `samplesPerPrompt`, after the
 * producer is killed with SIGKILL and its prompt file grows, with two producers started at once,
 * for whole conversations with `turns: all` — and eval-prompts.jsonl holds exactly them, verbatim.
 */
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parsePromptLine, RunKeys, type ConfigInput, type RunStatus } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { writeConversations, type TurnRecord } from '../helpers/conversations.js';
import {
  duplicates,
  readGenerations,
  sampleIdOfRid,
  spawnCli,
  waitFor,
  writeConfig,
  writePrompts,
} from '../helpers/pipeline.js';

const { redis, sim, tmp, startSim } = useHarness({
  redis: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 7, outputLength: { distribution: 'fixed', mean: 8 } },
  tmp: 'tm-eval-holdout-',
  cli: true,
});

/** The lines of a JSONL file. */
const linesOf = (file: string): string[] =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '');

const idOf = (line: string): string => (JSON.parse(line) as { id: string }).id;

/** The eval split of a dataset: its ids, checked to be lines of the prompt file, verbatim and in its order. */
function evalSplit(runDir: string, dataset: string, promptsFile: string, turns: 'last' | 'all' = 'last'): string[] {
  const file = path.join(runDir, dataset, 'eval-prompts.jsonl');
  const held = linesOf(file);
  for (const [i, l] of held.entries()) expect(parsePromptLine(l, file, i + 1, { turns }).ok, l).toBe(true);
  const ids = new Set(held.map(idOf));
  expect(held).toEqual(linesOf(promptsFile).filter((l) => ids.has(idOf(l))));
  return held.map(idOf);
}

/** Sample ids the simulator was sent for a dataset. */
const sentIds = (s: { stats(): { requests: { rid: string }[] } }, dataset: string): string[] =>
  s
    .stats()
    .requests.filter((r) => r.rid.startsWith(`${dataset}/`))
    .map((r) => sampleIdOfRid(r.rid));

async function statusOf(configPath: string): Promise<{ json: RunStatus; text: string }> {
  const j = spawnCli(['status', '-c', configPath, '--json']);
  expect(await j.exited, j.output()).toBe(0);
  const t = spawnCli(['status', '-c', configPath]);
  expect(await t.exited, t.output()).toBe(0);
  return { json: JSON.parse(j.stdout().trim().split('\n').at(-1) ?? '{}') as RunStatus, text: t.stdout() };
}

function config(run: string, datasets: ConfigInput['datasets'], simUrl = sim.url, extra: Partial<ConfigInput> = {}) {
  return writeConfig(
    tmp.dir,
    {
      run,
      redis: { url: redis.url, prefix: redis.prefix },
      sglang: { endpoints: [simUrl], concurrency: 8, contextLength: 4096 },
      datasets,
      output: { dir: 'out' },
      postprocess: { keepTruncated: true },
      ...extra,
    },
    `${run}.yaml`,
  );
}

describe('evalHoldout', () => {
  it('a run generates every prompt but the held-out ones, whose lines eval-prompts.jsonl holds', async () => {
    const p = writePrompts(tmp.dir, 'plain', 40);
    const s = writePrompts(tmp.dir, 'multi', 10);
    const cfg = config('plain', [
      { name: 'p', prompts: 'plain.jsonl', tokenBudget: 1_000_000, maxNewTokens: 8, batchSize: 4, evalHoldout: 0.2 },
      {
        name: 's',
        prompts: 'multi.jsonl',
        tokenBudget: 1_000_000,
        maxNewTokens: 8,
        batchSize: 4,
        samplesPerPrompt: 2,
        evalHoldout: 3,
      },
    ]);
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const runDir = path.join(tmp.dir, 'out', 'plain');

    const heldP = evalSplit(runDir, 'p', p);
    expect(heldP).toHaveLength(8);
    const allP = Array.from({ length: 40 }, (_, i) => `plain-${i}`);
    const genP = readGenerations(runDir, 'p').map((r) => r.id);
    expect(duplicates(genP)).toEqual([]);
    expect(genP.sort()).toEqual(allP.filter((id) => !heldP.includes(id)).sort());
    expect(sentIds(sim, 'p').filter((id) => heldP.includes(id))).toEqual([]);

    // With samplesPerPrompt a held-out prompt is held out with every sample.
    const heldS = evalSplit(runDir, 's', s);
    expect(heldS).toHaveLength(3);
    const genS = readGenerations(runDir, 's').map((r) => r.id);
    const wantS = Array.from({ length: 10 }, (_, i) => `multi-${i}`)
      .filter((id) => !heldS.includes(id))
      .flatMap((id) => [`${id}#s1`, `${id}#s2`]);
    expect(genS.sort()).toEqual(wantS.sort());
    expect(sentIds(sim, 's').filter((id) => heldS.some((h) => id.startsWith(`${h}#`)))).toEqual([]);

    // Completed on the other prompts alone; status counts them and says what is held out.
    const { json, text } = await statusOf(cfg);
    const dp = json.datasets.find((d) => d.name === 'p');
    expect(dp?.status).toBe('completed');
    expect(dp?.evalHeldOut).toBe(8);
    expect(json.datasets.find((d) => d.name === 's')?.evalHeldOut).toBe(3);
    expect(
      Number(await redis.connection('client').hget(new RunKeys(redis.prefix, 'plain').stats('p'), 'prompts')),
    ).toBe(32);
    expect(text).toContain('p: 8 held out for eval');
    expect(text).toContain('s: 3 held out for eval');
    const manifest = JSON.parse(readFileSync(path.join(runDir, 'p', 'eval-prompts.json'), 'utf8')) as {
      count: number;
      sourceFile: string;
    };
    expect(manifest).toMatchObject({ count: 8, sourceFile: p });
  }, 180_000);

  it('a producer killed with SIGKILL mid-run and a grown prompt file keep the split; none of it is generated', async () => {
    // Slow requests (~1 s each) so that the kill lands mid-generation.
    const slow = await startSim({
      timeScale: 8,
      maxRunningRequests: 16,
      seed: 13,
      outputLength: { distribution: 'lognormal', mean: 300, sigma: 0.5 },
    });
    const p = writePrompts(tmp.dir, 'kill', 60);
    const cfg = config(
      'kill',
      [
        {
          name: 'k',
          prompts: 'kill.jsonl',
          tokenBudget: 1_000_000_000,
          maxNewTokens: 1024,
          batchSize: 4,
          evalHoldout: 0.1,
        },
      ],
      slow.url,
      { workers: { lockDurationMs: 2_000, stalledIntervalMs: 1_000, leaseTtlMs: 2_000 } },
    );
    const runDir = path.join(tmp.dir, 'out', 'kill');
    const keys = new RunKeys(redis.prefix, 'kill');
    const conn = redis.connection('client');
    const committed = async (): Promise<number> => Number((await conn.hget(keys.stats('k'), 'records')) ?? 0);
    const producer = spawnCli(['produce', '-c', cfg]);
    const worker = spawnCli(['worker', '-c', cfg]);
    try {
      await waitFor(async () => (await committed()) >= 8, 'first commits', 60_000);
      producer.child.kill('SIGKILL');
      expect(await producer.exited).toBe('SIGKILL');
      expect(await committed()).toBeLessThan(54);
      const evalFile = path.join(runDir, 'k', 'eval-prompts.jsonl');
      const written = readFileSync(evalFile, 'utf8');
      const held = evalSplit(runDir, 'k', p);
      expect(held).toHaveLength(6);

      // 40 more prompts: split again it would hold 10 prompts; the 6 written stay, the new ones are generated.
      appendFileSync(
        p,
        `${Array.from({ length: 40 }, (_, i) => JSON.stringify({ id: `kill-${60 + i}`, prompt: `Added prompt ${i}.` })).join('\n')}\n`,
      );
      const again = spawnCli(['produce', '-c', cfg]);
      expect(await again.exited, again.output()).toBe(0);
      expect(readFileSync(evalFile, 'utf8')).toBe(written);
      // Logged as JSON: the quotes around the dataset's name come escaped.
      const warnings = again.output().split('is kept as it was written (6 prompts)').length - 1;
      expect(warnings, again.output()).toBe(1);
      expect(again.output()).toContain(evalFile);

      const gen = readGenerations(runDir, 'k').map((r) => r.id);
      expect(duplicates(gen)).toEqual([]);
      const all = Array.from({ length: 100 }, (_, i) => `kill-${i}`);
      expect(gen.sort()).toEqual(all.filter((id) => !held.includes(id)).sort());
      expect(sentIds(slow, 'k').filter((id) => held.includes(id))).toEqual([]);
      expect((await statusOf(cfg)).json.datasets[0]?.status).toBe('completed');
    } finally {
      worker.child.kill('SIGTERM');
      await worker.exited;
    }
  }, 240_000);

  it('two producers started at once: one feeds, the split is written once, none of it is generated', async () => {
    const p = writePrompts(tmp.dir, 'race', 30);
    const cfg = config('race', [
      { name: 'r', prompts: 'race.jsonl', tokenBudget: 1_000_000, maxNewTokens: 8, batchSize: 4, evalHoldout: 5 },
    ]);
    const a = spawnCli(['produce', '-c', cfg]);
    const b = spawnCli(['produce', '-c', cfg]);
    const worker = spawnCli(['worker', '-c', cfg]);
    try {
      const codes = [await a.exited, await b.exited];
      expect(
        codes.filter((c) => c === 0),
        a.output() + b.output(),
      ).toHaveLength(1);
      expect(a.output() + b.output()).toContain('another producer is running');
    } finally {
      worker.child.kill('SIGTERM');
      await worker.exited;
    }
    const runDir = path.join(tmp.dir, 'out', 'race');
    const held = evalSplit(runDir, 'r', p);
    expect(held).toHaveLength(5);
    const gen = readGenerations(runDir, 'r').map((r) => r.id);
    const all = Array.from({ length: 30 }, (_, i) => `race-${i}`);
    expect(gen.sort()).toEqual(all.filter((id) => !held.includes(id)).sort());
  }, 180_000);

  it('turns: all holds out whole conversations: no turn of one is generated', async () => {
    const c = writeConversations(tmp.dir, 'conv', 10, 2);
    const cfg = config('conv', [
      { name: 'c', prompts: 'conv.jsonl', turns: 'all', tokenBudget: 1_000_000, maxNewTokens: 8, evalHoldout: 3 },
    ]);
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const runDir = path.join(tmp.dir, 'out', 'conv');
    const held = evalSplit(runDir, 'c', c, 'all');
    expect(held).toHaveLength(3);
    // The whole conversation, with every turn (and the source's answers), as the file has it.
    for (const l of linesOf(path.join(runDir, 'c', 'eval-prompts.jsonl'))) {
      const messages = (JSON.parse(l) as { messages: { role: string }[] }).messages;
      expect(messages.filter((m) => m.role !== 'system').map((m) => m.role)).toEqual([
        'user',
        'assistant',
        'user',
        'assistant',
      ]);
    }
    const records = readGenerations(runDir, 'c') as unknown as TurnRecord[];
    const want = Array.from({ length: 10 }, (_, i) => `conv-${i}`)
      .filter((id) => !held.includes(id))
      .flatMap((id) => [`${id}#t1`, `${id}#t2`]);
    expect(records.map((r) => r.id).sort()).toEqual(want.sort());
    expect(records.filter((r) => held.includes(r.conversation_id))).toEqual([]);
    expect(sentIds(sim, 'c').filter((id) => held.some((h) => id.startsWith(`${h}#`)))).toEqual([]);
  }, 180_000);

  it('is refused for a run that generated without it, until --fresh starts the run over', async () => {
    writePrompts(tmp.dir, 'late', 12);
    const ds = { name: 'l', prompts: 'late.jsonl', tokenBudget: 1_000_000, maxNewTokens: 8, batchSize: 4 };
    const first = spawnCli(['run', '-c', config('late', [ds])]);
    expect(await first.exited, first.output()).toBe(0);
    const cfg = config('late', [{ ...ds, evalHoldout: 2 }]);
    const refused = spawnCli(['run', '-c', cfg]);
    expect(await refused.exited).not.toBe(0);
    expect(refused.output()).toContain('dataset "l" (datasets[].evalHoldout): the run has generated from its prompts');
    expect(refused.output()).toContain('--fresh');
    const runDir = path.join(tmp.dir, 'out', 'late');
    expect(existsSync(path.join(runDir, 'l', 'eval-prompts.jsonl'))).toBe(false);
    const fresh = spawnCli(['run', '-c', cfg, '--fresh']);
    expect(await fresh.exited, fresh.output()).toBe(0);
    const held = evalSplit(runDir, 'l', path.join(tmp.dir, 'late.jsonl'));
    expect(held).toHaveLength(2);
    expect(readGenerations(runDir, 'l')).toHaveLength(10);
  }, 180_000);
});
