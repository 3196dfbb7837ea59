/**
 * `samplesPerPrompt` with `samplingVariants`: each prompt (and each conversation with
 * `turns: all`) becomes n samples with their own ids, each sent with its own sampling settings,
 * each committed once and counted against the budget; a second run sends nothing again.
 * The requests are watched through a recording HTTP proxy in front of the simulator.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { parse } from 'yaml';

import type { ConfigInput } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { writeConversations } from '../helpers/conversations.js';
import { readGenerations, spawnCli, writeConfig, writePrompts } from '../helpers/pipeline.js';
import type { SpecForgeRunResult } from '../../src/cli/export/specforge-run.js';

const {
  redis,
  scripts: db,
  keys,
  sim,
  tmp,
} = useHarness({
  redis: true,
  scripts: true,
  keys: 'spp',
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 5, outputLength: { distribution: 'fixed', mean: 6 } },
  tmp: 'tm-spp-',
  cli: true,
});

/** rid → sampling_params of every POST /generate that went through the proxy. */
const sent: { rid: string; sampling: Record<string, unknown> }[] = [];
let proxy: Server;
let proxyUrl: string;

beforeAll(async () => {
  proxy = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.url === '/generate' && req.method === 'POST') {
        const parsed = JSON.parse(body.toString()) as { rid: string; sampling_params: Record<string, unknown> };
        sent.push({ rid: parsed.rid, sampling: parsed.sampling_params });
      }
      const headers = Object.fromEntries(
        Object.entries(req.headers).filter(([k]) => k !== 'host' && k !== 'content-length'),
      ) as Record<string, string>;
      fetch(`${sim.url}${req.url ?? '/'}`, {
        method: req.method ?? 'GET',
        headers,
        ...(req.method === 'GET' || req.method === 'HEAD' ? {} : { body }),
      })
        .then(async (r) => {
          res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' });
          res.end(Buffer.from(await r.arrayBuffer()));
        })
        .catch(() => {
          res.writeHead(502).end();
        });
    });
  });
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', () => r()));
  proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
});

afterAll(async () => {
  proxy.closeAllConnections();
  await new Promise((r) => proxy.close(r));
});

const sampleOfRid = (rid: string): string => rid.slice(rid.indexOf('/') + 1, rid.lastIndexOf('#'));

