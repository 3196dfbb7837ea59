/** The `eval` section of the config: how `tokenmill eval` measures a trained drafter. */
import { z } from 'zod';
import { filePath, positiveInt } from './schema-util.js';

const endpointList = (what: string) =>
  z
    .array(z.url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL' }), {
      error: `expected a list of ${what} URLs`,
    })
    .min(1, { error: `expected at least one ${what} URL` });

/** Sampling settings sent with every evaluation request (besides `max_new_tokens`). */
const EvalSamplingSchema = z.union(
  [
    z.literal('dataset'),
    z
      .looseObject({
        temperature: z
          .number({ error: 'expected a number >= 0' })
          .min(0, { error: 'expected a number >= 0' })
          .optional(),
      })
      .describe('SGLang sampling parameters, passed as they are.'),
  ],
  { error: 'expected "dataset" or a mapping of SGLang sampling parameters' },
);

/** Settings of `tokenmill eval`. */
export const EvalConfigSchema = z
  .strictObject({
    endpoints: endpointList('SGLang server').describe(
      'Base URLs of SGLang servers serving the target with the drafter under test (`--speculative-algorithm EAGLE3 --speculative-draft-model-path <drafter>`). Each must report speculative decoding in `/server_info`, with the drafter `tokenmill eval` evaluates.',
    ),
    baseline: endpointList('SGLang server')
      .optional()
      .describe(
        'Base URLs of SGLang servers serving the same target without speculative decoding: the speed the drafter is compared with. Omitted = no speed-up is measured (acceptance only).',
      ),
    prompts: filePath('a path to a JSONL file of prompts')
      .optional()
      .describe(
        "Prompt file (the format of `datasets[].prompts`) to evaluate on instead of each dataset's held-out prompts (`<output.dir>/<run>/<dataset>/eval-prompts.jsonl`). Relative to the config file.",
      ),
    maxPromptsPerDataset: positiveInt()
      .default(200)
      .describe('Most prompts sent per dataset (the first ones of its file).'),
    concurrency: positiveInt()
      .default(16)
      .describe(
        'Requests in flight per phase (drafter, then baseline), over all of its endpoints. Tokens/s are measured at this load.',
      ),
    maxNewTokens: positiveInt().default(512).describe('Most output tokens per request (SGLang `max_new_tokens`).'),
    sampling: EvalSamplingSchema.default({ temperature: 0 }).describe(
      "Sampling parameters of every request (besides `max_new_tokens`); `dataset` = each dataset's own `datasets[].sampling`.",
    ),
    minAcceptLength: z
      .number({ error: 'expected a number >= 1' })
      .min(1, { error: 'expected a number >= 1' })
      .optional()
      .describe('`tokenmill eval` fails (exit code 3) when the overall acceptance length is below this.'),
    minSpeedup: z
      .number({ error: 'expected a number > 0' })
      .positive({ error: 'expected a number > 0' })
      .optional()
      .describe(
        '`tokenmill eval` fails (exit code 3) when the overall speed-up (drafter tokens/s over baseline tokens/s) is below this. Needs `baseline`.',
      ),
    maxAcceptDrop: z
      .number({ error: 'expected a number in [0, 1]' })
      .min(0, { error: 'expected a number in [0, 1]' })
      .max(1, { error: 'expected a number in [0, 1]' })
      .default(0.1)
      .describe(
        "A warning when a dataset's (or the overall) acceptance length fell by more than this share of the previous attempt's.",
      ),
    requestTimeoutMs: positiveInt()
      .default(600_000)
      .describe(
        'Deadline of one evaluation request (ms); a request past it is aborted and counted as failed. Connection errors are retried with backoff, then name the endpoint.',
      ),
  })
  .superRefine(
    (e, ctx) => {
      if (typeof e !== 'object' || e === null || Array.isArray(e)) return;
      if (e.minSpeedup !== undefined && e.baseline === undefined)
        ctx.addIssue({
          code: 'custom',
          path: ['minSpeedup'],
          message: 'needs "baseline": the speed-up is measured against baseline endpoints',
        });
      if (e.sampling === 'dataset' && e.prompts !== undefined)
        ctx.addIssue({
          code: 'custom',
          path: ['sampling'],
          message:
            'expected sampling parameters with "prompts": "dataset" takes each dataset\'s sampling, and eval.prompts belongs to no dataset',
        });
    },
    { when: () => true },
  );

/** The `eval` section, defaults applied. */
export type EvalConfig = z.infer<typeof EvalConfigSchema>;
