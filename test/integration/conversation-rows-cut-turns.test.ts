/**
 * Conversation rows (`postprocess.rows: conversation`, `turns: all`) supervise only what the model
 * produced, ended as the model ended it (DESIGN invariant 13): an earlier turn cut off without the
 * model's end-of-turn token (finish_reason `length`, `abort` as `budget: strict` sends it, a
 * matched stop string) is followed in the spliced history by the end of turn the chat template
 * wrote, and that close is never supervised; the cut turn's own output is supervised only where a
 * row of its own would keep it (`length` and `abort` with `postprocess.keepTruncated`).
 *
 * The turn records are what the worker writes (prompts from renderTurnPrompt with the real Qwen3
 * tokenizer, spliced token for token, `history_outputs` as conversation-driver.ts appends it),
 * then go through the real tokenize step (wholeConversationRows + rowsFromGenerations), the
 * `postprocess` CLI into the training dataset, and `export --format jsonl | speculators |
 * specforge`.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import {
  answerMessage,
  bundledTokenizerPath,
  loadTokenizer,
  readHfDataset,
  renderTurnPrompt,
  type ChatMessage,
  type ChatTokenizer,
  type FinishReason,
} from '../../src/shared/index.js';
import { wholeConversationRows } from '../../src/workers/postprocess/tokenize-conversation-rows.js';
import {
  createTokenizeContext,
  emptyGenerationStats,
  rowsFromGenerations,
  type TokenizedRow,
} from '../../src/workers/postprocess/tokenize.js';
import { writeTestConfig } from '../helpers/config.js';
import { useHarness } from '../helpers/fixture.js';
import { spawnCli } from '../helpers/pipeline.js';

const { redis, tmp } = useHarness({ redis: true, tmp: 'tm-cut-turns-', cli: true });

const DATASET = 'mt';

/** One planned turn: the model's answer text, and how its generation ended. */
interface PlannedTurn {
  text: string;
  end: 'eot' | 'length' | 'abort' | 'stop-string';
}

/** A conversation's user questions and how each of its turns ended. */
interface Planned {
  id: string;
  questions: string[];
  turns: PlannedTurn[];
}

const PLANS: Planned[] = [
  {
    // Turn 1 cut at max_new_tokens, turn 2 stopped on a stop string, turn 3 ended by the model.
    id: 'cut',
    questions: ['What is the capital of France?', 'And of Italy?', 'Thanks, and Spain?'],
    turns: [
      { text: 'The capital of France is Paris, a city', end: 'length' },
      { text: 'Rome is the capital of Italy. STOP', end: 'stop-string' },
      { text: 'Madrid is the capital of Spain.', end: 'eot' },
    ],
  },
  {
    // Turn 1 aborted at the budget (`budget: strict`), turn 2 ended by the model.
    id: 'aborted',
    questions: ['Name a prime number.', 'Another one?'],
    turns: [
      { text: 'Seven is a prime', end: 'abort' },
      { text: 'Eleven is prime too.', end: 'eot' },
    ],
  },
  {
    // Every turn ended by the model: one SpecForge all-turns line, every close supervised.
    id: 'closed',
    questions: ['Say hello.', 'Say goodbye.'],
    turns: [
      { text: 'Hello there.', end: 'eot' },
      { text: 'Goodbye for now.', end: 'eot' },
    ],
  },
];

/** What the test knows about one turn of a conversation row: where it sits and how it ended. */
interface TurnLayout {
  end: PlannedTurn['end'];
  /** Its output's start and end in the last turn's prompt ids (or the row, for the last turn). */
  start: number;
  outputEnd: number;
  /**
   * The end of what the template wrote after it to close it (after a cut-off output `<|im_end|>\n`,
   * else the `\n` after the model's `<|im_end|>`), in the last turn's prompt.
   */
  closeEnd: number;
  /** Where the next turn's output starts (its prompt's end). */
  nextStart: number;
}

interface Built {
  lines: Record<string, unknown>[];
  /** Per conversation, its turns' layout in its last turn's prompt. */
  layout: Map<string, TurnLayout[]>;
  promptLines: string[];
}

function finishOf(t: PlannedTurn, outputIds: readonly number[], eot: number): FinishReason {
  switch (t.end) {
    case 'eot':
      return { type: 'stop', matched: eot };
    case 'stop-string':
      return { type: 'stop', matched: 'STOP' };
    case 'length':
      return { type: 'length', length: outputIds.length };
    case 'abort':
      return { type: 'abort', message: 'token budget met (budget: strict)' };
  }
}

