/**
 * Tool calls as tokenmill reads them from the model's output and from the source conversation
 * (docs/agentic.md): the call formats of the model families it supports, and the shapes that
 * pass between the parser, the matcher and the driver of a conversation.
 */

/**
 * How a model writes its tool calls, named after SGLang's `--tool-call-parser`:
 * - `hermes`: Qwen3 / Qwen2.5 / Hermes, `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`;
 * - `llama3`: Llama 3.1 / 3.2, a JSON object `{"name": …, "parameters": {…}}` as the message
 *   (optionally after `<|python_tag|>`; several separated by `;`);
 * - `deepseekv3`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
 * - `kimi_k2`: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>`.
 */
export const TOOL_CALL_FORMATS = ['hermes', 'llama3', 'deepseekv3', 'kimi_k2'] as const;
export type ToolCallFormat = (typeof TOOL_CALL_FORMATS)[number];

/** One call, in the OpenAI chat shape the chat templates render (`message.tool_calls[i]`). */
export interface ToolCall {
  /** The model's own id where its format writes one (Kimi K2: `functions.NAME:IDX`), else `call_<turn>_<i>`. */
  id: string;
  type: 'function';
  function: {
    name: string;
    /**
     * The arguments as the family's chat template expects them in a history: a JSON object for
     * templates that serialize it themselves (`| tojson`), the JSON text for those that print it.
     */
    arguments: Record<string, unknown> | string;
  };
}

/** A generated turn read for its calls: the text before them, and the calls in order. */
export type ParsedTurn =
  | { ok: true; content: string; calls: ToolCall[] }
  /** The output opens a call that does not parse; `reason` says which call and why, on one line. */
  | { ok: false; reason: string };
