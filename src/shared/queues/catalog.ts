import type { DefaultJobOptions } from 'bullmq';
import { z } from 'zod';
import { PayloadError } from '../errors.js';

/**
 * The queue catalog: every queue name, payload and result schema, and default job options,
 * declared once. Producers parse before `add`; processors parse `job.data` first thing.
 */

/** Queue of generation batches for one dataset; Bull Board shows one per dataset. */
export function generateQueueName(dataset: string): string {
  return `generate-${dataset}`;
}

export const SampleSchema = z.object({
  /** Stable sample id within the dataset (record id, or a content hash). */
  id: z.string().min(1),
  /** 1-based line of the prompt in its JSONL file. */
  line: z.number().int().positive(),
  /** The rendered prompt, tokenized (api: generate). */
  promptIds: z.array(z.number().int().nonnegative()),
  /** max_new_tokens for this sample (the dataset's, capped by the context left). */
  maxNewTokens: z.number().int().positive(),
  /** `turns: all`: the whole source conversation (its prompt ids are turn 1's). */
  messages: z.array(z.unknown()).optional(),
  /** `samplingVariants`: this sample's sampling settings over the batch's. */
  sampling: z.record(z.string(), z.unknown()).optional(),
  /** The record's tool schemas, passed to the chat template in every rendering of its turns. */
  tools: z.array(z.unknown()).optional(),
});
export type Sample = z.infer<typeof SampleSchema>;

/** A sample as a batch job carries it: what a person reads first in Bull Board. */
export const BatchSampleSchema = z.object({
  id: z.string().min(1),
  line: z.number().int().positive(),
  maxNewTokens: z.number().int().positive(),
  /** `samplingVariants`: this sample's sampling settings over the batch's. */
  sampling: z.record(z.string(), z.unknown()).optional(),
  /** Only in jobs queued by an older version; newer jobs carry the ids in `prompts`. */
  promptIds: z.array(z.number().int().nonnegative()).optional(),
});
export type BatchSample = z.infer<typeof BatchSampleSchema>;

const PROMPT_IDS_BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

export const GenerateBatchPayloadSchema = z
  .object({
    dataset: z.string().min(1),
    /** Deterministic id of the batch: the dataset, the producer epoch and the line range. */
    batchId: z.string().min(1),
    /** The prompt lines of the batch, for people (`1201–1300`). */
    lines: z.string().optional(),
    samples: z.array(BatchSampleSchema).min(1),
    sampling: z.record(z.string(), z.unknown()),
    maxAttempts: z.number().int().positive(),
    /** Completion tokens to expect per request before the dataset has a running mean. */
    priorExpectedTokens: z.number().int().positive(),
    /**
     * Set when the job ended failed: its samples are then the prompts that failed in it, and a
     * delivery (after Bull Board's Retry or `tokenmill retry-failed`) claims their failure
     * records and sends them again with fresh attempts (claim-failed-3.lua).
     */
    retryOfFailed: z.boolean().optional(),
    /**
     * The producer's tokenizer's vocabulary size: a worker refuses an answer with an output id
     * at or above it (an attempt, like any unusable answer), so no such record is committed.
     */
    vocabSize: z.number().int().positive().optional(),
    /**
     * Each sample's prompt token ids, in the order of `samples`: base64 of little-endian
     * uint32s, last and compact, so the ids and lines come first when a person opens the job.
     */
    prompts: z.array(z.string().regex(PROMPT_IDS_BASE64, 'expected base64 token ids')).optional(),
    /**
     * `turns: all`: each sample is a conversation regenerated turn by turn; `conversations[i]`
     * is sample i's whole source conversation and its prompt ids are turn 1's.
     */
    turns: z.literal('all').optional(),
    conversations: z.array(z.array(z.unknown())).optional(),
    /** The dataset's `chatTemplateKwargs`, for rendering turns after the first. */
    templateKwargs: z.record(z.string(), z.unknown()).optional(),
    /**
     * Each sample's tool schemas, in the order of `samples` (null: a sample without tools); only
     * present when some sample has tools. Turns after the first are rendered with them.
     */
    tools: z.array(z.array(z.unknown()).nullable()).optional(),
    /** The context length the producer checked turn 1 against; later turns are checked against it too. */
    contextLength: z.number().int().positive().optional(),
    /** The least `max_new_tokens` a later turn is sent with; below it the conversation ends (`context`). */
    minNewTokens: z.number().int().positive().optional(),
    /** How the model writes tool calls (`tokenizer.toolCallFormat`, resolved): later turns' calls are read in it. */
    toolCallFormat: z.enum(['hermes', 'llama3', 'deepseekv3', 'kimi_k2']).optional(),
    /** The dataset's tool executor: the calls of a turn are run there instead of matched to the source's results. */
    toolExecutor: z
      .object({ url: z.string().min(1), timeoutMs: z.number().int().positive(), attempts: z.number().int().positive() })
      .optional(),
  })
  .superRefine((p, ctx) => {
    if (p.turns === 'all' && p.conversations?.length !== p.samples.length)
      ctx.addIssue({
        code: 'custom',
        path: ['conversations'],
        message: `expected ${p.samples.length} conversations (one per sample) with turns: all`,
      });
    if (p.tools !== undefined && p.tools.length !== p.samples.length)
      ctx.addIssue({
        code: 'custom',
        path: ['tools'],
        message: `expected ${p.samples.length} tool lists (one per sample, null for none), got ${p.tools.length}`,
      });
    if (p.prompts !== undefined) {
      if (p.prompts.length !== p.samples.length)
        ctx.addIssue({
          code: 'custom',
          path: ['prompts'],
          message: `expected ${p.samples.length} prompts (one per sample), got ${p.prompts.length}`,
        });
      return;
    }
    const i = p.samples.findIndex((s) => s.promptIds === undefined);
    if (i >= 0)
      ctx.addIssue({
        code: 'custom',
        path: ['samples', i, 'promptIds'],
        message: "no prompt token ids (neither `prompts` nor the sample's `promptIds`)",
      });
  });
