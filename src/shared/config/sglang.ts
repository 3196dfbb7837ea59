/** The `sglang` section of the config: the servers and how requests are sent to them. */
import { z } from 'zod';
import { positiveInt } from './schema-util.js';

/** Bounds and pace of `sglang.concurrency: "auto"`. */
export const AutoConcurrencySchema = z
  .strictObject({
    min: positiveInt().default(8).describe('Lowest requests in flight per endpoint that `"auto"` goes down to.'),
    max: positiveInt().default(1024).describe('Highest requests in flight per endpoint that `"auto"` goes up to.'),
    start: positiveInt()
      .default(32)
      .describe(
        'Requests in flight per endpoint that `"auto"` starts from on an endpoint it has not measured yet (later runs start from the last value chosen).',
      ),
    intervalMs: positiveInt()
      .default(10_000)
      .describe(
        'How long `"auto"` measures the server (running and queued requests, output tokens/s from `/metrics`) before each step (ms).',
      ),
    maxQueued: positiveInt()
      .default(8)
      .describe(
        'Requests waiting in the server\'s own queue (`sglang:num_queue_reqs`) above which `"auto"` steps back (at least 10% of the running requests are allowed).',
      ),
  })
  .superRefine((a, ctx) => {
    if (a.min > a.max)
      ctx.addIssue({ code: 'custom', path: ['min'], message: `expected min <= max (${a.max}), got ${a.min}` });
    else if (a.start < a.min || a.start > a.max)
      ctx.addIssue({
        code: 'custom',
        path: ['start'],
        message: `expected start within [min, max] = [${a.min}, ${a.max}], got ${a.start}`,
      });
  })
  .describe('Bounds and pace of `sglang.concurrency: "auto"`; ignored for a fixed concurrency.');

/** Bounds and pace of `sglang.concurrency: "auto"`, defaults applied. */
export type AutoConcurrency = z.infer<typeof AutoConcurrencySchema>;

/** `sglang.concurrency`: a fixed number of requests in flight per endpoint, or `"auto"`. */
export type ConcurrencySetting = number | 'auto';

/**
 * The most requests in flight per endpoint the setting can reach: the number itself, or
 * `autoConcurrency.max` for `"auto"` (what client connection pools and the producer's window
 * are sized for).
 */
export function concurrencyCeiling(sglang: {
  concurrency: ConcurrencySetting;
  autoConcurrency?: AutoConcurrency | undefined;
}): number {
  return sglang.concurrency === 'auto' ? autoConcurrencyOf(sglang).max : sglang.concurrency;
}

/** `sglang.autoConcurrency` with its defaults (the section is optional in the parsed config). */
export function autoConcurrencyOf(sglang: { autoConcurrency?: AutoConcurrency | undefined }): AutoConcurrency {
  return sglang.autoConcurrency ?? AutoConcurrencySchema.parse({});
}

/** SGLang servers and how requests are sent to them. */
export const SglangConfigSchema = z
  .strictObject({
    endpoints: z
      .array(z.url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL' }), {
        error: 'expected a list of SGLang server URLs',
      })
      .min(1, { error: 'expected at least one SGLang endpoint' })
      .default(['http://127.0.0.1:30000'])
      .describe('Base URLs of the SGLang servers serving the target model.'),
    concurrency: z
      .union([positiveInt(), z.literal('auto')], { error: 'expected a positive integer' })
      .default(150)
      .describe(
        'Requests in flight per endpoint, summed over all inference workers; `"auto"`: found by itself per endpoint (raised while the server\'s throughput rises and its queue stays short, lowered when it queues or answers 503), within `sglang.autoConcurrency`.',
      ),
    autoConcurrency: AutoConcurrencySchema.optional(),
    api: z
      .enum(['generate', 'chat'])
      .default('generate')
      .describe('`generate`: POST /generate with token ids in and out; `chat`: POST /v1/chat/completions.'),
    requestTimeoutMs: positiveInt().default(900_000).describe('Deadline of one SGLang request (ms).'),
    healthCheckIntervalMs: positiveInt()
      .default(2000)
      .describe("How often each endpoint's health is checked (ms); requests wait while it is unhealthy."),
    maxAttempts: positiveInt()
      .default(3)
      .describe('Attempts per prompt against a healthy server before it is marked failed; outages do not count.'),
    apiKey: z
      .string({ error: 'expected an API key (a string)' })
      .min(1, { error: 'expected an API key, not an empty string' })
      .regex(/^[^\r\n]*$/, { error: 'expected an API key without line breaks' })
      .optional()
      .describe(
        'API key of the SGLang servers (`--api-key`), sent as `Authorization: Bearer <key>` on every request; never logged or printed. Omitted = the `SGLANG_API_KEY` environment variable, else none.',
      ),
    contextLength: positiveInt()
      .optional()
      .describe(
        'Context length of the target model (tokens). Longer prompts are rejected and `max_new_tokens` is capped to fit. Omitted = asked from the server (`/server_info`).',
      ),
  })
  .prefault({})
  .describe('SGLang servers and how requests are sent to them.');
