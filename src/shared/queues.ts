import type { DefaultJobOptions } from 'bullmq';
import { z } from 'zod';
import { PayloadError } from './errors.js';

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
});
export type Sample = z.infer<typeof SampleSchema>;

export const GenerateBatchPayloadSchema = z.object({
  dataset: z.string().min(1),
  /** Deterministic id of the batch: the dataset, the producer epoch and the line range. */
  batchId: z.string().min(1),
  sampling: z.record(z.string(), z.unknown()),
  maxAttempts: z.number().int().positive(),
  /** Completion tokens to expect per request before the dataset has a running mean. */
  priorExpectedTokens: z.number().int().positive(),
  samples: z.array(SampleSchema).min(1),
});
export type GenerateBatchPayload = z.infer<typeof GenerateBatchPayloadSchema>;

export const GenerateBatchResultSchema = z.object({
  committed: z.number().int().nonnegative(),
  duplicates: z.number().int().nonnegative(),
  alreadyDone: z.number().int().nonnegative(),
  failed: z.number().int().nonnegative(),
  skippedByBudget: z.number().int().nonnegative(),
  outputTokens: z.number().int().nonnegative(),
});
export type GenerateBatchResult = z.infer<typeof GenerateBatchResultSchema>;

/** Generation jobs: per-sample retries happen inside the job, so the job itself retries rarely. */
export const generateJobOptions: DefaultJobOptions = {
  attempts: 5,
  backoff: { type: 'exponential', delay: 1_000 },
  removeOnComplete: { age: 24 * 3600, count: 2_000 },
  removeOnFail: { age: 7 * 24 * 3600 },
};

/** Parses a payload with its schema; a mismatch is a `PayloadError` (never retried). */
export function parsePayload<T>(schema: z.ZodType<T>, data: unknown, what: string): T {
  const r = schema.safeParse(data);
  if (!r.success) {
    const first = r.error.issues[0];
    const path = first === undefined ? '' : first.path.join('.');
    throw new PayloadError(`${what}: invalid payload at ${path === '' ? '(root)' : path}: ${first?.message ?? 'unknown'}`);
  }
  return r.data;
}
