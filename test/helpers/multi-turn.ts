// Multi-turn regeneration as the worker does it, for test/integration/multi-turn-parity.test.ts:
// the models' tokenizer folders, the turn-by-turn regeneration of a planned conversation, and the
// generation records and rows the worker and the tokenize step make of its turns.
import { cp, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';

import { conversationTurns, turnHistory } from '../../src/shared/prompts/conversation.js';
import {
  answerMessage,
  loadTokenizer,
  renderTurnPrompt,
  type ChatMessage,
  type ChatTokenizer,
  type RegeneratedAnswer,
} from '../../src/shared/tokenizer/index.js';
import {
  createTokenizeContext,
  recordToRow,
  type GenerationRecord,
  type TokenizeContext,
  type TokenizedRow,
} from '../../src/workers/postprocess/tokenize.js';
import type { AnswerPlan, ConversationPlan, ModelSpec } from './multi-turn-cases.js';
import { copyWithTemplate, lenmlFolder } from './tool-tokenizers.js';

/** The answer's full output text: what the model wrote before its end-of-turn token. */
export function outputText(a: AnswerPlan): string {
  return a.kind === 'think' ? `<think>\n${a.reasoning ?? ''}\n</think>\n\n${a.text}` : a.text;
}

/** The message answerMessage must give for the answer; `nfc`: as the tokenizer normalizes it. */
export function expectedMessage(a: AnswerPlan, nfc: boolean): ChatMessage {
  const n = (s: string): string => (nfc ? s.normalize('NFC') : s);
  return a.kind === 'think'
    ? { role: 'assistant', content: n(a.text), reasoning_content: n(a.reasoning ?? '') }
    : { role: 'assistant', content: n(a.text) };
}

/** One regenerated turn, as the worker builds it. */
export interface TurnStep {
  history: ChatMessage[];
  ids: number[];
  spliced: boolean;
  answer: RegeneratedAnswer;
}

/**
 * Regenerates `plan` turn by turn, as the worker does: turn 1's prompt is encodePrompt of its
 * history; the output ids of turn k are the answer's text encoded, then the template's end-of-turn
 * id (another end-of-turn id with `otherEnd`, none for a cut-off answer); the history carries
 * answerMessage of those ids; turn k's prompt is renderTurnPrompt with turn k − 1's.
 */
export function regenerate(
  tok: ChatTokenizer,
  plan: ConversationPlan,
  templateKwargs?: Record<string, unknown>,
): TurnStep[] {
  const turns = conversationTurns(plan.messages);
  if (typeof turns === 'string') throw new Error(`${plan.name}: ${turns}`);
  if (turns.starts.length !== plan.answers.length) throw new Error(`${plan.name}: not one answer per turn`);
  // The token the template closes a turn with; for a template that closes with text, the EOS.
  const eot = tok.templateEndOfTurnTokenId ?? tok.endOfTurnTokenIds[0];
  if (eot === undefined) throw new Error('the tokenizer has no end-of-turn token');
  const regenerated: ChatMessage[] = [];
  const steps: TurnStep[] = [];
  plan.answers.forEach((a, i) => {
    const history = turnHistory(plan.messages, turns, i + 1, regenerated);
    const prev = steps.at(-1);
    const prompt =
      prev === undefined
        ? { ids: tok.encodePrompt(history, { templateKwargs }), spliced: false }
        : renderTurnPrompt(tok, {
            history,
            previous: { promptIds: prev.ids, history: prev.history, answer: prev.answer },
            ...(templateKwargs === undefined ? {} : { templateKwargs }),
          });
    const answerIds = tok.encode(outputText(a));
    const end = a.otherEnd === true ? tok.endOfTurnTokenIds.find((id) => id !== eot) : eot;
    if (end === undefined) throw new Error(`${plan.name}: the tokenizer has one end-of-turn id`);
    const outputIds = a.kind === 'cut' ? answerIds : [...answerIds, end];
    const message = answerMessage(tok, outputIds);
    regenerated.push(message);
    steps.push({ history, ids: prompt.ids, spliced: prompt.spliced, answer: { outputIds, message } });
  });
  return steps;
}

/** Whether every turn after the first was spliced: the conversation makes one row. */
export const splicedThroughout = (steps: readonly TurnStep[]): boolean => steps.every((s, t) => t === 0 || s.spliced);

/** A model's tokenizer: its folder (for transformers too) and the loaded tokenizer. */
export interface ModelTokenizer {
  dir: string;
  tok: ChatTokenizer;
}

/**
 * The models' tokenizer folders, in `tmp`: the package's own, or one copy per distinct set of
 * added files (a generation_config.json, a chat template), so that models that differ only in
 * their template kwargs share one folder.
 */
export async function tokenizerFolders(specs: readonly ModelSpec[], tmp: string): Promise<string[]> {
  const made = new Map<string, string>();
  const out: string[] = [];
  for (const spec of specs) {
    const key = JSON.stringify([spec.pkg, spec.generationConfig, spec.chatTemplate]);
    let dir = made.get(key);
    if (dir === undefined) {
      const from = lenmlFolder(spec.pkg);
      if (spec.generationConfig === undefined && spec.chatTemplate === undefined) dir = from;
      else {
        dir = path.join(tmp, `tokenizer-${made.size}`);
        if (spec.chatTemplate === undefined) await cp(from, dir, { recursive: true, dereference: true });
        else await copyWithTemplate(from, dir, spec.chatTemplate);
        if (spec.generationConfig !== undefined)
          await writeFile(path.join(dir, 'generation_config.json'), JSON.stringify(spec.generationConfig));
      }
      made.set(key, dir);
    }
    out.push(dir);
  }
  return out;
}

/** The tokenizers of `dirs`, each folder loaded once. */
export async function loadTokenizers(dirs: readonly string[]): Promise<ModelTokenizer[]> {
  const loaded = new Map<string, ChatTokenizer>();
  const out: ModelTokenizer[] = [];
  for (const dir of dirs) {
    const tok = loaded.get(dir) ?? (await loadTokenizer(dir));
    loaded.set(dir, tok);
    out.push({ dir, tok });
  }
  return out;
}

/** The turn's generation record, as the worker writes it: stop at the last id, or length for a cut-off answer. */
export function turnRecord(
  id: string,
  promptIds: readonly number[],
  outputIds: readonly number[],
  cut: boolean,
): GenerationRecord {
  return {
    id,
    dataset: 'd',
    prompt_ids: [...promptIds],
    output_ids: [...outputIds],
    finish_reason: cut
      ? { type: 'length', length: outputIds.length }
      : { type: 'stop', matched: outputIds.at(-1) ?? null },
  };
}

/** recordToRow's row of the record, or why it dropped it. */
export function keptRow(record: GenerationRecord, ctx: TokenizeContext): TokenizedRow | string {
  const outcome = recordToRow(record, ctx);
  return outcome.status === 'kept' ? outcome.row : `dropped (${outcome.reason})`;
}

/**
 * The generation lines of a conversation's turns as the worker writes them (sample-records.ts,
 * with conversation-driver.ts's `history_outputs`: `[]` on turn 1, then each spliced turn appends
 * the previous turn's `[prompt length, output length]`, and a turn rendered from text ends the
 * list for good).
 */
export function turnValues(plan: ConversationPlan, steps: readonly TurnStep[]): Record<string, unknown>[] {
  let history: [number, number][] | undefined = [];
  return steps.map((step, t) => {
    const prev = steps[t - 1];
    if (prev !== undefined)
      history =
        step.spliced && history !== undefined
          ? [...history, [prev.ids.length, prev.answer.outputIds.length]]
          : undefined;
    const record = turnRecord(
      `${plan.name}#t${t + 1}`,
      step.ids,
      step.answer.outputIds,
      plan.answers[t]?.kind === 'cut',
    );
    return {
      ...record,
      prompt_tokens: step.ids.length,
      completion_tokens: step.answer.outputIds.length,
      endpoint: 'http://127.0.0.1:1',
      worker: 'w',
      attempt: 1,
      ts: '2026-01-01T00:00:00.000Z',
      conversation_id: plan.name,
      turn: t + 1,
      turns: steps.length,
      spliced: step.spliced,
      ...(history === undefined ? {} : { history_outputs: history }),
    };
  });
}

/** The model's tokenize context (keepTruncated), or why there is none. */
export function contextOf(tok: ChatTokenizer, spec: ModelSpec): { ctx?: TokenizeContext; error: string } {
  try {
    return {
      ctx: createTokenizeContext(tok, {
        keepTruncated: true,
        ...(spec.templateKwargs === undefined ? {} : { templateKwargs: spec.templateKwargs }),
      }),
      error: '',
    };
  } catch (e: unknown) {
    return { error: String(e) };
  }
}

/**
 * What the template writes for the answer of `history` in `full` (the rendering of history + the
 * answer): the ids of the rendering past the turn's prompt, less the turn end, then the
 * end-of-turn id; or why `full` is not the prompt + an answer + the turn end.
 */
export function writtenOutput(
  tok: ChatTokenizer,
  ctx: TokenizeContext,
  history: ChatMessage[],
  full: string,
  templateKwargs?: Record<string, unknown>,
): number[] | string {
  const promptText = tok.applyChatTemplate(history, {
    addGenerationPrompt: true,
    ...(templateKwargs === undefined ? {} : { templateKwargs }),
  });
  const turnEnd = ctx.format.turnEnd;
  if (!full.startsWith(promptText) || !full.endsWith(turnEnd))
    return `the rendering is not the prompt + an answer + ${JSON.stringify(turnEnd)}`;
  return [...tok.encode(full.slice(promptText.length, full.length - turnEnd.length)), ctx.format.endOfTurnTokenId];
}

/** multi_turn_parity.py's prompt of a turn: apply_chat_template's text and ids, or its error. */
export interface PyPrompt {
  text?: string;
  ids?: number[];
  error?: string;
}

/** multi_turn_parity.py's SpecForge row: the rendered text, its ids and loss mask, or its error. */
export interface PyRow {
  text?: string;
  input_ids?: number[];
  loss_mask?: number[];
  error?: string;
}

/** multi_turn_parity.py's answer to one job, its lists in the order of the job's turns. */
export interface PyReport {
  versions: Record<string, string>;
  prompts: PyPrompt[];
  /** SpecForge's row (train_only_last_turn) of each turn's history + answer. */
  rows: (PyRow | null)[];
  /** SpecForge's row (every assistant turn trained) of each conversation spliced throughout. */
  whole_rows: PyRow[];
  decoded: string[];
}

/** A conversation's part of a {@link PyReport}. */
export interface PyConversation {
  prompts: PyPrompt[];
  rows: (PyRow | null)[];
  decoded: string[];
  /** Its row with every turn trained, where it is spliced throughout. */
  whole?: PyRow | undefined;
}

/**
 * multi_turn_parity.py's job for the regenerated conversations `convs` of one model: each turn's
 * history with its answer, each conversation spliced throughout whole, and each output's ids
 * without the end-of-turn id to decode.
 */
export function pythonJob(
  dir: string,
  spec: ModelSpec,
  tok: ChatTokenizer,
  convs: readonly (readonly TurnStep[])[],
): Record<string, unknown> {
  const kwargs = spec.templateKwargs ?? null;
  const steps = convs.flat();
  return {
    tokenizer_dir: dir,
    specforge: spec.specforge ?? null,
    cases: steps.map((s) => ({ messages: s.history, kwargs, answer: s.answer.message })),
    whole: convs.flatMap((conv) => {
      const last = conv.at(-1);
      return splicedThroughout(conv) && last !== undefined
        ? [{ messages: [...last.history, last.answer.message], kwargs }]
        : [];
    }),
    decode: steps.map((s) => {
      const ids = s.answer.outputIds;
      return tok.endOfTurnTokenIds.includes(ids.at(-1) ?? -1) ? ids.slice(0, -1) : ids;
    }),
  };
}

/** The report of {@link pythonJob}`(…, convs)`, one part per conversation. */
export function reportParts(report: PyReport, convs: readonly (readonly TurnStep[])[]): PyConversation[] {
  let at = 0;
  let whole = 0;
  return convs.map((steps) => {
    const n = steps.length;
    at += n;
    return {
      prompts: report.prompts.slice(at - n, at),
      rows: report.rows.slice(at - n, at),
      decoded: report.decoded.slice(at - n, at),
      whole: splicedThroughout(steps) ? report.whole_rows[whole++] : undefined,
    };
  });
}

/**
 * The generation lines of conversations (each its turns' lines) in two files of `dir`, the turns
 * of the conversations interleaved in both, as concurrent workers write them.
 */
export async function writeGenerationFiles(dir: string, conversations: readonly unknown[][]): Promise<void> {
  await mkdir(dir, { recursive: true });
  const files: string[][] = [[], []];
  const longest = Math.max(...conversations.map((v) => v.length));
  for (let t = 0; t < longest; t++)
    conversations.forEach((lines, c) => {
      const line = lines[t];
      if (line !== undefined) files[(c + t) % 2]?.push(JSON.stringify(line));
    });
  await writeFile(path.join(dir, 'part-a.jsonl'), `${(files[0] ?? []).join('\n')}\n`);
  await writeFile(path.join(dir, 'part-b.jsonl'), `${(files[1] ?? []).join('\n')}\n`);
}
