/**
 * SpecForge 0.2.0's registered chat templates (`specforge/data/template.py`), as far as its
 * preformatted mode (`data.is_preformatted: true`) uses them: `GeneralParser.parse` encodes the
 * line's `text` as it is and supervises each span `re.escape(assistant_header) +
 * "([\s\S]*?(?:" + re.escape(end_of_turn_token) + "|$))"` (the last one alone with
 * `train_only_last_turn`), then zeroes every occurrence of each `ignore_token` string. The
 * template's `system_prompt` and its Jinja rendering play no part there.
 *
 * Left out: templates whose spans another rule finds (`gpt-oss`: the harmony parser; `glm-5.2`,
 * `longcat`, `inkling-thinking`: their own assistant patterns) and `deepseek-r1-distill`, which
 * has no end-of-turn token for the pattern.
 */
import type { TokenizeContext } from '../../workers/index.js';

/** What a chat template writes around an assistant turn (tokenize-template.ts). */
type AssistantTurnFormat = TokenizeContext['format'];

/** One SpecForge template, its fields named as in `ChatTemplate`. */
export interface SpecForgeTemplate {
  /** The name to put in `data.chat_template`. */
  readonly name: string;
  readonly assistant_header: string;
  readonly end_of_turn_token: string;
  readonly ignore_token?: readonly string[];
  /** `thinking` parses preformatted text as `general` does. */
  readonly parser_type: 'general' | 'thinking';
}

const QWEN_HEADER = '<|im_start|>assistant\n';
const QWEN_END = '<|im_end|>\n';
const KIMI_HEADER = '<|im_assistant|>assistant<|im_middle|>';
const DEEPSEEK_HEADER = '<｜Assistant｜>';
const DEEPSEEK_END = '<｜end▁of▁sentence｜>';

/** In SpecForge's registration order. */
export const SPECFORGE_TEMPLATES: readonly SpecForgeTemplate[] = [
  {
    name: 'llama3',
    assistant_header: '<|start_header_id|>assistant<|end_header_id|>\n\n',
    end_of_turn_token: '<|eot_id|>',
    parser_type: 'general',
  },
  {
    name: 'llama4',
    assistant_header: '<|header_start|>assistant<|header_end|>\n\n',
    end_of_turn_token: '<|eot|>',
    parser_type: 'general',
  },
  { name: 'qwen', assistant_header: QWEN_HEADER, end_of_turn_token: QWEN_END, parser_type: 'general' },
  { name: 'lfm', assistant_header: QWEN_HEADER, end_of_turn_token: QWEN_END, parser_type: 'general' },
  { name: 'phi3', assistant_header: '<|assistant|>\n', end_of_turn_token: '<|end|>\n', parser_type: 'general' },
  {
    name: 'phi4',
    assistant_header: '<|im_start|>assistant<|im_sep|>',
    end_of_turn_token: '<|im_end|>',
    parser_type: 'general',
  },
  { name: 'phi4-mini', assistant_header: '<|assistant|>', end_of_turn_token: '<|end|>', parser_type: 'general' },
  {
    name: 'gpt-oss-naive',
    assistant_header: '<|start|>assistant<|channel|>analysis<|message|>',
    end_of_turn_token: '<|end|>',
    parser_type: 'general',
  },
  { name: 'qwen3-thinking', assistant_header: QWEN_HEADER, end_of_turn_token: QWEN_END, parser_type: 'thinking' },
  {
    name: 'qwen3-instruct',
    assistant_header: QWEN_HEADER,
    end_of_turn_token: QWEN_END,
    ignore_token: ['<think>\n\n</think>\n\n'],
    parser_type: 'general',
  },
  {
    name: 'qwen3-next-thinking',
    assistant_header: '<|im_start|>assistant\n<think>\n',
    end_of_turn_token: QWEN_END,
    parser_type: 'thinking',
  },
  { name: 'kimi-k2-thinking', assistant_header: KIMI_HEADER, end_of_turn_token: '<|im_end|>', parser_type: 'thinking' },
  { name: 'kimi-k2-instruct', assistant_header: KIMI_HEADER, end_of_turn_token: '<|im_end|>', parser_type: 'general' },
  {
    name: 'kimi-k3-thinking',
    assistant_header: '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>',
    end_of_turn_token: '<|end_of_msg|>',
    ignore_token: ['<|end_of_msg|>'],
    parser_type: 'thinking',
  },
  { name: 'deepseek-v3', assistant_header: DEEPSEEK_HEADER, end_of_turn_token: DEEPSEEK_END, parser_type: 'general' },
  { name: 'deepseek-v2', assistant_header: 'Assistant: ', end_of_turn_token: DEEPSEEK_END, parser_type: 'general' },
  {
    name: 'ling-flash-2.0',
    assistant_header: '<role>ASSISTANT</role>',
    end_of_turn_token: '<|role_end|>',
    parser_type: 'general',
  },
  { name: 'deepseek-v32', assistant_header: DEEPSEEK_HEADER, end_of_turn_token: DEEPSEEK_END, parser_type: 'thinking' },
  {
    name: 'gemma',
    assistant_header: '<start_of_turn>model\n',
    end_of_turn_token: '<end_of_turn>\n',
    parser_type: 'general',
  },
  {
    name: 'longcat_xml',
    assistant_header: '<longcat_assistant>',
    end_of_turn_token: '</longcat_s>',
    parser_type: 'general',
  },
  {
    name: 'qwen3.5',
    assistant_header: '<|im_start|>assistant\n<think>\n',
    end_of_turn_token: QWEN_END,
    parser_type: 'thinking',
  },
];

/** Which SpecForge template supervises the rows of a chat template as tokenmill does. */
export interface TemplateMatch {
  /** The template to use, undefined when none fits. */
  template: SpecForgeTemplate | undefined;
  /** Every template that fits (the first `general` one, else the first, is {@link template}). */
  fitting: string[];
  /** What the chat template writes, as the match saw it (for the report). */
  format: { assistant_header: string; end_of_turn: string; ignorable: string[] };
}

function sameSet(a: readonly string[], b: readonly string[]): boolean {
  const x = new Set(a);
  const y = new Set(b);
  return x.size === y.size && [...x].every((s) => y.has(s));
}

/**
 * The SpecForge template whose spans are tokenmill's supervised tokens for the chat template
 * whose assistant turn is `format` (tokenize-template.ts reads it off the template's own
 * rendering): the same assistant header (a span starts right after it, where a generation's
 * output starts), an end-of-turn token equal to what the template writes after an answer (the
 * end-of-turn token and its suffix, both supervised in a row), and `ignore_token` equal to the
 * strings the template writes into an answer that has none (Qwen3's empty think block, never
 * supervised in a row). A `general` parser is preferred to a `thinking` one (Kimi K2 →
 * `kimi-k2-instruct`, DeepSeek-V3 → `deepseek-v3`).
 */
export function matchSpecForgeTemplate(format: AssistantTurnFormat): TemplateMatch {
  const fits = SPECFORGE_TEMPLATES.filter(
    (t) =>
      t.assistant_header === format.header &&
      t.end_of_turn_token === format.turnEnd &&
      sameSet(t.ignore_token ?? [], format.ignorablePrefixes),
  );
  return {
    template: fits.find((t) => t.parser_type === 'general') ?? fits[0],
    fitting: fits.map((t) => t.name),
    format: {
      assistant_header: format.header,
      end_of_turn: format.turnEnd,
      ignorable: [...format.ignorablePrefixes],
    },
  };
}