export type GenerateBatchPayload = z.infer<typeof GenerateBatchPayloadSchema>;

/** Token ids as base64 of little-endian uint32s (the compact form of {@link GenerateBatchPayload.prompts}). */
export function encodePromptIds(ids: readonly number[]): string {
  const buf = Buffer.allocUnsafe(ids.length * 4);
  ids.forEach((id, i) => buf.writeUInt32LE(id, i * 4));
  return buf.toString('base64');
}

/** The inverse of {@link encodePromptIds}; a length that is not a whole number of ids is a `PayloadError`. */
export function decodePromptIds(encoded: string): number[] {
  const buf = Buffer.from(encoded, 'base64');
  if (buf.length % 4 !== 0)
    throw new PayloadError(`prompt token ids: ${buf.length} bytes is not a whole number of uint32 ids`);
  const ids = new Array<number>(buf.length / 4);
  for (let i = 0; i < ids.length; i += 1) ids[i] = buf.readUInt32LE(i * 4);
  return ids;
}

/** The line range of samples, for people: `1201–1300`, or `1205` for one. */
export function lineRange(samples: readonly { line: number }[]): string {
  const first = samples[0]?.line;
  const last = samples[samples.length - 1]?.line;
  if (first === undefined || last === undefined) return '';
  return first === last ? `${first}` : `${first}–${last}`;
}

/** A batch job's name, as Bull Board lists it: `B3 lines 1201–1300` (or `B3 line 1205`). */
export function batchJobName(dataset: string, samples: readonly { line: number }[]): string {
  return `${dataset} ${samples.length === 1 ? 'line' : 'lines'} ${lineRange(samples)}`;
}

/** What a batch job carries besides its samples. */
export type BatchSettings = Pick<
  GenerateBatchPayload,
  'dataset' | 'batchId' | 'sampling' | 'maxAttempts' | 'priorExpectedTokens'
> & {
  retryOfFailed?: boolean;
  vocabSize?: number | undefined;
  /** `turns: all` datasets: the template variables and context length turns after the first are rendered and checked with. */
  templateKwargs?: Record<string, unknown> | undefined;
  contextLength?: number | undefined;
  minNewTokens?: number | undefined;
  toolCallFormat?: GenerateBatchPayload['toolCallFormat'];
  toolExecutor?: GenerateBatchPayload['toolExecutor'];
};

