/** The `datasets` section of the config: each dataset's prompts or conversations, budget and sampling. */
import { z } from 'zod';
import { filePath, name, positiveInt, nonNegativeInt } from './schema-util.js';
import { PromptSourceSchema } from './source.js';

/**
 * Default of `datasets[].budgetMarginSd`: standard deviations of the in-flight total that the
 * budget reservation holds back (acquire-request.lua ARGV[10]).
 */
export const DEFAULT_BUDGET_MARGIN_SD = 2;

/** What `datasets[].evalHoldout` takes. */
const EVAL_HOLDOUT_EXPECTED =
  'expected an integer >= 1 (that many prompts) or a fraction between 0 and 1, exclusive (that share of the prompts)';

/** SGLang sampling parameters; keys not listed here are passed through to SGLang unchanged. */
export const SamplingParamsSchema = z
  .strictObject({
    temperature: z
      .number({ error: 'expected a number >= 0' })
      .min(0, { error: 'expected a number >= 0' })
      .default(0.6)
      .describe('Sampling temperature (0 = greedy).'),
    top_p: z
      .number({ error: 'expected a number in (0, 1]' })
      .gt(0, { error: 'expected a number in (0, 1]' })
      .max(1, { error: 'expected a number in (0, 1]' })
      .default(0.95)
      .describe('Nucleus sampling: keep the smallest set of tokens whose probability mass reaches top_p.'),
    top_k: z
      .int({ error: 'expected an integer (-1 disables top-k)' })
      .optional()
      .describe('Keep only the k most likely tokens; -1 disables it. Omitted = SGLang default.'),
    min_p: z
      .number({ error: 'expected a number in [0, 1]' })
      .min(0, { error: 'expected a number in [0, 1]' })
      .max(1, { error: 'expected a number in [0, 1]' })
      .optional()
      .describe(
        'Drop tokens whose probability is below min_p times that of the most likely token. Omitted = SGLang default.',
      ),
    stop_token_ids: z
      .array(nonNegativeInt('a token id (an integer >= 0)'), { error: 'expected a list of token ids' })
      .optional()
      .describe("Extra token ids that end a generation, besides the model's end-of-sequence token."),
  })
  .catchall(z.unknown());

/** A sampling-parameter object as SGLang receives it. */
export type SamplingParams = z.infer<typeof SamplingParamsSchema>;

