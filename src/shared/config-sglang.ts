/** The `sglang` section of the config: the servers and how requests are sent to them. */
import { z } from 'zod';
import { positiveInt } from './config-schema-util.js';

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
    concurrency: positiveInt()
      .default(150)
      .describe('Requests in flight per endpoint, summed over all inference workers.'),
    api: z
      .enum(['generate', 'chat'])
      .default('generate')
      .describe('`generate`: POST /generate with token ids in and out; `chat`: POST /v1/chat/completions.'),
    requestTimeoutMs: positiveInt().default(900_000).describe('Deadline of one SGLang request (ms).'),
    healthCheckIntervalMs: positiveInt()
      .default(2000)
      .describe('How often each endpoint\'s health is checked (ms); requests wait while it is unhealthy.'),
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