/** Builds (and checks) a batch job's payload: readable sample ids and lines first, the token ids last and compact. */
export function encodeBatchPayload(settings: BatchSettings, samples: readonly Sample[]): GenerateBatchPayload {
  return parsePayload(
    GenerateBatchPayloadSchema,
    {
      dataset: settings.dataset,
      batchId: settings.batchId,
      lines: lineRange(samples),
      samples: samples.map((s) => ({
        id: s.id,
        line: s.line,
        maxNewTokens: s.maxNewTokens,
        ...(s.sampling === undefined ? {} : { sampling: s.sampling }),
      })),
      sampling: settings.sampling,
      maxAttempts: settings.maxAttempts,
      priorExpectedTokens: settings.priorExpectedTokens,
      ...(settings.retryOfFailed === true ? { retryOfFailed: true } : {}),
      ...(settings.vocabSize === undefined ? {} : { vocabSize: settings.vocabSize }),
      ...conversationFields(settings, samples),
      ...(samples.some((s) => s.tools !== undefined) ? { tools: samples.map((s) => s.tools ?? null) } : {}),
      prompts: samples.map((s) => encodePromptIds(s.promptIds)),
    },
    'generate batch',
  );
}

function conversationFields(settings: BatchSettings, samples: readonly Sample[]): Partial<GenerateBatchPayload> {
  if (!samples.some((s) => s.messages !== undefined)) return {};
  return {
    turns: 'all',
    conversations: samples.map((s) => s.messages ?? []),
    ...(settings.templateKwargs === undefined ? {} : { templateKwargs: settings.templateKwargs }),
    ...(settings.contextLength === undefined ? {} : { contextLength: settings.contextLength }),
    ...(settings.minNewTokens === undefined ? {} : { minNewTokens: settings.minNewTokens }),
    ...(settings.toolCallFormat === undefined ? {} : { toolCallFormat: settings.toolCallFormat }),
    ...(settings.toolExecutor === undefined ? {} : { toolExecutor: settings.toolExecutor }),
  };
}

/** The samples of a parsed batch payload, with their token ids (and conversations, with `turns: all`, and tool schemas). */
export function batchSamples(payload: GenerateBatchPayload): Sample[] {
  return payload.samples.map((s, i) => {
    const encoded = payload.prompts?.[i];
    const promptIds = encoded === undefined ? (s.promptIds ?? []) : decodePromptIds(encoded);
    const messages = payload.conversations?.[i];
    const tools = payload.tools?.[i] ?? undefined;
    return {
      id: s.id,
      line: s.line,
      promptIds,
      maxNewTokens: s.maxNewTokens,
      ...(messages === undefined ? {} : { messages }),
      ...(s.sampling === undefined ? {} : { sampling: s.sampling }),
      ...(tools === undefined ? {} : { tools }),
    };
  });
}

/** A batch job's progress (`job.progress`): how many of its `size` samples ended which way. */
export interface BatchProgress {
  /** Committed by this job, or found committed already. */
  committed: number;
  failed: number;
  /** Skipped by the budget (or, in a retried job, not sent again: committed or retried elsewhere). */
  skipped: number;
  size: number;
}

export const GenerateBatchResultSchema = z.object({
  committed: z.number().int().nonnegative(),
  duplicates: z.number().int().nonnegative(),
  alreadyDone: z.number().int().nonnegative(),
  failed: z.number().int().nonnegative(),
  skippedByBudget: z.number().int().nonnegative(),
  outputTokens: z.number().int().nonnegative(),
});
export type GenerateBatchResult = z.infer<typeof GenerateBatchResultSchema>;

/**
 * Generation jobs: per-sample retries happen inside the job, so the job itself retries rarely.
 * Completed jobs carry their prompts' token ids, so only the last 20 are kept (for Bull
 * Board): Redis must not grow with the dataset. A failed job carries only the prompts that
 * failed in it and is how they are retried (Bull Board's Retry, `retry-failed`): it stays
 * until retried. Its log has a line per failed or retried prompt (the last 1,000 kept).
 */