/** One dataset: prompts to generate from, or conversations to tokenize as they are. */
export const DatasetConfigSchema = z
  .strictObject({
    name: name().describe(
      'Dataset name, unique in the config: names its queue (`generate-<name>`), its output folder and its Redis keys. Letters, digits, `_`, `.`, `-`.',
    ),
    prompts: filePath('a path to a JSONL file of prompts')
      .optional()
      .describe(
        'JSONL file of prompts to generate from; one record a line: `{"id","messages":[…]}`, `{"id","conversations":[…]}` or `{"id","prompt"}`. Relative to the config file. With `source`: where `tokenmill prepare` writes it. One of `prompts` / `source` / `conversations`.',
      ),
    conversations: filePath('a path to a JSONL file of conversations')
      .optional()
      .describe(
        "JSONL file of conversations already in the target model's distribution: tokenized only, never sent to SGLang. Relative to the config file. Exactly one of `prompts` / `conversations`.",
      ),
    source: PromptSourceSchema.optional(),
    tokenBudget: positiveInt('a positive integer (output tokens)')
      .optional()
      .describe(
        'Output tokens to generate for this dataset; generation stops once it is reached. Required with `prompts` or `source`.',
      ),
    budget: z
      .enum(['reserve', 'strict'], { error: 'expected one of: reserve, strict' })
      .default('reserve')
      .describe(
        '`reserve`: no request starts once the tokens committed plus those expected of the requests in flight reach `tokenBudget`; what is in flight then finishes. `strict`: in addition, when the budget is met, requests still in flight are aborted (SGLang `/abort_request`) and their partial outputs kept, marked `abort`.',
      ),
    budgetMarginSd: z
      .number({ error: 'expected a number >= 0' })
      .min(0, { error: 'expected a number >= 0' })
      .default(DEFAULT_BUDGET_MARGIN_SD)
      .describe(
        "A request starts only while the tokens committed plus those expected of the requests in flight plus this many standard deviations of the latter stay below `tokenBudget`. Near the end of the dataset the last requests then start only while the budget is likely to hold them, and later ones, when less is uncertain, top it up: the total lands closer to the budget, at the cost of a few slots idle at the dataset's tail (other datasets fill them). With `budget: strict` too: fewer requests are in flight when the budget is met, so fewer partial outputs are aborted. 0: start while the expected total is below the budget. With nothing in flight and the budget not met, one request always starts.",
      ),
    maxNewTokens: positiveInt().default(10240).describe('Most output tokens per request (SGLang `max_new_tokens`).'),
    sampling: SamplingParamsSchema.prefault({}).describe(
      'SGLang sampling parameters for this dataset. Keys not listed here are passed through to SGLang as they are.',
    ),
    batchSize: positiveInt().default(64).describe('Prompts per queued job.'),
    samplesPerPrompt: positiveInt()
      .default(1)
      .describe(
        "Samples generated per prompt (or per conversation with `turns: all`), each with its own id (`<id>#s<j>`), counted against the budget and committed exactly once. 1: one sample, under the prompt's own id.",
      ),
    samplingVariants: z
      .array(z.record(z.string(), z.unknown()), { error: 'expected a list of sampling-parameter mappings' })
      .min(1, { error: 'expected at least one sampling-parameter mapping' })
      .optional()
      .describe(
        'With `samplesPerPrompt`: sampling settings cycled over the samples of a prompt (sample j gets entry (j − 1) mod length) over `sampling`, e.g. `[{temperature: 0}, {temperature: 0.3}, {temperature: 0.7}]`.',
      ),
    turns: z
      .enum(['last', 'all'], { error: 'expected one of: last, all' })
      .default('last')
      .describe(
        "`last`: one request per record, answering its last user turn (earlier assistant turns are sent as the source wrote them). `all`: a conversation of N turns becomes N requests in order; turn k's prompt is the chat template's rendering of the history with the source's system, user and tool messages and, in place of each earlier assistant message, the answer regenerated for it (the source's assistant content is never sent). See docs/multi-turn.md.",
      ),
    evalHoldout: z
      .number({ error: EVAL_HOLDOUT_EXPECTED })
      .superRefine((x, ctx) => {
        if (!(Number.isInteger(x) && x >= 1) && !(x > 0 && x < 1))
          ctx.addIssue({ code: 'custom', message: `${EVAL_HOLDOUT_EXPECTED}, got ${x}` });
      })
      .optional()
      .describe(
        'Prompts held out of generation for evaluating the trained drafter: an integer N (that many) or a fraction 0 < x < 1 (round(x × prompts), half up, at least 1). Chosen by SHA-256 of the dataset name and the prompt id (the smallest keys), never by position; a conversation (`turns: all`) or a prompt with all its samples is held out whole. Written before generation to `<output.dir>/<run>/<dataset>/eval-prompts.jsonl` (the lines verbatim) with an `eval-prompts.json` manifest, and fixed once written: a resumed run keeps it, `run --fresh` splits again. See docs/prepare.md.',
      ),
    minNewTokens: positiveInt()
      .default(16)
      .describe(
        "`turns: all`: the least `max_new_tokens` a later turn is sent with. Each turn's `max_new_tokens` is `maxNewTokens` shrunk to what the context leaves after its prompt; when that is below this floor, the conversation ends there with reason `context`, its turns kept.",
      ),
    toolExecutor: z
      .strictObject({
        url: z
          .url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL' })
          .describe('Where the calls are POSTed (see docs/agentic.md).'),
        timeoutMs: positiveInt().default(60_000).describe('Most milliseconds one request waits for its answer.'),
        attempts: positiveInt()
          .default(3)
          .describe('Requests per turn before the conversation ends (`tool-executor`).'),
      })
      .optional()
      .describe(
        "`turns: all` with tools: a service that runs the calls each regenerated turn makes; the conversation goes on with its results instead of the source's (fully on-policy agentic replay). Omitted: the source's results follow a turn only when it made the same calls. See docs/agentic.md.",
      ),
    chatTemplateKwargs: z
      .record(z.string(), z.unknown(), { error: 'expected a mapping of template variables' })
      .optional()
      .describe(
        'Variables passed to the chat template (e.g. `{enable_thinking: false}`), the same in prepare, generation, tokenize and export.',
      ),
  })
  .superRefine(
    (d, ctx) => {
      // Runs even when other keys of the dataset are invalid, so that every problem is reported
      // at once; the values may therefore have any type here.
      if (typeof d !== 'object' || d === null || Array.isArray(d)) return;
      const has = (v: unknown): boolean => v !== undefined && v !== null;
      const hasSource = has(d.source);
      // With a source, `prompts` is where `prepare` writes the prompt file.
      const hasPrompts = has(d.prompts) || hasSource;
      const hasConversations = has(d.conversations);
      if (hasConversations && hasSource) {
        ctx.addIssue({
          code: 'custom',
          message:
            'expected "source" or "conversations", got both (a source is prepared into prompts to generate from)',
        });
      } else if (hasPrompts && hasConversations) {
        ctx.addIssue({ code: 'custom', message: 'expected exactly one of "prompts" or "conversations", got both' });
      } else if (!hasPrompts && !hasConversations) {
        ctx.addIssue({
          code: 'custom',
          message: 'expected exactly one of "prompts", "source" or "conversations", got none',
        });
      }
      if (hasConversations && !hasPrompts && has(d.evalHoldout)) {
        ctx.addIssue({
          code: 'custom',
          path: ['evalHoldout'],
          message:
            'expected only with "prompts" or "source": a dataset of "conversations" is not generated, so nothing is held out of it',
        });
      }
      const variants: unknown = d.samplingVariants;
      const perPrompt: unknown = d.samplesPerPrompt ?? 1;
      if (Array.isArray(variants) && variants.length > 1 && perPrompt === 1) {
        // Only sample 1 would ever be made: every entry but the first would be silently ignored.
        ctx.addIssue({
          code: 'custom',
          path: ['samplingVariants'],
          message: `has ${variants.length} entries, but samplesPerPrompt is 1, so only the first would be used: set samplesPerPrompt (e.g. ${variants.length}), or keep one entry and put it in "sampling"`,
        });
      }
      if (hasPrompts && !hasConversations && d.tokenBudget === undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['tokenBudget'],
          message: `missing: expected a positive integer (output tokens), required when "${hasSource ? 'source' : 'prompts'}" is set`,
        });
      }
    },
    { when: () => true },
  );

/** One dataset entry of the config (paths resolved once loaded). */
export type DatasetConfig = z.infer<typeof DatasetConfigSchema>;

/** The `datasets` list: at least one, names unique. */
export const DatasetsConfigSchema = z
  .array(DatasetConfigSchema, { error: 'expected a list of datasets' })
  .min(1, { error: 'expected at least one dataset' })
  .superRefine(
    (list: unknown, ctx) => {
      if (!Array.isArray(list)) return;
      const seen = new Map<string, number>();
      list.forEach((d: unknown, i: number) => {
        const n = typeof d === 'object' && d !== null ? (d as { name?: unknown }).name : undefined;
        if (typeof n !== 'string') return;
        const first = seen.get(n);
        if (first === undefined) seen.set(n, i);
        else
          ctx.addIssue({
            code: 'custom',
            path: [i, 'name'],
            message: `expected a unique dataset name, got "${n}" again (first used by datasets[${first}])`,
          });
      });
    },
    { when: () => true },
  )
  .describe('Datasets to process, each with its own queue, budget and output folder.');
