/**
 * The call format a chat template's model writes, from what the template itself writes when it
 * renders a call in a history or describes the format to the model.
 */
import type { ToolCallFormat } from './types.js';

/**
 * The format of `templateSource` (`ChatTokenizer.chatTemplateSource()`): Kimi K2's
 * `<|tool_calls_section_begin|>`, DeepSeek-V3's `<｜tool▁calls▁begin｜>`, Hermes' `<tool_call>`,
 * or Llama 3.1's JSON calls (`<|python_tag|>`, or `"parameters"` beside the `ipython` role).
 * Undefined for a template that renders no call.
 */
export function detectToolCallFormat(templateSource: string | undefined): ToolCallFormat | undefined {
  if (templateSource === undefined) return undefined;
  if (templateSource.includes('tool_calls_section_begin')) return 'kimi_k2';
  if (templateSource.includes('tool▁calls▁begin')) return 'deepseekv3';
  if (templateSource.includes('<tool_call>')) return 'hermes';
  if (templateSource.includes('<|python_tag|>')) return 'llama3';
  if (templateSource.includes('"parameters"') && templateSource.includes('ipython')) return 'llama3';
  return undefined;
}
