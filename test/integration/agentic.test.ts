/**
 * Agentic conversations end to end (real CLI, real Redis, the simulator over real HTTP calling
 * tools in Qwen3's Hermes format): with the source's results, a run whose turns make matching,
 * divergent, parallel and malformed calls ends with every conversation complete or ended with
 * its reason; every turn's prompt is the rendering, with the record's tools, of the history its
 * committed turns make; after each call exactly the results that answer it; no source assistant
 * content sent; no turn past the context. With a tool executor, the results are the executor's,
 * each call run once, retried through its 503s.
 */
import path from 'node:path';

import { describe, expect, it } from 'vitest';

import {
  answerTextWithSpecials,
  bundledTokenizerPath,
  loadTokenizer,
  parseChatMessage,
  parseToolCalls,
  sourceCalls,
  sourceTurnStep,
  conversationTurns,
  RunKeys,
  type ChatTokenizer,
  type ConfigInput,
} from '../../src/shared/index.js';
import {
  agenticRecords,
  expectAgenticChains,
  writeAgentic,
  AGENT_TOOLS,
  type AgenticRecord,
  type AgenticTurnRecord,
} from '../helpers/agentic.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { byConversation } from '../helpers/conversations.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli } from '../helpers/pipeline.js';
import { startReferenceExecutor } from '../helpers/tool-executor.js';

const PARALLEL = 0.3;
const CONTEXT = 1_700;
const MIN_NEW = 24;

const {
  redis,
  scripts: db,
  sim,
  tmp,
  defer,
} = useHarness({
  redis: true,
  scripts: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 32,
    seed: 29,
    outputLength: { distribution: 'uniform', mean: 20, min: 8, max: 40 },
    toolCalls: {
      probability: 0.9,
      parallel: PARALLEL,
      divergent: 0.08,
      malformed: 0.06,
      perDataset: { exec: { probability: 0.97, divergent: 0.2, malformed: 0 } },
    },
  },
  tmp: 'tm-agentic-',
  cli: true,
});

function config(run: string, file: string, dataset: Record<string, unknown>): string {
  const cfg: TestConfigSpec = {
    run,
    redis,
    sim,
    sglang: { contextLength: CONTEXT },
    datasets: [
      {
        name: 'exec',
        prompts: path.basename(file),
        turns: 'all',
        tokenBudget: 1_000_000,
        maxNewTokens: 64,
        minNewTokens: MIN_NEW,
        batchSize: 4,
        ...dataset,
      } as NonNullable<ConfigInput['datasets']>[number],
    ],
    postprocess: { keepTruncated: true },
  };
  return writeTestConfig(tmp.dir, cfg, `${run}.yaml`);
}

/** Each conversation's end record. */
async function ends(
  run: string,
  dataset: string,
): Promise<Map<string, { kind: string; reason?: string; turnsDone: number }>> {
  const raw = await db.hgetall(new RunKeys(redis.prefix, run).conversations(dataset));
  return new Map(
    Object.entries(raw).map(([k, v]) => [
      k,
      JSON.parse(String(v)) as { kind: string; reason?: string; turnsDone: number },
    ]),
  );
}

function causeOf(reason: string | undefined): string {
  return /^([a-z-]+)/.exec(reason ?? '')?.[1] ?? 'other';
}

function sourceMap(records: readonly AgenticRecord[]): Map<string, AgenticRecord> {
  return new Map(records.map((r) => [r.id, r]));
}

function lastCalls(tok: ChatTokenizer, t: AgenticTurnRecord) {
  return parseToolCalls('hermes', answerTextWithSpecials(tok, t.output_ids), { turn: t.turn });
}