export const generateJobOptions: DefaultJobOptions = {
  attempts: 5,
  backoff: { type: 'exponential', delay: 1_000 },
  removeOnComplete: { age: 3600, count: 20 },
  removeOnFail: false,
  keepLogs: 1_000,
};

/** Parses a payload with its schema; a mismatch is a `PayloadError` (never retried). */
export function parsePayload<T>(schema: z.ZodType<T>, data: unknown, what: string): T {
  const r = schema.safeParse(data);
  if (!r.success) {
    const first = r.error.issues[0];
    const path = first === undefined ? '' : first.path.join('.');
    throw new PayloadError(
      `${what}: invalid payload at ${path === '' ? '(root)' : path}: ${first?.message ?? 'unknown'}`,
    );
  }
  return r.data;
}

// ---------------------------------------------------------------------------------------------
// Post-processing: one flow per round, `merge` parent over one `tokenize` child per dataset.

/** Queue of tokenize jobs: one per dataset and post-process round, children of a merge job. */
export const TOKENIZE_QUEUE = 'tokenize';
/** Queue of merge jobs: one per post-process round, the parent of its tokenize jobs. */
export const MERGE_QUEUE = 'merge';

/** What a tokenize job reads: a run's generation records, or a conversation dataset. */
export const TokenizeSourceKindSchema = z.enum(['generations', 'conversations']);
export type TokenizeSourceKind = z.infer<typeof TokenizeSourceKindSchema>;

/** Payload of a tokenize job: one dataset of a post-process round. */
export const TokenizePayloadSchema = z.object({
  /** The post-process round's flow id (`<run>-pp-<n>`). */
  flowId: z.string().min(1),
  dataset: z.string().min(1),
  kind: TokenizeSourceKindSchema,
  /** `<runDir>/<dataset>/generations` (a folder of `*.jsonl`), or the conversation JSONL file. */
  source: z.string().min(1),
  /** Where the staged `datasets` folder of the new rows is written (replaced by each attempt). */
  stagedDir: z.string().min(1),
  /** The training dataset: rows of this dataset already in it are not staged again. */
  target: z.string().min(1),
  shardSizeMiB: z.number().positive(),
  /**
   * Invalid lines tolerated, as a fraction of the lines read; more fails the job. 0 for
   * generation records (written by tokenmill: an invalid one means a damaged file or another
   * tokenizer than generation used).
   */
  maxInvalidFraction: z.number().min(0).max(1),
  /** The dataset's `chatTemplateKwargs`: conversations are rendered with them. */
  templateKwargs: z.record(z.string(), z.unknown()).optional(),
  /** `postprocess.rows` for a dataset regenerated turn by turn: `conversation` makes one row per conversation where its history was spliced. */
  rows: z.enum(['per-turn', 'conversation']).optional(),
});
export type TokenizePayload = z.infer<typeof TokenizePayloadSchema>;

const count = z.number().int().nonnegative();

/** A line that could not be used, with its 1-based number and why. */
export const InvalidLineSchema = z.object({ file: z.string(), line: z.number().int().positive(), reason: z.string() });

/** What a tokenize job returns (its parent merge job reads it): counters of its dataset. */
export const TokenizeResultSchema = z.object({
  dataset: z.string().min(1),
  kind: TokenizeSourceKindSchema,
  stagedDir: z.string().min(1),
  /** Non-blank lines read. */
  lines: count,
  /** Rows staged: new rows for the training dataset. */
  rows: count,
  tokens: count,
  supervisedTokens: count,
  /** Rows already in the training dataset (merged by an earlier round): not staged. */
  alreadyMerged: count,
  /** Of `rows`: truncated generations kept because of `postprocess.keepTruncated`. */
  keptTruncated: count,
  /** Of `rows`: generations stopped on something else than the template's end-of-turn token. */
  stopWithoutEndOfTurn: count,
  droppedTruncated: count,
  droppedAborted: count,
  droppedEmpty: count,
  /** Conversations without any supervised token. */
  droppedUnsupervised: count,
  /** Lines whose sample id was seen before in the same source (the first one wins). */
  duplicates: count,
  invalid: count,
  invalidExamples: z.array(InvalidLineSchema),
  durationMs: count,
});
export type TokenizeResult = z.infer<typeof TokenizeResultSchema>;

