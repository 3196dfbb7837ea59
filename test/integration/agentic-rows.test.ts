/**
 * The training rows of agentic conversations, end to end (real CLI, real Redis, the simulator
 * over real HTTP calling tools in Qwen3's Hermes format, parallel calls among them): hand-made
 * SWE-style records with OpenAI tools, regenerated turn by turn by `tokenmill run`, then
 * tokenized with `postprocess.rows: conversation` (the run's own round) and again with `per-turn`
 * (`tokenmill postprocess` into another dataset). In both, what the model generated — its calls
 * included — is supervised and nothing else: the tool schemas in the system block, every
 * `<tool_response>` span, the user turns and the assistant headers are 0
 * (test/helpers/agentic-rows.ts). Both make the same generated turns supervised: a conversation
 * row holds, turn by turn, what the rows of its turns hold.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';

import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';

import { bundledTokenizerPath, loadTokenizer, readHfDataset, type ConfigInput } from '../../src/shared/index.js';
import { agenticRecords, writeAgentic } from '../helpers/agentic.js';
import { expectAgenticRowMasks, type AgenticRow, type AgenticRowTurn } from '../helpers/agentic-rows.js';
import { writeTestConfig, type TestConfigSpec } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { readGenerations, spawnCli, writeConfig } from '../helpers/pipeline.js';

const PARALLEL = 0.3;

const { redis, sim, tmp } = useHarness({
  redis: true,
  sim: {
    timeScale: 200,
    maxRunningRequests: 32,
    seed: 41,
    outputLength: { distribution: 'uniform', mean: 24, min: 8, max: 40 },
    // Mostly the source's calls, so that many conversations run to their end (one row each);
    // some divergent or malformed, so that others end early (a row per turn).
    toolCalls: { probability: 0.95, parallel: PARALLEL, divergent: 0.05, malformed: 0.05 },
  },
  tmp: 'tm-agentic-rows-',
  cli: true,
});

async function rowsOf(dir: string): Promise<AgenticRow[]> {
  const out: AgenticRow[] = [];
  for await (const r of (await readHfDataset(dir)).rows()) out.push(r as unknown as AgenticRow);
  return out;
}

describe('agentic training rows', () => {
  it('supervise the generated turns, calls included, and neither tool schemas nor tool results, as conversation rows and per-turn rows', async () => {
    const records = agenticRecords('ag', 24, PARALLEL);
    const file = writeAgentic(tmp.dir, 'ag', records);
    const cfg: TestConfigSpec = {
      run: 'ag-rows',
      redis,
      sim,
      datasets: [
        {
          name: 'ag',
          prompts: path.basename(file),
          turns: 'all',
          tokenBudget: 1_000_000,
          maxNewTokens: 256,
          batchSize: 4,
        },
      ],
    };
    const conversationCfg = writeTestConfig(tmp.dir, cfg, 'conversation.yaml');
    const run = spawnCli(['run', '-c', conversationCfg]);
    expect(await run.exited, run.output()).toBe(0);

    const tok = await loadTokenizer(bundledTokenizerPath());
    const turnRecords = readGenerations(path.join(tmp.dir, 'out', 'ag-rows'), 'ag') as unknown as AgenticRowTurn[];
    expect(turnRecords.length).toBeGreaterThan(records.length);

    // rows: conversation (the default), the run's own round.
    const conversationRows = await rowsOf(path.join(tmp.dir, 'out', 'ag-rows', 'train-dataset'));
    const whole = expectAgenticRowMasks(tok, conversationRows, turnRecords);
    expect(whole.conversationRows, 'conversations run to their end: one row each').toBeGreaterThan(0);
    expect(whole.turnRows, 'conversations ended early: a row per turn').toBeGreaterThan(0);
    expect(whole.supervisedCalls, 'generated calls supervised').toBeGreaterThan(0);
    expect(whole.toolResponses, 'tool results present, unsupervised').toBeGreaterThan(0);
    expect(whole.toolSchemaBlocks, 'every row holds the tool schemas, unsupervised').toBe(conversationRows.length);
    // Parallel calls (several in one turn) among the turns of whole-conversation rows.
    const callId = tok.tokenToId('<tool_call>');
    const wholeIds = new Set(conversationRows.filter((r) => !/#t\d+$/.test(r.id)).map((r) => r.id));
    const parallelInWhole = turnRecords.filter(
      (t) => wholeIds.has(t.conversation_id) && t.output_ids.filter((id) => id === callId).length >= 2,
    ).length;
    expect(parallelInWhole, 'turns with parallel calls in conversation rows').toBeGreaterThan(0);

    // rows: per-turn, from the same records into another dataset.
    const perTurnCfg = writeConfig(
      tmp.dir,
      {
        ...(parse(readFileSync(conversationCfg, 'utf8')) as ConfigInput),
        postprocess: { rows: 'per-turn', target: 'per-turn-dataset' },
      },
      'per-turn.yaml',
    );
    const pp = spawnCli(['postprocess', '-c', perTurnCfg]);
    expect(await pp.exited, pp.output()).toBe(0);
    const perTurnRows = await rowsOf(path.join(tmp.dir, 'per-turn-dataset'));
    const turns = expectAgenticRowMasks(tok, perTurnRows, turnRecords);
    expect(turns.conversationRows).toBe(0);
    expect(turns.turnRows).toBe(turnRecords.filter((t) => t.finish_reason.type === 'stop').length);
    expect(turns.toolSchemaBlocks).toBe(perTurnRows.length);
    expect(turns.toolResponses).toBeGreaterThan(0);

    // The same generated turns supervised either way, and the same calls.
    expect(whole.supervisedOutputs).toBe(turns.supervisedOutputs);
    expect(whole.supervisedCalls).toBe(turns.supervisedCalls);
    process.stdout.write(
      `agentic rows: conversation ${whole.conversationRows} whole + ${whole.turnRows} turn rows, per-turn ${turns.turnRows} rows; ` +
        `${whole.supervisedOutputs} outputs, ${whole.supervisedCalls} calls supervised; ${whole.toolResponses} tool results unsupervised\n`,
    );
  });
});
