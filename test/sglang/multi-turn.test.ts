// `turns: all` against a real SGLang 0.5.23 (tiny random-weight Qwen3, the real Qwen3 tokenizer):
// each conversation's turns are generated in order against the real server, each once; a turn
// after the first is the template's rendering of the regenerated history — spliced from the
// previous turn's ids where the template continues exactly, and the server counts the prompt we
// sent (its prompt_tokens); the rows come out per conversation or per turn, and the export is
// one line per conversation. A random model never stops: answers are kept truncated.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import { loadTokenizer, readHfDataset, RunKeys } from '../../src/shared/index.js';
import { writeTestConfig } from '../helpers/config.js';
import {
  byConversation,
  expectTurnChains,
  readConversationFile,
  writeConversations,
  type TurnRecord,
} from '../helpers/conversations.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, spawnCli } from '../helpers/pipeline.js';
import { modelDir, realSglang, skipReason } from '../helpers/real-sglang.js';

const skip = skipReason();

describe.skipIf(skip !== '')(
  `multi-turn regeneration against a real SGLang 0.5.23${skip === '' ? '' : ` (skipped: ${skip})`}`,
  () => {
    const { redis, scripts: db, tmp } = useHarness({ redis: true, scripts: true, tmp: 'tm-sglang-mt-', cli: true });

    it('runs every turn of every conversation once, each on the regenerated history, to rows and export', async () => {
      const file = writeConversations(tmp.dir, 'mt', 4, 3);
      const cfg = writeTestConfig(tmp.dir, {
        run: 'mt',
        redis,
        sim: realSglang().url,
        sglang: { concurrency: 4, requestTimeoutMs: 120_000 },
        tokenizer: { path: modelDir(realSglang().dir) },
        datasets: [
          {
            name: 'mt',
            prompts: path.basename(file),
            turns: 'all',
            tokenBudget: 1_000_000_000,
            maxNewTokens: 12,
            batchSize: 4,
            sampling: { temperature: 1, top_k: 20 },
          },
        ],
        postprocess: { keepTruncated: true },
        workers: { shutdownGraceMs: 2_000 },
      });
      const run = spawnCli(['run', '-c', cfg]);
      expect(await run.exited, run.output().slice(-3000)).toBe(0);
      const runDir = path.join(tmp.dir, 'out', 'mt');
      const records = readGenerations(runDir, 'mt') as unknown as TurnRecord[];
      expect(duplicates(records.map((r) => r.id))).toEqual([]);
      expect(records).toHaveLength(12);

      const tok = await loadTokenizer(modelDir(realSglang().dir));
      const convs = byConversation(records);
      // The server tokenized nothing itself: it counted exactly the ids sent.
      for (const r of records) expect(r.prompt_tokens, r.id).toBe(r.prompt_ids.length);
      expectTurnChains(tok, readConversationFile(file), convs, { complete: true, decodes: false });
      const keys = new RunKeys(redis.prefix, 'mt');
      const stats = await db.hgetall(keys.stats('mt'));
      expect(stats['conversationsComplete']).toBe('4');
      expect(Number(stats['outputTokens'])).toBe(records.reduce((a, r) => a + r.output_ids.length, 0));

      // Rows: a whole-conversation row where every later turn was spliced, else one per turn.
      const ds = await readHfDataset(path.join(runDir, 'train-dataset'));
      const ids: string[] = [];
      for await (const r of ds.rows()) ids.push(String(r.id));
      const expected = [...convs].flatMap(([id, turns]) =>
        turns.slice(1).every((t) => t.spliced) ? [id] : turns.map((t) => t.id),
      );
      expect(ids.sort()).toEqual(expected.sort());

      const sfOut = path.join(tmp.dir, 'sf.jsonl');
      const sf = spawnCli(['export', '-c', cfg, '--format', 'specforge', '--out', sfOut]);
      expect(await sf.exited, sf.output()).toBe(0);
      // One line per row: whole-conversation rows in sf.all-turns.jsonl, turns' rows in sf.jsonl.
      const idsIn = (f: string): string[] =>
        existsSync(f)
          ? readFileSync(f, 'utf8')
              .split('\n')
              .filter((l) => l.trim() !== '')
              .map((l) => (JSON.parse(l) as { id: string }).id)
          : [];
      // The random model never ends a turn: every answer is cut by length. SpecForge's all-turns
      // rule would supervise the template's close after each earlier turn, so each conversation
      // is written as one line per turn (docs/multi-turn.md).
      const finishes = records.map((r) => (r.finish_reason as unknown as { type: string }).type);
      expect(new Set(finishes)).toEqual(new Set(['length']));
      expect([...idsIn(sfOut), ...idsIn(path.join(tmp.dir, 'sf.all-turns.jsonl'))].sort()).toEqual(
        records.map((r) => r.id).sort(),
      );
    }, 600_000);

    it("an agentic conversation: its tools in every turn's prompt, the server counting the ids sent; a turn that answers where the source called ends it with its cause", async () => {
      const tools = [
        {
          type: 'function',
          function: {
            name: 'run_shell',
            description: 'Run a command.',
            parameters: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] },
          },
        },
      ];
      const lines = Array.from({ length: 3 }, (_, i) =>
        JSON.stringify({
          id: `ag-${i}`,
          tools,
          messages: [
            { role: 'user', content: `Question ${i}: what is in the repository?` },
            { role: 'assistant', content: 'SOURCE-ANSWER-NEVER-SENT' },
            { role: 'user', content: 'Run the tests.' },
            {
              role: 'assistant',
              content: '',
              tool_calls: [
                { id: 'c1', type: 'function', function: { name: 'run_shell', arguments: '{"command": "make test"}' } },
              ],
            },
            { role: 'tool', tool_call_id: 'c1', content: 'ok' },
            { role: 'assistant', content: 'SOURCE-ANSWER-NEVER-SENT' },
          ],
        }),
      );
      const file = path.join(tmp.dir, 'ag.jsonl');
      writeFileSync(file, `${lines.join('\n')}\n`);
      const cfg = writeTestConfig(
        tmp.dir,
        {
          run: 'ag',
          redis,
          sim: realSglang().url,
          sglang: { concurrency: 4, requestTimeoutMs: 120_000 },
          tokenizer: { path: modelDir(realSglang().dir) },
          datasets: [
            {
              name: 'ag',
              prompts: path.basename(file),
              turns: 'all',
              tokenBudget: 1_000_000_000,
              maxNewTokens: 12,
              batchSize: 4,
              sampling: { temperature: 1, top_k: 20 },
            },
          ],
          postprocess: { keepTruncated: true },
          workers: { shutdownGraceMs: 2_000 },
        },
        'ag.yaml',
      );
      const run = spawnCli(['run', '-c', cfg]);
      expect(await run.exited, run.output().slice(-3000)).toBe(0);
      const records = readGenerations(path.join(tmp.dir, 'out', 'ag'), 'ag') as unknown as TurnRecord[];
      const tok = await loadTokenizer(modelDir(realSglang().dir));
      const convs = byConversation(records);
      expect([...convs.keys()].sort()).toEqual(['ag-0', 'ag-1', 'ag-2']);
      for (const [id, turns] of convs) {
        // Turns 1 and 2 ran (the source answered turn 1 in text, as the random model does), each
        // rendered with the record's tools; the server counted exactly the ids sent.
        expect(
          turns.map((t) => t.turn),
          id,
        ).toEqual([1, 2]);
        const [t1, t2] = turns as [TurnRecord, TurnRecord];
        expect(t1.prompt_ids).toEqual(
          tok.encodePrompt([{ role: 'user', content: `Question ${id.slice(3)}: what is in the repository?` }], {
            tools,
          }),
        );
        for (const t of turns) {
          expect(t.prompt_tokens, t.id).toBe(t.prompt_ids.length);
          expect(tok.decode(t.prompt_ids), t.id).toContain('"name": "run_shell"');
          expect(tok.decode(t.prompt_ids), t.id).not.toContain('SOURCE-ANSWER-NEVER-SENT');
        }
        if (t2.spliced)
          expect(t2.prompt_ids.slice(0, t1.prompt_ids.length + t1.output_ids.length)).toEqual([
            ...t1.prompt_ids,
            ...t1.output_ids,
          ]);
      }
      // The model answered where the source called run_shell: the source's result cannot follow.
      const keys = new RunKeys(redis.prefix, 'ag');
      const ends = await db.hgetall(keys.conversations('ag'));
      for (const [id, v] of Object.entries(ends))
        expect(JSON.parse(String(v)), id).toMatchObject({
          kind: 'ended',
          turnsDone: 2,
          reason: 'tool-mismatch: turn 2 answered where the source called run_shell',
        });
      expect((await db.hgetall(keys.stats('ag')))['ended:tool-mismatch']).toBe('3');
    }, 600_000);
  },
);
