/**
 * Chat messages as tokenmill reads them, and how they are handed to a chat template: the
 * message shape, transformers' normalization of a message, and Kimi's sorting of tool schemas.
 */
import { z } from 'zod';

/** Roles a chat message may have. */
export const ChatRoleSchema = z.enum(['system', 'user', 'assistant', 'tool']);
export type ChatRole = z.infer<typeof ChatRoleSchema>;

/** One chat message, in the OpenAI / Hugging Face chat shape. */
export const ChatMessageSchema = z.object({
  role: ChatRoleSchema,
  content: z.string(),
  /** The assistant's reasoning, for templates that render it (Qwen3's `<think>` block). */
  reasoning_content: z.string().optional(),
  tool_calls: z.array(z.unknown()).optional(),
  name: z.string().optional(),
  tool_call_id: z.string().optional(),
});
export type ChatMessage = z.infer<typeof ChatMessageSchema>;

/** Options of {@link ChatTokenizer.applyChatTemplate}. */
export interface ApplyChatTemplateOptions {
  /** Append the assistant header so that the model's answer follows. */
  addGenerationPrompt: boolean;
  /** Tool (function) JSON schemas, passed to the template as `tools`. */
  tools?: unknown[] | undefined;
  /** Extra template variables (e.g. `{ enable_thinking: false }`); they override the special tokens. */
  templateKwargs?: Record<string, unknown> | undefined;
  /**
   * The moment `strftime_now` renders (default: the clock's). A prompt rendered again to compare
   * with a record's `prompt_ids` passes the record's generation time, so a template that writes
   * the date (Llama 3.2) renders the day it was generated on.
   */
  now?: Date | undefined;
}

/** Options of {@link ChatTokenizer.encodePrompt}: the generation prompt is always added. */
export type EncodePromptOptions = Omit<ApplyChatTemplateOptions, 'addGenerationPrompt'>;

/**
 * A conversation of {@link ChatTokenizer.encodePrompts}: its messages, or its messages with the
 * tool schemas it is rendered with (a record's own `tools`).
 */
export type PromptToEncode =
  readonly ChatMessage[] | { readonly messages: readonly ChatMessage[]; readonly tools?: unknown[] | undefined };

/** Reasoning fields transformers aliases onto each other before rendering. */
const REASONING_FIELDS = ['reasoning_content', 'thinking', 'reasoning'] as const;

/**
 * Mirrors transformers: drop keys whose value is null/undefined, then alias the reasoning
 * fields (`thinking` first, the message's own keys, then `reasoning_content`).
 */
export function normalizeMessage(message: ChatMessage): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(message)) {
    if (value !== undefined && value !== null) out[key] = value;
  }
  let reasoning: unknown;
  for (const key of REASONING_FIELDS) {
    if (out[key] !== undefined) {
      reasoning = out[key];
      break;
    }
  }
  if (reasoning === undefined) return out;
  return { thinking: reasoning, ...out, reasoning_content: reasoning };
}

/** Objects with their keys sorted, recursively (Kimi's `deep_sort_dict` of the tools). */
export function deepSortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(deepSortKeys);
  if (value !== null && typeof value === 'object') {
    const obj = value as Record<string, unknown>;
    return Object.fromEntries(
      Object.keys(obj)
        .sort()
        .map((k) => [k, deepSortKeys(obj[k])]),
    );
  }
  return value;
}
