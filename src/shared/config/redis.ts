/**
 * The `redis` section of the config: one server (`url`), a Sentinel-managed primary
 * (`sentinels` + `name`), or neither (the run's embedded server).
 */
import { z } from 'zod';
import { nonNegativeInt } from './schema-util.js';

/** `host:port` of a Sentinel; IPv6 hosts in brackets (`[::1]:26379`). */
const SENTINEL_ADDRESS = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([1-9][0-9]{0,4})$/;
const SENTINEL_EXPECTED = 'expected a Sentinel address "host:port" (e.g. "sentinel-1:26379")';

const secret = (what: string) =>
  z
    .string({ error: `expected ${what} (a string)` })
    .min(1, { error: `expected ${what}, not an empty string` })
    .regex(/^[^\r\n]*$/, { error: `expected ${what} without line breaks` });

/** Keys that only mean something with `redis.sentinels`. */
const SENTINEL_ONLY_KEYS = ['name', 'password', 'sentinelPassword', 'tls', 'db'] as const;

/** The `redis` section. */
export const RedisConfigSchema = z
  .strictObject({
    url: z
      .url({ protocol: /^rediss?$/, error: 'expected a redis:// or rediss:// URL' })
      .optional()
      .describe(
        'Redis (>= 6.2, `maxmemory-policy noeviction`) to use, e.g. `redis://host:6379/0`. Omitted (and no `sentinels`) = tokenmill starts a private `redis-server` whose data lives in the run folder.',
      ),
    sentinels: z
      .array(z.string({ error: SENTINEL_EXPECTED }).regex(SENTINEL_ADDRESS, { error: SENTINEL_EXPECTED }), {
        error: 'expected a list of Sentinel addresses "host:port"',
      })
      .min(1, { error: 'expected at least one Sentinel address' })
      .optional()
      .describe(
        'Redis Sentinels (`host:port`) that name the primary of `redis.name`; every process asks them for the primary and follows a failover. Instead of `redis.url`.',
      ),
    name: z
      .string({ error: 'expected the master name the Sentinels monitor (a string)' })
      .min(1, { error: 'expected the master name the Sentinels monitor, not an empty string' })
      .optional()
      .describe('With `redis.sentinels`: the master name the Sentinels monitor (`sentinel monitor <name> …`).'),
    password: secret('a Redis password')
      .optional()
      .describe(
        'With `redis.sentinels`: the password of the Redis primary and replicas (`requirepass`); never printed.',
      ),
    sentinelPassword: secret('a Sentinel password')
      .optional()
      .describe(
        'With `redis.sentinels`: the password of the Sentinels themselves (`requirepass` in sentinel.conf); never printed.',
      ),
    tls: z
      .boolean({ error: 'expected true or false' })
      .optional()
      .describe('With `redis.sentinels`: connect to the Sentinels and to Redis over TLS.'),
    db: nonNegativeInt('a database number (an integer >= 0)')
      .optional()
      .describe('With `redis.sentinels`: the database number (as `/N` in a URL). Omitted = 0.'),
    prefix: z
      .string({ error: 'expected a key prefix' })
      .regex(/^[A-Za-z0-9_.:{}-]+$/, {
        error: 'expected a key prefix of letters, digits, "_", ".", ":", "{", "}" or "-"',
      })
      .default('tm')
      .describe('Prefix of every Redis key tokenmill writes (BullMQ queues included).'),
  })
  .superRefine((r, ctx) => {
    if (r.url !== undefined && r.sentinels !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['sentinels'],
        message: 'expected either redis.url or redis.sentinels, not both',
      });
      return;
    }
    if (r.sentinels !== undefined) {
      if (r.name === undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['name'],
          message: 'expected the master name the Sentinels monitor (redis.name) with redis.sentinels',
        });
      }
      return;
    }
    for (const key of SENTINEL_ONLY_KEYS) {
      if (r[key] !== undefined) {
        const hint =
          key === 'password' && r.url !== undefined
            ? ' (with redis.url, put the password in the URL: redis://:<password>@host:6379/0)'
            : '';
        ctx.addIssue({ code: 'custom', path: [key], message: `only used with redis.sentinels${hint}` });
      }
    }
  })
  .prefault({})
  .describe('Redis connection.');

/** The `redis` section, defaults applied. */
export type RedisConfig = z.infer<typeof RedisConfigSchema>;