/** Payload of a merge job: the parent of a post-process round's tokenize jobs. */
export const MergePayloadSchema = z.object({
  flowId: z.string().min(1),
  /** The training dataset folder. */
  target: z.string().min(1),
  /** The run folder: the merge report is written there. */
  runDir: z.string().min(1),
  shardSizeMiB: z.number().positive(),
  /**
   * Names the round's rows in the target's merge history, so a retried merge job never appends
   * them twice: `<flowId>/<nonce>`, the nonce drawn when the round was created.
   */
  mergeKey: z.string().min(1),
  /** `postprocess.verifyWithPython`: the interpreter that loads the merged dataset before the swap. */
  verifyWithPython: z.object({ python: z.string().min(1) }).optional(),
  /**
   * `postprocess.dflash.maskToken`: checked against the tokenizer by the merge, which refuses new
   * rows that hold it.
   */
  dflashMaskToken: z.string().min(1).optional(),
});
export type MergePayload = z.infer<typeof MergePayloadSchema>;

/** The validation report of a merge, in brief (the whole report is the file at `reportPath`). */
export const MergeReportSummarySchema = z.object({
  mergeId: z.string(),
  target: z.string(),
  reportPath: z.string(),
  firstMerge: z.boolean(),
  oldRows: count,
  newRows: count,
  rows: count,
  oldTokens: count,
  newTokens: count,
  tokens: count,
  supervisedTokens: count,
  lossMaskCoverage: z.number(),
  newLossMaskCoverage: z.number(),
  shards: count,
  newShards: count,
  /**
   * For DFlash trainers: rows with fewer than 2 adjacent supervised tokens (no anchor position),
   * in the merged dataset and among the new rows, and the merged dataset's rows by their anchor
   * positions (buckets `0`, `1`, `2-15`, …, `1024+`). Absent from results of earlier versions.
   */
  dflash: z
    .object({
      rowsWithoutAnchor: count,
      newRowsWithoutAnchor: count,
      anchorPositions: z.record(z.string(), count),
      maskToken: z.object({ token: z.string(), id: count }).nullable(),
    })
    .optional(),
  checkedSamples: count,
  problems: z.array(z.string()),
  warnings: z.array(z.string()),
});
export type MergeReportSummary = z.infer<typeof MergeReportSummarySchema>;

/** What a merge job returns: how its round ended, per dataset counters, the report in brief. */
export const MergeJobResultSchema = z.object({
  flowId: z.string(),
  /**
   * `merged`: the round's rows were merged; `already-merged`: a previous attempt of this job
   * merged them; `nothing-new`: no dataset had rows that the training dataset lacks.
   */
  status: z.enum(['merged', 'already-merged', 'nothing-new']),
  datasets: z.array(TokenizeResultSchema),
  report: MergeReportSummarySchema.nullable(),
});
export type MergeJobResult = z.infer<typeof MergeJobResultSchema>;

/** Tokenize jobs: a retry starts the dataset over (its staged folder is replaced). */
export const tokenizeJobOptions: DefaultJobOptions = {
  attempts: 3,
  backoff: { type: 'exponential', delay: 2_000 },
  removeOnComplete: { age: 7 * 24 * 3600, count: 1_000 },
  removeOnFail: { age: 30 * 24 * 3600, count: 1_000 },
};

/** Merge jobs: kept after they finish (one per round), their result is the round's report. */
export const mergeJobOptions: DefaultJobOptions = {
  attempts: 3,
  backoff: { type: 'exponential', delay: 2_000 },
  removeOnComplete: { count: 200 },
  removeOnFail: { count: 200 },
};

// ---------------------------------------------------------------------------------------------
// Training: one `train` job per training run, the parent of a post-process round's merge job
// (or queued alone by `tokenmill train`). Payload and result schemas: train-queue.ts.

/** Queue of train jobs, served by train workers (`worker --role train`). */
export const TRAIN_QUEUE = 'train';
