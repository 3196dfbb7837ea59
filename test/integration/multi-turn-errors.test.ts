/**
 * `turns: all`: one conversation's error is that conversation's end (docs/design.md, invariant 12),
 * with the real CLI, real Redis and the simulator over HTTP. A chat template that raises for a later
 * turn's history (a system message in mid-conversation, as strict alternating templates do) ends
 * that conversation at its last turn — the last conversation of the dataset — `error: turn k: …`, shown by `status`, while the
 * run completes; `retry-failed` after the template is fixed resumes it at its next turn, its
 * committed turns not sent again.
 */
import { cpSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { Queue } from 'bullmq';
import { describe, expect, it } from 'vitest';

import { RunKeys, bundledTokenizerPath, generateQueueName, loadTokenizer } from '../../src/shared/index.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import {
  SOURCE_ANSWER,
  byConversation,
  expectTurnChains,
  readConversationFile,
  writeConversations,
  type TurnRecord,
} from '../helpers/conversations.js';
import { useHarness } from '../helpers/fixture.js';
import { duplicates, readGenerations, sampleIdOfRid, spawnCli } from '../helpers/pipeline.js';

const { redis, tmp, sim } = useHarness({
  redis: true,
  tmp: 'tm-mt-errors-',
  cli: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 53, outputLength: { distribution: 'fixed', mean: 24 } },
});

/** A template check in the style of Gemma's and Mistral's: a system message only at the start. */
const STRICT_PREFIX =
  "{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}" +
  "{{ raise_exception('System message must be at the beginning of the conversation') }}{%- endif %}{%- endfor %}";

async function cli(args: string[]): Promise<string> {
  const p = spawnCli(args);
  const code = await p.exited;
  expect(code, p.output().slice(-4_000)).toBe(0);
  return p.output();
}

describe('turns: all, a conversation whose later turn the template rejects', () => {
  it('ends that conversation — its last turn, the last of the dataset — `error: turn 3: …` (status shows it), completes the run, and resumes it after retry-failed', async () => {
    const dir = path.join(tmp.dir, 'tpl');
    mkdirSync(dir, { recursive: true });
    // The run's tokenizer: the bundled Qwen3 with the strict check in front of its template.
    const tokDir = path.join(dir, 'tokenizer');
    cpSync(bundledTokenizerPath(), tokDir, { recursive: true });
    const cfgFile = path.join(tokDir, 'tokenizer_config.json');
    const original = readFileSync(cfgFile, 'utf8');
    const tc = JSON.parse(original) as { chat_template: string };
    writeFileSync(cfgFile, JSON.stringify({ ...tc, chat_template: STRICT_PREFIX + tc.chat_template }));

    // The last line of the file: turns 1 and 2 render; its last turn's history has the mid-conversation system message.
    const bad = {
      id: 'bad',
      messages: [
        { role: 'user', content: 'First question about rivers.' },
        { role: 'assistant', content: `${SOURCE_ANSWER} 1` },
        { role: 'user', content: 'Second question about lakes.' },
        { role: 'assistant', content: `${SOURCE_ANSWER} 2` },
        { role: 'system', content: 'From now on answer in French.' },
        { role: 'user', content: 'Third question about seas.' },
        { role: 'assistant', content: `${SOURCE_ANSWER} 3` },
      ],
    };
    const file = writeConversations(dir, 'e', 3, 3, [bad]);
    const run = 'mterr';
    const config: TestConfigSpec = {
      run,
      redis,
      sim,
      sglang: { concurrency: 4 },
      tokenizer: { path: tokDir },
      datasets: [
        {
          name: 'c',
          prompts: path.basename(file),
          turns: 'all',
          tokenBudget: 1_000_000,
          maxNewTokens: 32,
          batchSize: 2,
        },
      ],
      postprocess: { keepTruncated: true },
    };
    const cfg = writeTestConfig(dir, config, `${run}.yaml`);
    const keys = new RunKeys(redis.prefix, run);
    const conn = redis.connection('client');

    // Before: the batch failed, the producer enqueued the conversation again on every pass, for ever.
    await cli(['run', '-c', cfg]);
    const records = readGenerations(path.join(dir, 'out', run), 'c') as unknown as TurnRecord[];
    expect(duplicates(records.map((r) => r.id))).toEqual([]);
    const convs = byConversation(records);
    expect(convs.get('bad')?.map((t) => t.turn)).toEqual([1, 2]);
    for (let i = 0; i < 3; i += 1) expect(convs.get(`e-${i}`)?.length, `e-${i}`).toBe(3);
    const end = JSON.parse((await conn.hget(keys.conversations('c'), 'bad')) ?? '{}') as Record<string, unknown>;
    expect(end).toMatchObject({ kind: 'ended', turnsDone: 2, turn: 3, turns: 3 });
    expect(end.reason).toMatch(/^error: turn 3: .*System message must be at the beginning/);
    const stats = await conn.hgetall(keys.stats('c'));
    expect(stats.status).toBe('completed');
    expect(stats.conversationsComplete).toBe('3');
    expect(stats.conversationsEnded).toBe('1');
    expect(stats['ended:error']).toBe('1');
    // No batch job failed: the error stayed inside its conversation.
    const queue = new Queue(generateQueueName('c'), { connection: conn, prefix: keys.bullPrefix });
    try {
      expect(await queue.getJobCountByTypes('failed')).toBe(0);
    } finally {
      await queue.close();
    }
    // `status` names the conversation, the turn and the template's message.
    const status = await cli(['status', '-c', cfg]);
    expect(status).toMatch(/conversations 3 complete, 0 partial, 1 ended early/);
    expect(status).toMatch(/ended early \(1 error\)/);
    expect(status).toMatch(/bad at turn 3: error: turn 3: .*System message must be at the beginning/);
    const json = JSON.parse(await cli(['status', '-c', cfg, '--json'])) as {
      datasets: { conversations: { endedBy: Record<string, number>; lastEnded: { id: string; turn: number }[] } }[];
    };
    expect(json.datasets[0]?.conversations.endedBy).toEqual({ error: 1 });
    expect(json.datasets[0]?.conversations.lastEnded[0]).toMatchObject({ id: 'bad', turn: 3 });

    // The template fixed, retry-failed reopens the conversation; the next run resumes it at turn 3.
    writeFileSync(cfgFile, original);
    const retry = await cli(['retry-failed', '-c', cfg]);
    expect(retry).toMatch(/c: 1 conversation\(s\) that ended early will resume at their next turn/);
    await cli(['run', '-c', cfg]);
    const after = readGenerations(path.join(dir, 'out', run), 'c') as unknown as TurnRecord[];
    expect(duplicates(after.map((r) => r.id))).toEqual([]);
    const tok = await loadTokenizer(tokDir);
    const allConvs = byConversation(after);
    expectTurnChains(tok, readConversationFile(file), allConvs, { complete: true });
    // Turns 1 and 2 of `bad` were generated once: the resume went on from them.
    const sentBad = sim
      .stats()
      .requests.map((r) => r.rid)
      .filter((rid) => rid.startsWith(`c/bad#`))
      .map(sampleIdOfRid)
      .sort();
    expect(sentBad).toEqual(['bad#t1', 'bad#t2', 'bad#t3']);
    const final = await conn.hgetall(keys.stats('c'));
    expect(final.conversationsComplete).toBe('4');
    expect(final.conversationsEnded).toBe('0');
    expect(final['ended:error']).toBeUndefined();
    expect(await conn.lrange(`${keys.stats('c')}:ended`, 0, -1), 'no longer listed as ended').toEqual([]);
  }, 180_000);
});