describe('agentic conversations', () => {
  it("with the source's results: every conversation complete or ended with its reason, results only after the calls they answer", async () => {
    const records = agenticRecords('ag', 40, PARALLEL);
    const file = writeAgentic(tmp.dir, 'ag', records);
    // The dataset is named `exec` only in the executor case below; here `ag`, at the simulator's top rates.
    const cfg = config('ag', file, { name: 'ag' });
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);

    const tok = await loadTokenizer(bundledTokenizerPath());
    const turnRecords = readGenerations(path.join(tmp.dir, 'out', 'ag'), 'ag') as unknown as AgenticTurnRecord[];
    const convs = byConversation(turnRecords);
    const placed = expectAgenticChains(tok, 'hermes', sourceMap(records), convs);
    expect(placed.executor).toBe(0);
    expect(placed.source, 'source results placed after matching calls').toBeGreaterThan(10);
    const parallelPlaced = turnRecords.filter((t) => (t.tool_results?.messages.length ?? 0) >= 2).length;
    expect(parallelPlaced, 'parallel calls answered by as many results').toBeGreaterThan(0);
    // A turn after calls and their results continues the model's own ids where the template allows.
    const splicedAfterCalls = turnRecords.filter((t) => t.spliced && t.tool_results !== undefined).length;
    expect(splicedAfterCalls, 'turns after calls spliced token for token').toBeGreaterThan(0);

    // No turn runs past the context: each output fits what its prompt left.
    for (const t of turnRecords) expect(t.prompt_ids.length + t.output_ids.length, t.id).toBeLessThanOrEqual(CONTEXT);

    // Every conversation finished, complete or ended with a reason that its last turn shows.
    const end = await ends('ag', 'ag');
    expect([...end.keys()].sort()).toEqual(records.map((r) => r.id).sort());
    const byCause = new Map<string, number>();
    for (const [id, e] of end) {
      const cause = e.kind === 'complete' ? 'complete' : causeOf(e.reason);
      byCause.set(cause, (byCause.get(cause) ?? 0) + 1);
      const turns = convs.get(id) ?? [];
      const last = turns.at(-1);
      const rec = records.find((r) => r.id === id) as AgenticRecord;
      const messages = rec.messages.map((m, i) => parseChatMessage(m, `messages[${i}]`));
      const shape = conversationTurns(messages);
      if (typeof shape === 'string') throw new Error(shape);
      if (e.kind === 'complete') {
        expect(turns.length, id).toBe(shape.starts.length);
        continue;
      }
      expect(e.turnsDone, id).toBe(turns.length);
      if (last === undefined) throw new Error(`${id} ended with no turn`);
      const parsed = lastCalls(tok, last);
      switch (cause) {
        case 'tool-parse':
          expect(parsed.ok, `${id}: ${e.reason}`).toBe(false);
          break;
        case 'tool-unknown':
          expect(
            parsed.ok && parsed.calls.some((c) => !AGENT_TOOLS.some((t) => t.function.name === c.function.name)),
          ).toBe(true);
          break;
        case 'tool-mismatch': {
          if (!parsed.ok) throw new Error(`${id}: ${e.reason}`);
          const step = sourceTurnStep(messages, shape, last.turn);
          const src = sourceCalls(step.assistant ?? { role: 'assistant', content: '' });
          const srcNames = Array.isArray(src) ? src.map((c) => c.name) : [];
          expect(
            parsed.calls.map((c) => c.function.name),
            `${id}: ${e.reason}`,
          ).not.toEqual(srcNames);
          break;
        }
        case 'context':
          expect(e.reason, id).toMatch(/context length is 1700/);
          break;
        default:
          throw new Error(`${id} ended for an unexpected cause: ${e.reason}`);
      }
    }
    for (const cause of ['complete', 'tool-mismatch', 'tool-parse'])
      expect(byCause.get(cause) ?? 0, `${cause} among ${JSON.stringify([...byCause])}`).toBeGreaterThan(0);

    // status counts conversations by cause.
    const status = spawnCli(['status', '-c', cfg, '--json']);
    expect(await status.exited, status.output()).toBe(0);
    const json = JSON.parse(status.output().slice(status.output().indexOf('{'))) as {
      datasets: { name: string; conversations?: { endedBy?: Record<string, number> } }[];
    };
    const endedBy = json.datasets.find((d) => d.name === 'ag')?.conversations?.endedBy ?? {};
    for (const [cause, n] of byCause) if (cause !== 'complete') expect(endedBy[cause], cause).toBe(n);
  });

  it('a long trajectory: each turn gets what the context leaves, down to minNewTokens, then the conversation ends `context`', async () => {
    const records = agenticRecords('long', 12, PARALLEL);
    const file = writeAgentic(tmp.dir, 'long', records);
    const context = 640;
    const floor = 48;
    const cfg = writeTestConfig(
      tmp.dir,
      {
        run: 'long',
        redis,
        sim,
        sglang: { contextLength: context },
        datasets: [
          {
            name: 'long',
            prompts: path.basename(file),
            turns: 'all',
            tokenBudget: 1_000_000,
            maxNewTokens: 64,
            minNewTokens: floor,
            batchSize: 4,
          },
        ],
      },
      'long.yaml',
    );
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);
    const turnRecords = readGenerations(path.join(tmp.dir, 'out', 'long'), 'long') as unknown as AgenticTurnRecord[];
    // Every turn was sent with at least the floor left, and its output fits what was left.
    for (const t of turnRecords) {
      expect(context - t.prompt_ids.length, t.id).toBeGreaterThanOrEqual(floor);
      expect(t.prompt_ids.length + t.output_ids.length, t.id).toBeLessThanOrEqual(context);
    }
    const end = await ends('long', 'long');
    const byContext = [...end.values()].filter((e) => causeOf(e.reason) === 'context');
    expect(byContext.length, JSON.stringify([...end.values()].map((e) => e.reason ?? e.kind))).toBeGreaterThan(0);
    for (const e of byContext)
      expect(e.reason).toMatch(/the context length is 640(, which leaves \d+, fewer than minNewTokens \(48\))?$/);
  });

  it("with a tool executor: the executor's results follow each turn's calls, each call run once, its 503s retried", async () => {
    const executor = await startReferenceExecutor();
    defer(() => executor.close());
    executor.failNext(2, 503);
    const records = agenticRecords('ex', 16, PARALLEL);
    const file = writeAgentic(tmp.dir, 'ex', records);
    const cfg = config('ex', file, { toolExecutor: { url: executor.url, timeoutMs: 5_000, attempts: 3 } });
    const run = spawnCli(['run', '-c', cfg]);
    expect(await run.exited, run.output()).toBe(0);

    const tok = await loadTokenizer(bundledTokenizerPath());
    const turnRecords = readGenerations(path.join(tmp.dir, 'out', 'ex'), 'exec') as unknown as AgenticTurnRecord[];
    const convs = byConversation(turnRecords);
    const placed = expectAgenticChains(tok, 'hermes', sourceMap(records), convs);
    expect(placed.source).toBe(0);
    expect(placed.executor).toBeGreaterThan(10);

    // Each turn's results are the executor's answer to exactly that turn's calls, run once.
    for (const t of turnRecords) {
      if (t.tool_results === undefined) continue;
      const key = `exec/${t.conversation_id}/${t.turn - 1}`;
      expect(executor.executions.get(key), key).toBe(1);
      expect(
        t.tool_results.messages.map((m) => [m.tool_call_id, m.content]),
        key,
      ).toEqual((executor.answers.get(key) ?? []).map((a) => [a.tool_call_id, a.content]));
    }
    expect([...executor.executions.values()].every((n) => n === 1)).toBe(true);
    // The two 503s were retried: some key was asked more than once.
    const asked = new Map<string, number>();
    for (const r of executor.requests) asked.set(r.key, (asked.get(r.key) ?? 0) + 1);
    expect([...asked.values()].some((n) => n > 1)).toBe(true);

    const end = await ends('ex', 'exec');
    expect([...end.keys()].sort()).toEqual(records.map((r) => r.id).sort());
    for (const [id, e] of end) {
      if (e.kind === 'complete') continue;
      const cause = causeOf(e.reason);
      // With an executor, names may differ from the source's; a malformed call is only one cut by
      // the context left (the simulator writes none here).
      if (cause === 'tool-parse')
        expect(convs.get(id)?.at(-1)?.finish_reason, `${id}: ${e.reason}`).toMatchObject({ type: 'length' });
      else expect(cause, `${id}: ${e.reason}`).toMatch(/^(tool-mismatch|tool-unknown|context)$/);
    }
    expect([...end.values()].filter((e) => e.kind === 'complete').length).toBeGreaterThan(0);
  });
});
