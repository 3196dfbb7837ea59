// The eval split (`datasets[].evalHoldout`): which prompts, how many, written once, kept on resume.
import { createHash } from 'node:crypto';
import { appendFileSync, existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import {
  EVAL_MANIFEST_FILE,
  evalHoldoutCount,
  evalPromptsPath,
  readEvalSplit,
  resolveEvalHoldout,
  type EvalManifest,
} from '../../src/producers/index.js';
import { parsePromptLine, type Logger } from '../../src/shared/index.js';
import { tempDir } from '../helpers/pipeline.js';

const tmp = tempDir('tm-eval-holdout-');
afterAll(() => tmp.cleanup());

/** A logger whose warnings are kept. */
function capture(): { log: Logger; warnings: string[] } {
  const warnings: string[] = [];
  const log = pino(
    { level: 'info' },
    {
      write: (s: string) => {
        const rec = JSON.parse(s) as { level: number; msg: string };
        if (rec.level === 40) warnings.push(rec.msg);
      },
    },
  );
  return { log, warnings };
}

const promptLine = (i: number, name = 'p'): string =>
  JSON.stringify({ id: `${name}-${i}`, prompt: `Question ${i}: what is ${i} squared?` });

/** A folder with a prompt file of `n` prompts; returns its paths. */
function dataset(name: string, n: number, lines?: string[]): { dir: string; prompts: string; runDir: string } {
  const dir = path.join(tmp.dir, name);
  mkdirSync(dir, { recursive: true });
  const prompts = path.join(dir, 'prompts.jsonl');
  writeFileSync(prompts, `${(lines ?? Array.from({ length: n }, (_, i) => promptLine(i))).join('\n')}\n`);
  return { dir, prompts, runDir: path.join(dir, 'out', 'run') };
}

/** The K ids with the smallest sha256("<dataset>\n<id>"), worked out here from the documented rule. */
function expectedIds(dataset: string, ids: string[], k: number): string[] {
  const key = (id: string): string => createHash('sha256').update(`${dataset}\n${id}`).digest('hex').slice(0, 16);
  return [...ids].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : a < b ? -1 : 1)).slice(0, k);
}

const lines = (file: string): string[] =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '');

describe('evalHoldoutCount', () => {
  it('N holds out N (all of fewer); a fraction rounds half up, at least 1', () => {
    expect(evalHoldoutCount(10, 100)).toBe(10);
    expect(evalHoldoutCount(500, 100)).toBe(100);
    expect(evalHoldoutCount(1, 0)).toBe(0);
    expect(evalHoldoutCount(0.1, 95)).toBe(10); // 9.5 → 10
    expect(evalHoldoutCount(0.1, 94)).toBe(9); // 9.4 → 9
    expect(evalHoldoutCount(0.5, 3)).toBe(2); // 1.5 → 2
    expect(evalHoldoutCount(0.001, 100)).toBe(1); // 0.1 → at least 1
    expect(evalHoldoutCount(0.2, 0)).toBe(0);
  });
});

