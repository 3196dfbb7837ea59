/**
 * A dataset's `source` (the file or folder a user downloaded, turned into its prompt file by
 * `tokenmill prepare`) and the config's `prepare` section.
 */
import { z } from 'zod';
import { filePath, positiveInt } from './schema-util.js';

const column = (what: string) =>
  z
    .string({ error: `expected a column name (${what})` })
    .min(1, { error: `expected a column name (${what}), not an empty string` });

const ROLES = ['system', 'user', 'assistant', 'tool'] as const;

/** Where the fields of a row are, for a source of a shape the formats do not name. */
export const SourceFieldsSchema = z
  .strictObject({
    id: column('the row id')
      .optional()
      .describe('Column of the row id. Omitted = `id` when the row has one, else a hash of the messages.'),
    messages: column('the list of turns')
      .optional()
      .describe('Column of the list of turns (`openai`: `messages`; `sharegpt`: `conversations`).'),
    role: column('the role of a turn')
      .optional()
      .describe("Key of a turn's role (`openai`: `role`; `sharegpt`: `from`)."),
    content: column('the text of a turn')
      .optional()
      .describe("Key of a turn's text (`openai`: `content`; `sharegpt`: `value`)."),
    system: column('the system prompt')
      .optional()
      .describe(
        'Column of a system prompt put before the turns. Omitted = `system` when the row has a non-empty one and its turns do not start with a system turn.',
      ),
    prompt: column('the prompt text').optional().describe('`prompt` format: column of the text (the same as `field`).'),
    instruction: column('the instruction')
      .optional()
      .describe('`alpaca` format: column of the instruction (default `instruction`).'),
    input: column('the input')
      .optional()
      .describe('`alpaca` format: column of the input appended to the instruction (default `input`).'),
  })
  .describe('Field mapping: where the id, turns and texts are in a row of another shape.');

/** A dataset's source file or folder. */
export const PromptSourceSchema = z
  .strictObject({
    path: filePath('a path to a .jsonl, .json or .parquet file, or a folder of them').describe(
      'A local `.jsonl`, `.json` or `.parquet` file, a file-name pattern (`data/train-*.parquet`), a folder of them read recursively in natural order (as `huggingface-cli download <repo> --repo-type dataset --local-dir <dir>` lays it out; of several splits, `train`), or a `datasets` `save_to_disk` folder (of a DatasetDict, `train`). Relative to the config file.',
    ),
    format: z
      .enum(['auto', 'openai', 'sharegpt', 'alpaca', 'prompt'], {
        error: 'expected one of: auto, openai, sharegpt, alpaca, prompt',
      })
      .default('auto')
      .describe(
        '`openai`: `messages` (else `conversations`) of `{role, content}`, content a string or text parts; `sharegpt`: `conversations` of `{from, value}` (`human`/`gpt`/`system`/`function_call`/`observation`…); `alpaca`: `instruction` + `input` as the user turn, `output` (or `response`); `prompt`: one text column named by `field`; `auto`: detected from the first rows (lists of turns, then `instruction`, then one of `prompt`/`question`/`problem`/`text`/`query`) and reported.',
      ),
    field: column('the text column').optional().describe('`prompt` format: the column holding the prompt text.'),
    fields: SourceFieldsSchema.optional(),
    roles: z
      .record(z.string(), z.enum(ROLES, { error: `expected one of: ${ROLES.join(', ')}` }), {
        error: 'expected a mapping of role names',
      })
      .optional()
      .describe(
        'Role names of the source mapped to chat roles, e.g. `{ai: assistant}`; added to the known ones (`human`, `gpt`, `model`, `developer`, `function_call`, `observation`, `function`, …).',
      ),
    maxPromptTokens: positiveInt()
      .optional()
      .describe(
        'Drop prompts longer than this many tokens (target tokenizer and chat template). Omitted = `prepare.maxPromptTokens`.',
      ),
    limit: positiveInt().optional().describe('Keep at most this many prompts (after filters and dedupe).'),
    shuffle: z
      .strictObject({
        seed: z
          .int({ error: 'expected an integer seed' })
          .describe('Seed of the shuffle: the same seed takes the same subset.'),
      })
      .optional()
      .describe('Shuffle the rows (reproducibly) before `limit` takes its subset.'),
  })
  .describe(
    "The file or folder `tokenmill prepare` turns into the dataset's prompt file (`prompts`, else `<output.dir>/<run>/<dataset>/prompts.jsonl`).",
  );

/** A dataset's source as configured. */
export type PromptSource = z.infer<typeof PromptSourceSchema>;

/** The `prepare` section. */
export const PrepareConfigSchema = z
  .strictObject({
    dedupeAcross: z
      .boolean({ error: 'expected true or false' })
      .default(false)
      .describe(
        'Drop a prompt already kept by an earlier dataset (config order) too, not only repeats within a dataset.',
      ),
    maxPromptTokens: positiveInt()
      .optional()
      .describe(
        "Drop prompts longer than this many tokens, counted with the target's tokenizer and chat template. Omitted = no limit.",
      ),
  })
  .prefault({})
  .describe("`tokenmill prepare`: from the datasets' `source` files to their prompt files.");