describe('samplesPerPrompt', () => {
  it('makes n samples per prompt and per conversation, each with its own id and sampling, once', async () => {
    const dir = path.join(tmp.dir, 'spp');
    mkdirSync(dir, { recursive: true });
    writePrompts(dir, 'p', 4);
    writeConversations(dir, 'c', 2, 2);
    // One sample per conversation, whose own id merely ends like a sample suffix.
    writeConversations(dir, 'q', 0, 2, [
      {
        id: 'talk#s2',
        messages: [
          { role: 'user', content: 'Hello, who are you?' },
          { role: 'assistant', content: 'source' },
          { role: 'user', content: 'And what can you do?' },
        ],
      },
    ]);
    const variants = [{ temperature: 0 }, { temperature: 0.3 }, { temperature: 0.7 }];
    const cfg = writeTestConfig(dir, {
      run: 'spp',
      redis,
      sim: proxyUrl,
      sglang: { concurrency: 4, contextLength: 4096 },
      datasets: [
        {
          name: 'p',
          prompts: 'p.jsonl',
          tokenBudget: 1_000_000,
          maxNewTokens: 6,
          samplesPerPrompt: 3,
          samplingVariants: variants,
        },
        {
          name: 'c',
          prompts: 'c.jsonl',
          turns: 'all',
          tokenBudget: 1_000_000,
          maxNewTokens: 6,
          samplesPerPrompt: 2,
          samplingVariants: variants,
        },
        { name: 'q', prompts: 'q.jsonl', turns: 'all', tokenBudget: 1_000_000, maxNewTokens: 6 },
      ],
      postprocess: { keepTruncated: true },
    });
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const runDir = path.join(dir, 'out', 'spp');

    const p = readGenerations(runDir, 'p').map((r) => r.id);
    expect(p.sort()).toEqual(
      Array.from({ length: 4 }, (_, i) => [1, 2, 3].map((j) => `${readPromptId(i)}#s${j}`))
        .flat()
        .sort(),
    );
    // Sample j was sent with variant (j - 1) mod 3 over the dataset's sampling.
    for (const s of sent) {
      const id = sampleOfRid(s.rid);
      if (id.startsWith('talk')) continue; // dataset q: one sample, no variants
      const j = Number(/#s(\d+)/.exec(id)?.[1]);
      expect(s.sampling.temperature, id).toBe(variants[(j - 1) % variants.length]?.temperature);
      expect(s.sampling.top_p, id).toBe(0.95);
    }
    // Each conversation twice, every turn of each sample once.
    const c = readGenerations(runDir, 'c').map((r) => r.id);
    expect(c.sort()).toEqual(
      ['c-0', 'c-1'].flatMap((id) => [1, 2].flatMap((j) => [1, 2].map((k) => `${id}#s${j}#t${k}`))).sort(),
    );
    const stats = await db.hgetall(keys.stats('p'));
    expect(Number(stats.records)).toBe(12);

    // A second run finds every sample accounted for and sends nothing.
    const before = sent.length;
    const again = spawnCli(['run', '-c', cfg]);
    expect(await again.exited, again.output()).toBe(0);
    expect(sent.length).toBe(before);
    expect(readGenerations(runDir, 'p')).toHaveLength(12);

    // export --format specforge finds every sample's prompt line: each sample's row is exported.
    const sfOut = path.join(dir, 'sf.jsonl');
    const sf = spawnCli(['export', '-c', cfg, '--format', 'specforge', '--out', sfOut, '--json']);
    expect(await sf.exited, sf.output()).toBe(0);
    const result = JSON.parse(
      sf
        .stdout()
        .split('\n')
        .find((l) => l.startsWith('{"format"')) ?? 'null',
    ) as SpecForgeRunResult;
    for (const d of result.datasets)
      expect(d, d.dataset).toMatchObject({ promptMissing: 0, promptChanged: 0, invalid: 0 });
    const exported = [sfOut, path.join(dir, 'sf.all-turns.jsonl')].flatMap((f) =>
      readFileSync(f, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => (JSON.parse(l) as { id: string }).id),
    );
    expect(exported.filter((id) => id.startsWith('p-')).sort()).toEqual([...p].sort());
    // A conversation's sample is one line, or one line per turn: every sample is there.
    const samples = new Set(exported.filter((id) => !id.startsWith('p-')).map((id) => id.replace(/#t\d+$/, '')));
    expect([...samples].sort()).toEqual(['c-0#s1', 'c-0#s2', 'c-1#s1', 'c-1#s2', 'talk#s2']);

    // An export that would write nothing while there are records fails, saying why.
    // Here dataset p's prompts are another file's (no line has the id of its samples).
    const renamed = writeConfig(
      dir,
      {
        ...(parse(readFileSync(cfg, 'utf8')) as ConfigInput),
        datasets: [
          { name: 'p', prompts: 'q.jsonl', tokenBudget: 1 },
          { name: 'none', prompts: 'q.jsonl', tokenBudget: 1 },
        ],
      },
      'renamed.yaml',
    );
    const empty = spawnCli(['export', '-c', renamed, '--format', 'specforge', '--out', path.join(dir, 'empty.jsonl')]);
    expect(await empty.exited, empty.output()).not.toBe(0);
    expect(empty.output()).toContain(
      'export --format specforge would write no row, though there are generation records',
    );
    expect(empty.output()).toContain('p: 12 generations, 0 rows exported, 12 without a prompt line');
    const noRows = spawnCli(['export', '-c', renamed, '--format', 'jsonl', '--dataset', 'none']);
    expect(await noRows.exited, noRows.output()).not.toBe(0);
    expect(noRows.output()).toContain('none of its');
  }, 180_000);
});

/** writePrompts' id of its i-th prompt. */
function readPromptId(i: number): string {
  return `p-${i}`;
}
