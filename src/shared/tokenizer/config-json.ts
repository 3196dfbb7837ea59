/**
 * Reading a Hugging Face tokenizer's JSON: tokens given as strings or `{content}` objects, the
 * added tokens of tokenizer.json and `added_tokens_decoder`, and `chat_template` in its shapes.
 */
import { isRecord } from '../util/index.js';

/** Parsed `added_tokens` entry of tokenizer.json / value of `added_tokens_decoder`. */
export interface AddedTokenEntry {
  id: number;
  content: string;
  special: boolean;
}

/** The parts of `tokenizer_config.json` this module reads. */
export type TokenizerConfigJson = Record<string, unknown>;

/** A token given as `"<s>"` or `{ "content": "<s>", ... }` (transformers' serialized AddedToken). */
export function tokenContent(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (value !== null && typeof value === 'object' && 'content' in value) {
    const content = (value as { content: unknown }).content;
    if (typeof content === 'string') return content;
  }
  return undefined;
}

/** `chat_template` as a string, a list of `{name, template}`, or an object by name. */
export function templatesFromConfig(value: unknown): Map<string, string> {
  const out = new Map<string, string>();
  if (typeof value === 'string') {
    out.set('default', value);
  } else if (Array.isArray(value)) {
    for (const entry of value) {
      if (isRecord(entry) && typeof entry.name === 'string' && typeof entry.template === 'string') {
        out.set(entry.name, entry.template);
      }
    }
  } else if (isRecord(value)) {
    for (const [name, template] of Object.entries(value)) {
      if (typeof template === 'string') out.set(name, template);
    }
  }
  return out;
}

/** Added tokens from tokenizer.json's `added_tokens` and the config's `added_tokens_decoder`. */
export function collectAddedTokens(
  tokenizerJson: Record<string, unknown>,
  config: TokenizerConfigJson,
): AddedTokenEntry[] {
  const byId = new Map<number, AddedTokenEntry>();
  const list = tokenizerJson.added_tokens;
  if (Array.isArray(list)) {
    for (const t of list) {
      if (isRecord(t) && typeof t.id === 'number' && typeof t.content === 'string') {
        byId.set(t.id, { id: t.id, content: t.content, special: t.special === true });
      }
    }
  }
  const decoder = config.added_tokens_decoder;
  if (isRecord(decoder)) {
    for (const [key, t] of Object.entries(decoder)) {
      const id = Number(key);
      const content = tokenContent(t);
      if (!Number.isInteger(id) || content === undefined || !isRecord(t)) continue;
      const known = byId.get(id);
      byId.set(id, { id, content, special: t.special === true || known?.special === true });
    }
  }
  return [...byId.values()];
}