/** Regenerates each planned conversation turn by turn, as conversation-driver.ts does. */
function build(tok: ChatTokenizer): Built {
  const eot = tok.tokenToId('<|im_end|>');
  if (eot === undefined) throw new Error('not the Qwen3 tokenizer');
  const lines: Record<string, unknown>[] = [];
  const layout = new Map<string, TurnLayout[]>();
  const promptLines: string[] = [];
  for (const plan of PLANS) {
    const source: ChatMessage[] = plan.questions.flatMap((q) => [
      { role: 'user' as const, content: q },
      { role: 'assistant' as const, content: 'source answer, never sent' },
    ]);
    promptLines.push(JSON.stringify({ id: plan.id, messages: source }));
    let history: ChatMessage[] = [];
    let previous: Parameters<typeof renderTurnPrompt>[1]['previous'];
    let historyOutputs: [number, number][] = [];
    const turns: TurnLayout[] = [];
    plan.turns.forEach((t, k) => {
      history = [...history, { role: 'user', content: plan.questions[k] ?? '' }];
      const prompt = renderTurnPrompt(tok, { history, ...(previous === undefined ? {} : { previous }) });
      if (k > 0) {
        expect(prompt.spliced, `${plan.id} turn ${k + 1} is spliced`).toBe(true);
        const prev = previous as NonNullable<typeof previous>;
        historyOutputs = [...historyOutputs, [prev.promptIds.length, prev.answer.outputIds.length]];
      }
      const outputIds = [...tok.encode(t.text), ...(t.end === 'eot' ? [eot] : [])];
      lines.push({
        id: `${plan.id}#t${k + 1}`,
        dataset: DATASET,
        prompt_ids: prompt.ids,
        output_ids: outputIds,
        prompt_tokens: prompt.ids.length,
        completion_tokens: outputIds.length,
        finish_reason: finishOf(t, outputIds, eot),
        endpoint: 'http://127.0.0.1:1',
        worker: 'w',
        attempt: 1,
        ts: '2026-03-01T12:00:00.000Z',
        conversation_id: plan.id,
        turn: k + 1,
        turns: plan.turns.length,
        spliced: k > 0,
        history_outputs: historyOutputs,
      });
      turns.push({
        end: t.end,
        start: prompt.ids.length,
        outputEnd: prompt.ids.length + outputIds.length,
        closeEnd: 0,
        nextStart: 0,
      });
      const answer = { outputIds, message: answerMessage(tok, outputIds) };
      previous = { promptIds: prompt.ids, history, answer, text: prompt.text };
      history = [...history, answer.message];
    });
    const last = lines.at(-1) as { prompt_ids: number[] };
    const newline = tok.encode('\n');
    turns.forEach((t, k) => {
      t.nextStart = turns[k + 1]?.start ?? last.prompt_ids.length;
      if (k === turns.length - 1) return;
      const close = t.end === 'eot' ? newline : [eot, ...newline];
      t.closeEnd = t.outputEnd + close.length;
      expect(last.prompt_ids.slice(t.outputEnd, t.closeEnd), `${plan.id} turn ${k + 1}: its close`).toEqual(close);
    });
    layout.set(plan.id, turns);
  }
  return { lines, layout, promptLines };
}

/** The mask a conversation row must have over each earlier turn's output and close. */
function expectEarlierTurns(row: { loss_mask: number[] }, turns: readonly TurnLayout[], keepTruncated: boolean): void {
  for (const [k, t] of turns.slice(0, -1).entries()) {
    const output = row.loss_mask.slice(t.start, t.outputEnd);
    const close = row.loss_mask.slice(t.outputEnd, t.closeEnd);
    const where = `turn ${k + 1} (${t.end})`;
    // The next user turn and generation prompt are context.
    expect(
      row.loss_mask.slice(t.closeEnd, t.nextStart).every((m) => m === 0),
      `${where}: then context`,
    ).toBe(true);
    if (t.end === 'eot') {
      // Ended by the model: its output, its own end-of-turn token and the template's suffix.
      expect(
        output.every((m) => m === 1),
        `${where}: output supervised`,
      ).toBe(true);
      expect(
        close.every((m) => m === 1),
        `${where}: suffix supervised`,
      ).toBe(true);
      continue;
    }
    // Cut off: the close the template wrote is context; the output is a row's only where a row of its own keeps it.
    expect(close, `${where}: the template's close is not supervised`).toEqual(close.map(() => 0));
    const kept = t.end === 'stop-string' || keepTruncated;
    expect(output, `${where}: output ${kept ? '' : 'not '}supervised`).toEqual(output.map(() => (kept ? 1 : 0)));
  }
  // The last turn ended by the model: its output and end-of-turn token, then the template's suffix, supervised.
  const last = turns.at(-1) as TurnLayout;
  expect(row.loss_mask.slice(last.start).every((m) => m === 1)).toBe(true);
}

