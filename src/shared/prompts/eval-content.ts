/**
 * The eval split by content (docs/eval.md, "Held out by content"): a prompt whose content is a
 * held-out prompt's content is held out too, in every dataset of the run, whatever its id.
 *
 * - {@link promptContentKey}: what "the same content" means — the prompt's user turns, in order,
 *   each normalized (Unicode NFC, runs of white space as one space, trimmed), as a JSON array,
 *   hashed (the first 16 hex digits of SHA-256). System prompts, the source's assistant turns and
 *   tool results do not count, nor do tool schemas: the same questions under another system prompt,
 *   or given other tools, are the same prompt.
 * - `<run dir>/<dataset>/eval-held-out-ids.json` ({@link HeldOutIdsFile}): the ids of the dataset
 *   held out, by id (its own split) and by content (with the held-out prompt each one matches),
 *   written by the producer before it sends anything, read by the tokenize step so that rows
 *   generated before the split existed are not trained on either.
 */
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AppError } from '../errors.js';
import type { ChatMessage } from '../tokenizer/index.js';

/** The file, in `<run dir>/<dataset>/`, of the dataset's held-out ids. */
export const HELD_OUT_IDS_FILE = 'eval-held-out-ids.json';

/** A held-out prompt's content key: its user turns, normalized, hashed (see the module comment). */
export function promptContentKey(messages: readonly Pick<ChatMessage, 'role' | 'content'>[]): string {
  const users = messages
    .filter((m) => m.role === 'user')
    .map((m) => m.content.normalize('NFC').replace(/\s+/g, ' ').trim());
  return createHash('sha256').update(JSON.stringify(users)).digest('hex').slice(0, 16);
}

/** `eval-held-out-ids.json`. */
export interface HeldOutIdsFile {
  dataset: string;
  /** Ids of the dataset's own split (eval-prompts.jsonl). */
  byId: string[];
  /** Ids whose content is a held-out prompt's, with that prompt (`<dataset>/<id>`). */
  sameContent: { id: string; as: string }[];
  /** When it was written (ISO 8601). */
  written: string;
}

/** The held-out ids of a dataset, as the tokenize step checks its rows' sample ids against them. */
export interface HeldOutIds {
  byId: number;
  sameContent: number;
  /**
   * Whether a sample id is of a held-out prompt: the prompt's id itself, or one of its samples
   * (`<id>#s<k>`, `samplesPerPrompt`) or turns (`<id>#t<k>`, `turns: all`).
   */
  has(sampleId: string): boolean;
}

/** Whether `sampleId` is `id` or a sample or turn of it. */
export function isSampleOf(ids: ReadonlySet<string>, sampleId: string): boolean {
  if (ids.has(sampleId)) return true;
  for (let i = sampleId.indexOf('#'); i > 0; i = sampleId.indexOf('#', i + 1)) {
    if (ids.has(sampleId.slice(0, i))) return true;
  }
  return false;
}

/**
 * Reads `<datasetDir>/eval-held-out-ids.json`; undefined when there is none (no split in the
 * run, or none resolved yet). A file that does not parse is an error naming it.
 */
export async function readHeldOutIds(datasetDir: string): Promise<HeldOutIds | undefined> {
  const file = join(datasetDir, HELD_OUT_IDS_FILE);
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e: unknown) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  const parsed = JSON.parse(text) as Partial<HeldOutIdsFile>;
  if (!Array.isArray(parsed.byId) || !Array.isArray(parsed.sameContent))
    throw new AppError(`${file}: not a list of held-out ids (byId, sameContent); delete it and run the producer again`);
  const ids = new Set<string>([...parsed.byId, ...parsed.sameContent.map((s) => s.id)]);
  return {
    byId: parsed.byId.length,
    sameContent: parsed.sameContent.length,
    has: (sampleId) => isSampleOf(ids, sampleId),
  };
}
