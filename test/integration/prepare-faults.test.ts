// `prepare` at its worst moments: killed while writing (the old prompt file stays, whole; the
// next prepare cleans up and finishes), and two processes preparing the same dataset at once.
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli, waitFor } from '../helpers/pipeline.js';

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-prepare-faults-', cli: true });

/** A ShareGPT JSONL source of `n` rows; `tag` changes every prompt. */
function writeSource(file: string, n: number, tag: string): void {
  const lines: string[] = [];
  for (let i = 0; i < n; i += 1) {
    const text = `${tag} question ${i}: ${'lorem ipsum dolor sit amet '.repeat(4 + (i % 8))}`;
    lines.push(
      JSON.stringify({
        id: `q${i}`,
        conversations: [
          { from: 'human', value: text },
          { from: 'gpt', value: `answer ${i}` },
        ],
      }),
    );
  }
  writeFileSync(file, `${lines.join('\n')}\n`);
}

function setup(name: string, rows: number, tag: string): { config: string; prompts: string; folder: string } {
  const source = path.join(tmp.dir, `${name}.jsonl`);
  writeSource(source, rows, tag);
  const config = writeTestConfig(
    tmp.dir,
    {
      run: name,
      redis,
      datasets: [{ name: 'd', source: { path: `${name}.jsonl` }, tokenBudget: 1000 }],
    },
    `${name}.yaml`,
  );
  const folder = path.join(tmp.dir, 'out', name, 'd');
  return { config, prompts: path.join(folder, 'prompts.jsonl'), folder };
}

const sha = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');
const tempFiles = (folder: string): string[] =>
  existsSync(folder) ? readdirSync(folder).filter((f) => f.startsWith('.')) : [];

async function prepare(config: string): Promise<string> {
  const p = spawnCli(['prepare', '-c', config]);
  const code = await p.exited;
  if (code !== 0) throw new Error(`prepare exited ${code}:\n${p.output()}`);
  return p.output();
}

/** Starts `prepare` and SIGKILLs it once its temp file holds some lines. */
async function killWhileWriting(config: string, folder: string): Promise<void> {
  const p = spawnCli(['prepare', '-c', config]);
  const temp = await waitFor(
    () => {
      const t = tempFiles(folder).find((f) => f.endsWith('.tmp'));
      return t !== undefined && statSync(path.join(folder, t)).size > 1 << 20 ? t : undefined;
    },
    'the temp prompt file to grow',
    60_000,
    10,
  );
  p.child.kill('SIGKILL');
  await p.exited;
  expect(temp).toMatch(/^\.prompts\.jsonl\./);
}

describe('prepare faults', () => {
  it('killed while writing: no prompt file, or the old one whole; the next prepare removes the temp file and finishes', async () => {
    const rows = 60_000;
    const s = setup('killed', rows, 'v1');
    await killWhileWriting(s.config, s.folder);
    expect(existsSync(s.prompts)).toBe(false);
    expect(tempFiles(s.folder).some((f) => f.endsWith('.tmp'))).toBe(true);

    const out = await prepare(s.config);
    expect(out).toMatch(/d: prepared 60,000 prompts into/);
    expect(tempFiles(s.folder)).toEqual([]);
    const first = sha(s.prompts);
    expect(
      readFileSync(s.prompts, 'utf8')
        .split('\n')
        .filter((l) => l !== ''),
    ).toHaveLength(rows);

    // A changed source, killed again: the file of the last complete prepare stays as it was.
    writeSource(path.join(tmp.dir, 'killed.jsonl'), rows, 'v2');
    await killWhileWriting(s.config, s.folder);
    expect(sha(s.prompts)).toBe(first);
    const again = await prepare(s.config);
    expect(again).toMatch(/d: prepared 60,000 prompts into/);
    expect(sha(s.prompts)).not.toBe(first);
    expect(readFileSync(s.prompts, 'utf8')).toMatch(/v2 question 59999/);
    expect(tempFiles(s.folder)).toEqual([]);
  });

  it('stopped (SIGTERM) while writing, by itself or inside run: it stops at once, removes its temp file and keeps the old prompt file', async () => {
    const s = setup('stopped', 60_000, 'v1');
    await prepare(s.config);
    const first = sha(s.prompts);
    writeSource(path.join(tmp.dir, 'stopped.jsonl'), 60_000, 'v2');
    for (const verb of ['prepare', 'run']) {
      const p = spawnCli([verb, '-c', s.config]);
      await waitFor(
        () => tempFiles(s.folder).some((f) => f.endsWith('.tmp') && statSync(path.join(s.folder, f)).size > 1 << 20),
        'the temp prompt file to grow',
        60_000,
        10,
      );
      p.child.kill('SIGTERM');
      const code = await p.exited;
      expect(code, p.output()).toBe(1);
      expect(p.output()).toMatch(
        /prepare of dataset "d" stopped after [\d,]+ rows \(SIGTERM\); its prompt file was left as it was/,
      );
      expect(tempFiles(s.folder)).toEqual([]);
      expect(sha(s.prompts)).toBe(first);
    }
  });

  it('two processes preparing the same dataset at once both finish, leaving one whole file', async () => {
    const s = setup('racing', 20_000, 'race');
    const a = spawnCli(['prepare', '-c', s.config]);
    const b = spawnCli(['prepare', '-c', s.config]);
    const codes = await Promise.all([a.exited, b.exited]);
    expect(codes, `${a.output()}\n${b.output()}`).toEqual([0, 0]);
    expect(tempFiles(s.folder)).toEqual([]);
    const raced = sha(s.prompts);
    const lines = readFileSync(s.prompts, 'utf8')
      .split('\n')
      .filter((l) => l !== '');
    expect(lines).toHaveLength(20_000);
    // Whatever the interleaving, a third prepare either keeps the file or writes the same bytes.
    const third = await prepare(s.config);
    expect(third).toMatch(/d: (unchanged|prepared)/);
    expect(sha(s.prompts)).toBe(raced);
  });
});