describe('conversation rows of conversations with a cut-off turn', () => {
  let tok: ChatTokenizer;
  let built: Built;
  let genDir: string;

  beforeAll(async () => {
    tok = await loadTokenizer(bundledTokenizerPath());
    built = build(tok);
    genDir = path.join(tmp.dir, 'out', 'cut', DATASET, 'generations');
    mkdirSync(genDir, { recursive: true });
    writeFileSync(path.join(genDir, 'part-0.jsonl'), `${built.lines.map((l) => JSON.stringify(l)).join('\n')}\n`);
    writeFileSync(path.join(tmp.dir, 'mt.jsonl'), `${built.promptLines.join('\n')}\n`);
  });

  for (const keepTruncated of [false, true]) {
    it(`never supervises the template's close after a cut-off turn (tokenize, keepTruncated: ${keepTruncated})`, async () => {
      const ctx = createTokenizeContext(tok, { keepTruncated });
      const whole = await wholeConversationRows(genDir, undefined, ctx, DATASET);
      const stats = emptyGenerationStats();
      const rows = new Map<string, TokenizedRow>();
      for await (const row of rowsFromGenerations(genDir, {
        ctx,
        dataset: DATASET,
        stats,
        ...(whole === undefined ? {} : { conversationRows: whole }),
      }))
        rows.set(row.id, row);
      expect([...rows.keys()].sort()).toEqual(['aborted', 'closed', 'cut']);
      expect(stats.conversationRows).toBe(3);
      for (const plan of PLANS) {
        const row = rows.get(plan.id) as TokenizedRow;
        const turns = built.layout.get(plan.id) as TurnLayout[];
        const lastLine = built.lines.filter((l) => l.conversation_id === plan.id).at(-1) as { prompt_ids: number[] };
        expect(row.input_ids.slice(0, lastLine.prompt_ids.length), plan.id).toEqual(lastLine.prompt_ids);
        expectEarlierTurns(row, turns, keepTruncated);
      }
    });
  }

  it('writes the same masks through postprocess and every export format', async () => {
    const config = writeTestConfig(tmp.dir, {
      run: 'cut',
      redis,
      sim: 'http://127.0.0.1:9',
      datasets: [{ name: DATASET, prompts: 'mt.jsonl', turns: 'all', tokenBudget: 1_000_000 }],
      postprocess: { keepTruncated: false },
    });
    const pp = spawnCli(['postprocess', '-c', config]);
    expect(await pp.exited, pp.output()).toBe(0);

    // The training dataset, as export --format jsonl writes it.
    const rowsOut = path.join(tmp.dir, 'export', 'rows.jsonl');
    const jsonl = spawnCli(['export', '-c', config, '--format', 'jsonl', '--out', rowsOut]);
    expect(await jsonl.exited, jsonl.output()).toBe(0);
    const rows = readFileSync(rowsOut, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; input_ids: number[]; loss_mask: number[] });
    expect(rows.map((r) => r.id).sort()).toEqual(['aborted', 'closed', 'cut']);
    for (const r of rows) expectEarlierTurns(r, built.layout.get(r.id) as TurnLayout[], false);

    // export --format speculators: the same rows, the same masks.
    const specOut = path.join(tmp.dir, 'export', 'speculators');
    const spec = spawnCli(['export', '-c', config, '--format', 'speculators', '--out', specOut]);
    expect(await spec.exited, spec.output()).toBe(0);
    const specRows: { input_ids: number[]; loss_mask: number[] }[] = [];
    for await (const r of (await readHfDataset(specOut)).rows())
      specRows.push({
        input_ids: (r.input_ids as unknown[]).map(Number),
        loss_mask: (r.loss_mask as unknown[]).map(Number),
      });
    expect(specRows.map((r) => r.loss_mask).sort()).toEqual(rows.map((r) => r.loss_mask).sort());

    // export --format specforge: SpecForge's loader supervises every assistant span of an
    // all-turns line, a template's close included, so only the conversation ended by the model
    // throughout is one; the others are one last-turn line per turn their rows supervise.
    const sfOut = path.join(tmp.dir, 'export', 'sf.jsonl');
    const sf = spawnCli(['export', '-c', config, '--format', 'specforge', '--out', sfOut]);
    expect(await sf.exited, sf.output()).toBe(0);
    const read = (file: string): { id: string; text: string }[] =>
      readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as { id: string; text: string });
    expect(read(path.join(tmp.dir, 'export', 'sf.all-turns.jsonl')).map((l) => l.id)).toEqual(['closed']);
    const perTurn = read(sfOut);
    // Without keepTruncated, the cut (length) and aborted turns are no rows: their later turns are.
    expect(perTurn.map((l) => l.id).sort()).toEqual(['aborted#t2', 'cut#t2', 'cut#t3']);
    // Each line's last assistant span (what SpecForge supervises with train_only_last_turn) is that turn's answer.
    for (const l of perTurn) {
      const line = built.lines.find((x) => x.id === l.id) as { prompt_ids: number[]; output_ids: number[] };
      expect(l.text.startsWith(tok.decode(line.prompt_ids, { skipSpecialTokens: false })), l.id).toBe(true);
    }
  }, 120_000);
});
