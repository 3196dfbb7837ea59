/** The `eval` section of the config: how `tokenmill eval` measures a trained drafter. */
import { z } from 'zod';
import { filePath, nonNegativeInt, positiveInt } from './schema-util.js';

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

const serverCommand = () =>
  z
    .array(z.string({ error: 'expected a string' }), {
      error: 'expected a list of strings (a command and its arguments)',
    })
    .min(1, { error: 'expected a command and its arguments' });

const port = () =>
  z
    .int({ error: 'expected a TCP port (1-65535)' })
    .min(1, { error: 'expected a TCP port (1-65535)' })
    .max(65535, { error: 'expected a TCP port (1-65535)' });

/** `eval.server`: the SGLang servers the eval step starts itself, for the attempt it evaluates. */
export const EvalServerSchema = z
  .strictObject({
    command: serverCommand().describe(
      "Command that serves the target with the drafter (e.g. `python -m sglang.launch_server --model-path /models/Qwen3-8B --speculative-algorithm EAGLE3 --speculative-draft-model-path {checkpoint} --port {port}`), run without a shell, in its own process group, from the config file's folder. Placeholders: `{checkpoint}` (the drafter evaluated: the attempt's final output), `{output:<step>}` (that step's output folder in the attempt), `{port}` (`port`), `{gpus}` (the number of GPUs assigned; `CUDA_VISIBLE_DEVICES` names them).",
    ),
    baselineCommand: serverCommand()
      .optional()
      .describe(
        'Command that serves the target alone (the baseline), with the same placeholders (`{port}` is `baselinePort`). Omitted = no baseline server, no speed-up measured.',
      ),
    port: port().default(30000).describe('Port of the drafter server, on 127.0.0.1 (`{port}` of `command`).'),
    baselinePort: port()
      .default(30001)
      .describe('Port of the baseline server, on 127.0.0.1 (`{port}` of `baselineCommand`).'),
    gpus: nonNegativeInt()
      .default(1)
      .describe(
        'GPUs each server needs (with `baselineCommand`, twice as many in all: the two servers never share a GPU); 0 runs them without one.',
      ),
    minFreeGpuMemMiB: nonNegativeInt()
      .default(0)
      .describe(
        'Free memory (MiB) each assigned GPU must have before the servers start; with less, the eval job waits, as train jobs do (`train.preflightPollMs`).',
      ),
    healthTimeoutMs: positiveInt()
      .default(600_000)
      .describe(
        'How long a server may take to answer `GET /health_generate` with 200 (loading the model included, ms); past it, or when the server exits first, the eval fails with the end of its log.',
      ),
    stopGraceMs: positiveInt()
      .default(10_000)
      .describe("After the eval, SIGTERM goes to each server's process group, then SIGKILL after this long (ms)."),
  })
  .describe('SGLang servers the eval step starts on the train worker for each attempt, and stops afterwards.');

/** `eval.server`, defaults applied. */
export type EvalServerConfig = z.infer<typeof EvalServerSchema>;

/** Settings of `tokenmill eval`. */
export const EvalConfigSchema = z
  .strictObject({
    endpoints: endpointList('SGLang server')
      .optional()
      .describe(
        'Base URLs of SGLang servers serving the target with the drafter under test (`--speculative-algorithm EAGLE3 --speculative-draft-model-path <drafter>`). Each must report speculative decoding in `/server_info`, with the drafter `tokenmill eval` evaluates. Exactly one of `endpoints` / `server`.',
      ),
    baseline: endpointList('SGLang server')
      .optional()
      .describe(
        'Base URLs of SGLang servers serving the same target without speculative decoding: the speed the drafter is compared with. Omitted = no speed-up is measured (acceptance only). Not with `server` (whose `baselineCommand` starts one).',
      ),
    server: EvalServerSchema.optional(),
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
      const has = (v: unknown): boolean => v !== undefined;
      if (has(e.endpoints) === has(e.server))
        ctx.addIssue({
          code: 'custom',
          message: `expected exactly one of "endpoints" (servers you started) or "server" (servers the eval step starts), got ${has(e.endpoints) ? 'both' : 'neither'}`,
        });
      if (has(e.server) && has(e.baseline))
        ctx.addIssue({
          code: 'custom',
          path: ['baseline'],
          message: 'expected no "baseline" with "server": server.baselineCommand starts the baseline',
        });
      const baselined =
        has(e.baseline) || (typeof e.server === 'object' && e.server !== null && has(e.server.baselineCommand));
      if (e.minSpeedup !== undefined && !baselined)
        ctx.addIssue({
          code: 'custom',
          path: ['minSpeedup'],
          message: 'needs "baseline" (or server.baselineCommand): the speed-up is measured against baseline endpoints',
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
