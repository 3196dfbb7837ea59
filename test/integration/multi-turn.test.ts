/**
 * `turns: all` end to end on the simulator (real CLI, real Redis, real HTTP): every turn of every
 * conversation is one record, in order, whose prompt is the template's rendering of the history
 * with the answers regenerated before it (never the source's), spliced token for token where the
 * template continues exactly; conversations finish once; bad conversations are rejected naming
 * the line, and the rest goes on; the rows of the training dataset are the turns.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import {
  bundledTokenizerPath,
  loadConfig,
  loadTokenizer,
  readHfDataset,
  type ChatMessage,
  type ConfigInput,
  RunKeys,
} from '../../src/shared/index.js';
import { renderMetrics } from '../../src/dashboard/metrics.js';
import { parse } from 'yaml';

import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import {
  byConversation,
  expectTurnChains,
  readConversationFile,
  SOURCE_ANSWER,
  writeConversations,
  type TurnRecord,
} from '../helpers/conversations.js';
import { readGenerations, spawnCli, writeConfig } from '../helpers/pipeline.js';

const {
  redis,
  scripts: db,
  keys,
  sim,
  tmp,
} = useHarness({
  redis: true,
  scripts: true,
  keys: 'mt',
  sim: {
    timeScale: 200,
    maxRunningRequests: 16,
    seed: 21,
    contextLength: 4096,
    outputLength: { distribution: 'uniform', mean: 14, min: 4, max: 24 },
  },
  tmp: 'tm-multi-turn-',
  cli: true,
});

describe('turns: all', () => {
  it('regenerates every turn against the regenerated history, once; rows of whole conversations or per turn; export', async () => {
    const dir = path.join(tmp.dir, 'mt');
    mkdirSync(dir, { recursive: true });
    const tool = {
      id: 'tools-1',
      messages: [
        { role: 'user', content: 'What is the weather in Paris?' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [{ type: 'function', function: { name: 'weather', arguments: { city: 'Paris' } } }],
        },
        { role: 'tool', content: '{"temp": 21}' },
        { role: 'assistant', content: `${SOURCE_ANSWER} tool` },
        { role: 'user', content: 'And tomorrow?' },
      ],
    };
    const bad = [
      {
        id: 'bad-users',
        messages: [
          { role: 'user', content: 'a' },
          { role: 'user', content: 'b' },
        ],
      },
      {
        id: 'bad-tool',
        messages: [
          { role: 'user', content: 'a' },
          { role: 'tool', content: 'x' },
        ],
      },
      { id: 'bad-none', messages: [{ role: 'system', content: 'only a system turn' }] },
    ];
    const file = writeConversations(dir, 'c', 6, 3, [tool, ...bad]);
    const cfg = writeTestConfig(dir, {
      run: 'mt',
      redis,
      sim,
      sglang: { concurrency: 4, contextLength: 4096 },
      datasets: [
        {
          name: 'c',
          prompts: path.basename(file),
          turns: 'all',
          tokenBudget: 1_000_000,
          maxNewTokens: 24,
          batchSize: 3,
        },
      ],
      postprocess: { keepTruncated: true },
    });
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);

    const runDir = path.join(dir, 'out', 'mt');
    const records = readGenerations(runDir, 'c') as unknown as TurnRecord[];
    const ids = records.map((r) => r.id);
    expect(new Set(ids).size, 'no turn written twice').toBe(ids.length);
    const convs = byConversation(records);
    expect([...convs.keys()].sort()).toEqual(['c-0', 'c-1', 'c-2', 'c-3', 'c-4', 'c-5', 'tools-1']);

    const tok = await loadTokenizer(bundledTokenizerPath());
    const source = readConversationFile(file);
    // tools-1's source calls a tool at turn 1; the model answered instead, so the source's result
    // cannot follow: the conversation ends there (docs/agentic.md), its turn kept.
    const toolConv = convs.get('tools-1') ?? [];
    expect(toolConv.map((t) => t.turn)).toEqual([1]);
    const spliced = expectTurnChains(tok, source, new Map([...convs].filter(([id]) => id !== 'tools-1')), {
      complete: true,
    });
    // Qwen3's template continues exactly when an answer has no reasoning to strip: most turns ≥ 2 are spliced.
    expect(spliced).toBeGreaterThan(0);

    // The bad conversations are rejected naming their line; the rest went on.
    const rejects = readFileSync(path.join(runDir, 'c', 'rejects.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { line: number; id: string; reason: string });
    expect(rejects.map((r) => [r.line, r.id, r.reason])).toEqual([
      [8, 'bad-users', 'messages[0] and messages[1] are two user turns in a row'],
      [9, 'bad-tool', 'messages[1] is a tool turn with no assistant turn before it'],
      [10, 'bad-none', 'the conversation has no user turn'],
    ]);

    // Each conversation finished once, complete but tools-1; no history is left behind.
    const ends = await db.hgetall(keys.conversations('c'));
    expect(Object.keys(ends).sort()).toEqual([...convs.keys()].sort());
    for (const [id, v] of Object.entries(ends))
      expect(JSON.parse(String(v))).toMatchObject(
        id === 'tools-1'
          ? { kind: 'ended', turnsDone: 1, reason: 'tool-mismatch: turn 1 answered where the source called weather' }
          : { kind: 'complete' },
      );
    const stats = await db.hgetall(keys.stats('c'));
    expect(stats.conversationsComplete).toBe('6');
    expect(stats['ended:tool-mismatch']).toBe('1');
    expect(stats.conversationsStarted).toBe('7');
    expect(Number(stats.records)).toBe(records.length);
    expect(await db.keys(`${keys.done('c')}:conv:*`)).toEqual([]);
    // The producer proved the dataset exhausted after one pass over the file (its conversations
    // all finished), without a second, verifying pass.
    expect(await db.hget(keys.producer('c'), 'epoch')).toBeNull();

    // status, /metrics: conversations by state and turns.
    const status = spawnCli(['status', '-c', cfg]);
    expect(await status.exited, status.output()).toBe(0);
    expect(status.output()).toContain(
      `c: conversations 6 complete, 0 partial, 1 ended early; 19 turns; later turns: ${spliced} of 12 spliced token for token, ${12 - spliced} rendered from the decoded history`,
    );
    const metrics = await renderMetrics(db, keys, loadConfig({ path: cfg }));
    expect(metrics.body).toContain('tokenmill_dataset_conversations{run="mt",dataset="c",state="complete"} 6');
    expect(metrics.body).toContain('tokenmill_dataset_records{run="mt",dataset="c"} 19');

    // postprocess.rows: conversation (the default): a conversation whose later turns were all
    // spliced is one row, its last turn's ids, every generated turn's output supervised; the
    // others are one row per turn, the history as context.
    const ds = await readHfDataset(path.join(runDir, 'train-dataset'));
    const rows = new Map<string, { ids: number[]; mask: number[] }>();
    for await (const r of ds.rows())
      rows.set(String(r.id), { ids: r.input_ids as number[], mask: r.loss_mask as number[] });
    const expectedIds: string[] = [];
    let wholeRows = 0;
    for (const [id, turns] of convs) {
      // A conversation that ended early is one row per turn.
      const whole = id !== 'tools-1' && turns.slice(1).every((t) => t.spliced);
      if (!whole) {
        for (const t of turns) {
          expectedIds.push(t.id);
          const row = rows.get(t.id);
          expect(row?.ids.slice(0, t.prompt_ids.length), t.id).toEqual(t.prompt_ids);
          expect(
            row?.mask.slice(0, t.prompt_ids.length).every((m) => m === 0),
            t.id,
          ).toBe(true);
        }
        continue;
      }
      wholeRows += 1;
      expectedIds.push(id);
      const last = turns[turns.length - 1] as TurnRecord;
      const row = rows.get(id);
      expect(row?.ids.slice(0, last.prompt_ids.length + last.output_ids.length), id).toEqual([
        ...last.prompt_ids,
        ...last.output_ids,
      ]);
      for (const t of turns) {
        // Each turn's output sits where its prompt ends, supervised; its prompt's own text is not.
        const at = t.prompt_ids.length;
        expect(row?.ids.slice(at, at + t.output_ids.length), `${id} turn ${t.turn}`).toEqual(t.output_ids);
        expect(
          row?.mask.slice(at, at + t.output_ids.length).every((m) => m === 1),
          `${id} turn ${t.turn}`,
        ).toBe(true);
      }
      const firstPrompt = (turns[0] as TurnRecord).prompt_ids.length;
      expect(row?.mask.slice(0, firstPrompt).every((m) => m === 0)).toBe(true);
    }
    expect([...rows.keys()].sort()).toEqual(expectedIds.sort());
    expect(wholeRows, 'some conversations are whole rows').toBeGreaterThan(0);

    // postprocess.rows: per-turn, into another dataset: one row per turn.
    const perTurnCfg = writeConfig(
      dir,
      {
        ...(parse(readFileSync(cfg, 'utf8')) as ConfigInput),
        postprocess: { keepTruncated: true, rows: 'per-turn', target: 'per-turn-dataset' },
      },
      'per-turn.yaml',
    );
    const pp = spawnCli(['postprocess', '-c', perTurnCfg]);
    expect(await pp.exited, pp.output()).toBe(0);
    const perTurn = await readHfDataset(path.join(dir, 'per-turn-dataset'));
    const perTurnIds: string[] = [];
    for await (const r of perTurn.rows()) perTurnIds.push(String(r.id));
    expect(perTurnIds.sort()).toEqual([...ids].sort());

    // export --format specforge: one line per row, its text the row's tokens. A whole-conversation
    // row (in sf.all-turns.jsonl) holds the whole regenerated history, a turn's row (in sf.jsonl) its
    // history up to that turn; either rendered without its last answer is its last turn's prompt.
    const sfOut = path.join(dir, 'sf.jsonl');
    const sf = spawnCli(['export', '-c', cfg, '--format', 'specforge', '--out', sfOut]);
    expect(await sf.exited, sf.output()).toBe(0);
    const read = (file: string): { id: string; text: string; conversations: ChatMessage[] }[] =>
      readFileSync(file, 'utf8')
        .trim()
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as { id: string; text: string; conversations: ChatMessage[] });
    const perTurnLines = read(sfOut);
    const wholeLines = read(path.join(dir, 'sf.all-turns.jsonl'));
    expect(wholeLines).toHaveLength(wholeRows);
    expect([...perTurnLines, ...wholeLines].map((l) => l.id).sort()).toEqual(expectedIds.sort());
    const turnById = new Map([...convs.values()].flat().map((t) => [t.id, t]));
    for (const l of [...perTurnLines, ...wholeLines]) {
      expect(l.text, l.id).toBe(tok.decode(rows.get(l.id)?.ids ?? [], { skipSpecialTokens: false }));
      const turns = convs.get(l.id) ?? [turnById.get(l.id) as TurnRecord];
      const last = turns[turns.length - 1] as TurnRecord;
      expect(l.conversations.filter((m) => m.role === 'assistant')).toHaveLength(
        convs.has(l.id) ? turns.length : last.turn,
      );
      expect(JSON.stringify(l.conversations)).not.toContain(SOURCE_ANSWER);
      const history = l.conversations.slice(0, -1);
      if (!last.spliced) expect(tok.encodePrompt(history), l.id).toEqual(last.prompt_ids);
      else
        expect(tok.applyChatTemplate(history, { addGenerationPrompt: true }), l.id).toBe(
          tok.decode(last.prompt_ids, { skipSpecialTokens: false }),
        );
    }
  }, 180_000);

  it('prepare keeps whole conversations, counts those of several turns and names the rows it cannot use', async () => {
    const dir = path.join(tmp.dir, 'prep');
    mkdirSync(dir, { recursive: true });
    const rows = [
      {
        id: 's1',
        conversations: [
          { from: 'human', value: 'Hi there' },
          { from: 'gpt', value: `${SOURCE_ANSWER} 1` },
          { from: 'human', value: 'Tell me more' },
          { from: 'gpt', value: `${SOURCE_ANSWER} 2` },
        ],
      },
      { id: 's2', conversations: [{ from: 'human', value: 'One question only' }] },
      {
        id: 's3',
        conversations: [
          { from: 'human', value: 'first' },
          { from: 'human', value: 'second in a row' },
        ],
      },
      {
        id: 's4',
        conversations: [
          { from: 'human', value: 'first' },
          { from: 'gpt', value: 'answer' },
          { from: 'human', value: '  ' },
          { from: 'gpt', value: 'answer' },
        ],
      },
    ];
    writeFileSync(path.join(dir, 'share.jsonl'), `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`);
    const cfg = writeTestConfig(dir, {
      run: 'prep',
      redis,
      sim,
      sglang: { concurrency: 2, contextLength: 4096 },
      datasets: [
        {
          name: 'p',
          source: { path: 'share.jsonl', format: 'sharegpt' },
          prompts: 'p.prompts.jsonl',
          turns: 'all',
          tokenBudget: 1000,
        },
      ],
    });
    const prep = spawnCli(['prepare', '-c', cfg]);
    expect(await prep.exited, prep.output()).toBe(0);
    expect(prep.output()).toContain('2 kept');
    expect(prep.output()).toContain('1 with several turns');
    const kept = readFileSync(path.join(dir, 'p.prompts.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; messages: { role: string; content: string }[] });
    expect(kept.map((k) => k.id)).toEqual(['s1', 's2']);
    // The whole conversation, its source answers too (they shape the turns; they are never sent).
    expect(kept[0]?.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'user', 'assistant']);
    const report = JSON.parse(readFileSync(path.join(dir, 'out', 'prep', 'p', 'prepare-report.json'), 'utf8')) as {
      examples: Record<string, { id?: string; reason: string }[]>;
    };
    expect(report.examples.malformed?.map((e) => [e.id, e.reason])).toEqual([
      ['s3', 'messages[0] and messages[1] are two user turns in a row'],
      ['s4', 'messages[2] is an empty user turn'],
    ]);
  }, 120_000);

  it('a conversation whose turns are all committed but whose end was lost is complete, and nothing is sent again', async () => {
    // What a Redis rebuilt from the files leaves (commits restored, no history, no end record),
    // and what a kill -9 between the last commit and the end record leaves.
    const dir = path.join(tmp.dir, 'lost-end');
    mkdirSync(dir, { recursive: true });
    const file = writeConversations(dir, 'le', 3, 2);
    const cfg = writeTestConfig(dir, {
      run: 'mt',
      redis: { url: redis.url, prefix: `${redis.prefix}:le` },
      sim,
      sglang: { concurrency: 2, contextLength: 4096 },
      datasets: [{ name: 'le', prompts: path.basename(file), turns: 'all', tokenBudget: 1_000_000, maxNewTokens: 8 }],
    });
    const first = spawnCli(['run', '-c', cfg]);
    expect(await first.exited, first.output()).toBe(0);
    const leKeys = new RunKeys(`${redis.prefix}:le`, 'mt');
    expect(Object.keys(await db.hgetall(leKeys.conversations('le')))).toHaveLength(3);
    await db.del(leKeys.conversations('le'));
    const before = readGenerations(path.join(dir, 'out', 'mt'), 'le').length;
    const requests = sim.stats().requestsReceived;
    const again = spawnCli(['run', '-c', cfg]);
    expect(await again.exited, again.output()).toBe(0);
    expect(sim.stats().requestsReceived).toBe(requests);
    expect(readGenerations(path.join(dir, 'out', 'mt'), 'le')).toHaveLength(before);
    const ends = Object.values(await db.hgetall(leKeys.conversations('le'))).map(
      (v) => JSON.parse(v) as { kind: string },
    );
    expect(ends.map((e) => e.kind)).toEqual(['complete', 'complete', 'complete']);
  }, 120_000);
});