describe('resolveEvalHoldout', () => {
  it('holds out the smallest hashes of the ids, written verbatim in file order, with a manifest', async () => {
    const { prompts, runDir } = dataset('basic', 40);
    const { log } = capture();
    const h = await resolveEvalHoldout({
      ds: { name: 'p', evalHoldout: 5, turns: 'last' },
      promptsFile: prompts,
      runDir,
      log,
    });
    const all = Array.from({ length: 40 }, (_, i) => `p-${i}`);
    const want = expectedIds('p', all, 5);
    expect(h?.written).toBe(true);
    expect([...(h?.ids ?? [])].sort()).toEqual([...want].sort());
    const file = evalPromptsPath(runDir, 'p');
    expect(h?.file).toBe(file);
    // The lines as they are in the prompt file, in its order.
    const source = lines(prompts);
    expect(lines(file)).toEqual(source.filter((l) => want.includes((JSON.parse(l) as { id: string }).id)));
    // Read back with the producer's parser.
    for (const [i, l] of lines(file).entries()) expect(parsePromptLine(l, file, i + 1).ok).toBe(true);
    const m = JSON.parse(readFileSync(path.join(runDir, 'p', EVAL_MANIFEST_FILE), 'utf8')) as EvalManifest;
    expect(m).toMatchObject({ dataset: 'p', sourceFile: prompts, count: 5, rule: { evalHoldout: 5 } });
    expect(m.source.prompts).toBe(40);
    expect(m.idsSha256).toBe(
      createHash('sha256')
        .update(
          want
            .map((id) => `${id}\n`)
            .sort()
            .join(''),
        )
        .digest('hex'),
    );
    expect(Number.isNaN(Date.parse(m.created))).toBe(false);
    // No temp file left behind.
    expect(readdirSync(path.join(runDir, 'p')).sort()).toEqual(['eval-prompts.json', 'eval-prompts.jsonl']);
  });

  it('is the same split for the same prompts in any order, and another for another dataset name', async () => {
    const base = Array.from({ length: 60 }, (_, i) => promptLine(i));
    const shuffled = [...base].sort((a, b) =>
      createHash('md5').update(a).digest('hex').localeCompare(createHash('md5').update(b).digest('hex')),
    );
    expect(shuffled).not.toEqual(base);
    const { log } = capture();
    const ds = { name: 'p', evalHoldout: 0.1, turns: 'last' as const };
    const a = dataset('order-a', 0, base);
    const b = dataset('order-b', 0, shuffled);
    const ha = await resolveEvalHoldout({ ds, promptsFile: a.prompts, runDir: a.runDir, log });
    const hb = await resolveEvalHoldout({ ds, promptsFile: b.prompts, runDir: b.runDir, log });
    expect(ha?.count).toBe(6);
    expect([...(ha?.ids ?? [])].sort()).toEqual([...(hb?.ids ?? [])].sort());
    // Each file's own order.
    const idsOf = (f: string): string[] => lines(f).map((l) => (JSON.parse(l) as { id: string }).id);
    expect(idsOf(evalPromptsPath(b.runDir, 'p'))).toEqual(idsOf(b.prompts).filter((id) => hb?.ids.has(id)));
    const c = dataset('order-c', 0, base);
    const hc = await resolveEvalHoldout({ ds: { ...ds, name: 'q' }, promptsFile: c.prompts, runDir: c.runDir, log });
    expect([...(hc?.ids ?? [])].sort()).toEqual(expectedIds('q', idsOf(c.prompts), 6).sort());
    expect([...(hc?.ids ?? [])].sort()).not.toEqual([...(ha?.ids ?? [])].sort());
  });

  it('counts valid prompts with distinct ids only: rejects and repeated ids are never held out', async () => {
    const good = Array.from({ length: 9 }, (_, i) => promptLine(i));
    const { prompts, runDir } = dataset('rejects', 0, [
      ...good,
      'not json',
      JSON.stringify({ id: 'empty', prompt: '' }),
      JSON.stringify({ id: 'p-3', prompt: 'a second p-3' }),
      '',
      promptLine(9),
    ]);
    const { log } = capture();
    const h = await resolveEvalHoldout({
      ds: { name: 'p', evalHoldout: 0.5, turns: 'last' },
      promptsFile: prompts,
      runDir,
      log,
    });
    const all = Array.from({ length: 10 }, (_, i) => `p-${i}`);
    expect(h?.count).toBe(5);
    expect([...(h?.ids ?? [])].sort()).toEqual(expectedIds('p', all, 5).sort());
    // p-3's first line, never its repeat.
    expect(lines(evalPromptsPath(runDir, 'p')).some((l) => l.includes('a second p-3'))).toBe(false);
  });

  it('holds out whole conversations with turns: all', async () => {
    const conv = (i: number): string =>
      JSON.stringify({
        id: `c-${i}`,
        messages: [
          { role: 'user', content: `first ${i}` },
          { role: 'assistant', content: `answer ${i}` },
          { role: 'user', content: `second ${i}` },
          { role: 'assistant', content: `answer two ${i}` },
        ],
      });
    const { prompts, runDir } = dataset(
      'turns',
      0,
      Array.from({ length: 8 }, (_, i) => conv(i)),
    );
    const { log } = capture();
    const h = await resolveEvalHoldout({
      ds: { name: 'c', evalHoldout: 3, turns: 'all' },
      promptsFile: prompts,
      runDir,
      log,
    });
    const file = evalPromptsPath(runDir, 'c');
    expect(h?.count).toBe(3);
    for (const l of lines(file)) {
      const parsed = parsePromptLine(l, file, 1, { turns: 'all' });
      expect(parsed.ok && parsed.record.messages.length).toBe(4);
    }
    expect((await readEvalSplit(file, 'all')).ids.sort()).toEqual([...(h?.ids ?? [])].sort());
  });

  it('is fixed once written: appended prompts and a changed rule keep it, with one warning naming the file', async () => {
    const { prompts, runDir } = dataset('grow', 50);
    const ds = { name: 'p', evalHoldout: 0.1, turns: 'last' as const };
    const first = capture();
    const h1 = await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log: first.log });
    const file = evalPromptsPath(runDir, 'p');
    const written = readFileSync(file, 'utf8');
    // Resumed on the same file: read back, not recomputed, nothing to say.
    const again = capture();
    const h2 = await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log: again.log });
    expect(h2?.written).toBe(false);
    expect([...(h2?.ids ?? [])]).toEqual([...(h1?.ids ?? [])]);
    expect(again.warnings).toEqual([]);

    // 150 more prompts: split again it would hold 20, several of them new; it keeps its 5.
    appendFileSync(prompts, `${Array.from({ length: 150 }, (_, i) => promptLine(50 + i)).join('\n')}\n`);
    const all = Array.from({ length: 200 }, (_, i) => `p-${i}`);
    expect(expectedIds('p', all, 20).filter((id) => !h1?.ids.has(id)).length).toBeGreaterThan(0);
    const grown = capture();
    const h3 = await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log: grown.log });
    expect([...(h3?.ids ?? [])].sort()).toEqual([...(h1?.ids ?? [])].sort());
    expect(readFileSync(file, 'utf8')).toBe(written);
    expect(grown.warnings).toHaveLength(1);
    expect(grown.warnings[0]).toContain(file);
    expect(grown.warnings[0]).toContain('kept as it was written (5 prompts)');
    expect(grown.warnings[0]).toContain(`the prompt file ${prompts} changed`);
    // Once: the next check of the same file says nothing more.
    const twice = capture();
    await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log: twice.log });
    expect(twice.warnings).toEqual([]);

    // The rule changed: the same split, said once.
    const rule = capture();
    const h4 = await resolveEvalHoldout({
      ds: { ...ds, evalHoldout: 30 },
      promptsFile: prompts,
      runDir,
      log: rule.log,
    });
    expect([...(h4?.ids ?? [])].sort()).toEqual([...(h1?.ids ?? [])].sort());
    expect(rule.warnings).toHaveLength(1);
    expect(rule.warnings[0]).toContain('datasets[].evalHoldout changed from 0.1 to 30');
    // No longer configured: the split still stays out of generation.
    const unset = capture();
    const h5 = await resolveEvalHoldout({
      ds: { name: 'p', turns: 'last' },
      promptsFile: prompts,
      runDir,
      log: unset.log,
    });
    expect(h5?.count).toBe(5);
    expect(unset.warnings[0]).toContain('they stay out of generation');
    expect(readFileSync(file, 'utf8')).toBe(written);
  });

  it('a grown file that gives the same split says nothing and its manifest names the new version', async () => {
    const { prompts, runDir } = dataset('same', 30);
    const ds = { name: 'p', evalHoldout: 2, turns: 'last' as const };
    const { log } = capture();
    const h1 = await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log });
    // Append ids whose keys are larger than every held-out one: the 2 smallest stay the same.
    const held = expectedIds('p', [...(h1?.ids ?? [])], 2);
    const maxKey = held
      .map((id) => createHash('sha256').update(`p\n${id}`).digest('hex').slice(0, 16))
      .sort()
      .at(-1) as string;
    const extra: string[] = [];
    for (let i = 1000; extra.length < 5; i += 1) {
      const key = createHash('sha256').update(`p\np-${i}`).digest('hex').slice(0, 16);
      if (key > maxKey) extra.push(promptLine(i));
    }
    appendFileSync(prompts, `${extra.join('\n')}\n`);
    const later = capture();
    const h2 = await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log: later.log });
    expect([...(h2?.ids ?? [])]).toEqual([...(h1?.ids ?? [])]);
    expect(later.warnings).toEqual([]);
    const m = JSON.parse(readFileSync(path.join(runDir, 'p', EVAL_MANIFEST_FILE), 'utf8')) as EvalManifest;
    expect(m.source.prompts).toBe(35);
  });

  it('two at once publish one split; a temp file a killed process left is removed', async () => {
    const { prompts, runDir } = dataset('race', 80);
    const dir = path.join(runDir, 'p');
    mkdirSync(dir, { recursive: true });
    // A temp file of a process that no longer runs (pid 2^22 + 1 is above Linux's default pid_max).
    const hostTag = createHash('sha256')
      .update((await import('node:os')).hostname())
      .digest('hex')
      .slice(0, 8);
    const stale = path.join(dir, `.eval-prompts.jsonl.${hostTag}.4194305.0badcafe.tmp`);
    writeFileSync(stale, 'half a split');
    const ds = { name: 'p', evalHoldout: 7, turns: 'last' as const };
    const { log } = capture();
    const [a, b] = await Promise.all([
      resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log }),
      resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log }),
    ]);
    expect([...(a?.ids ?? [])].sort()).toEqual([...(b?.ids ?? [])].sort());
    expect(lines(evalPromptsPath(runDir, 'p'))).toHaveLength(7);
    expect(existsSync(stale)).toBe(false);
    expect(readdirSync(dir).filter((n) => n.endsWith('.tmp'))).toEqual([]);
  });

  it('an eval file edited into something unreadable is an error naming its line', async () => {
    const { prompts, runDir } = dataset('broken', 10);
    const ds = { name: 'p', evalHoldout: 2, turns: 'last' as const };
    const { log } = capture();
    await resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log });
    const file = evalPromptsPath(runDir, 'p');
    appendFileSync(file, '{"id": "x"\n');
    await expect(resolveEvalHoldout({ ds, promptsFile: prompts, runDir, log })).rejects.toThrow(
      `${file}:3: not a prompt of the eval split`,
    );
  });

  it('without evalHoldout and no split written, there is none', async () => {
    const { prompts, runDir } = dataset('none', 5);
    const { log } = capture();
    expect(
      await resolveEvalHoldout({ ds: { name: 'p', turns: 'last' }, promptsFile: prompts, runDir, log }),
    ).toBeUndefined();
    expect(existsSync(path.join(runDir, 'p', 'eval-prompts.jsonl'))).toBe(false);
  });
});
