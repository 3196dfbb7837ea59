// `redis.sentinels`: the config's rules (with their paths), the `redis-sentinel://` string every
// process is given, and the masking of its passwords.
import { describe, expect, it } from 'vitest';
import { printableConfig } from '../../src/cli/commands/config.js';
import {
  ConfigError,
  configuredRedisUrl,
  loadConfig,
  parseSentinelUrl,
  redactRedisUrl,
} from '../../src/shared/index.js';
import { useTempDir } from '../helpers/temp.js';

const tmp = useTempDir('tokenmill-sentinel-');
const dataset = 'datasets:\n  - name: a\n    prompts: a.jsonl\n    tokenBudget: 10\n';
const load = (redis: string) =>
  loadConfig({ text: `redis: ${redis}\n${dataset}`, baseDir: tmp, file: 'tokenmill.yaml' });

function issues(redis: string): Array<{ path: string; message: string }> {
  try {
    load(redis);
  } catch (e: unknown) {
    if (e instanceof ConfigError) return e.issues.map((i) => ({ path: i.path, message: i.message }));
    throw e;
  }
  throw new Error('expected a ConfigError');
}

describe('redis.sentinels in the config', () => {
  it('reads the Sentinels, the master name and the passwords', () => {
    const c = load(
      '{ sentinels: ["s1:26379", "10.0.0.2:26380", "[::1]:26381"], name: mymaster, password: "p@ss/w", sentinelPassword: sp, db: 2 }',
    );
    expect(c.redis).toMatchObject({
      sentinels: ['s1:26379', '10.0.0.2:26380', '[::1]:26381'],
      name: 'mymaster',
      db: 2,
    });
    const url = configuredRedisUrl(c.redis);
    expect(url).toBe(
      'redis-sentinel://:p%40ss%2Fw@s1:26379,10.0.0.2:26380,[::1]:26381/mymaster?db=2&sentinelPassword=sp',
    );
    expect(parseSentinelUrl(url ?? '')).toEqual({
      sentinels: [
        { host: 's1', port: 26379 },
        { host: '10.0.0.2', port: 26380 },
        { host: '::1', port: 26381 },
      ],
      name: 'mymaster',
      password: 'p@ss/w',
      sentinelPassword: 'sp',
      db: 2,
    });
    expect(redactRedisUrl(url ?? '')).toBe(
      'redis-sentinel://:***@s1:26379,10.0.0.2:26380,[::1]:26381/mymaster?db=2&sentinelPassword=***',
    );
    const printed = JSON.stringify(printableConfig(c));
    expect(printed).not.toContain('p@ss/w');
    expect(printed).not.toContain('"sp"');
  });

  it('keeps redis.url as it is, and no URL means the embedded server', () => {
    expect(configuredRedisUrl(load('{ url: "redis://h:6379/1" }').redis)).toBe('redis://h:6379/1');
    expect(configuredRedisUrl(load('{ prefix: x }').redis)).toBeUndefined();
  });

  it('refuses url and sentinels together, sentinels without a name, and Sentinel keys without sentinels', () => {
    expect(issues('{ url: "redis://h:6379", sentinels: ["s:26379"], name: m }')).toEqual([
      { path: 'redis.sentinels', message: 'expected either redis.url or redis.sentinels, not both' },
    ]);
    expect(issues('{ sentinels: ["s:26379"] }')).toEqual([
      {
        path: 'redis.name',
        message: 'expected the master name the Sentinels monitor (redis.name) with redis.sentinels',
      },
    ]);
    expect(issues('{ url: "redis://h:6379", password: x }')).toEqual([
      {
        path: 'redis.password',
        message:
          'only used with redis.sentinels (with redis.url, put the password in the URL: redis://:<password>@host:6379/0)',
      },
    ]);
    expect(issues('{ name: m, tls: true }').map((i) => i.path)).toEqual(['redis.name', 'redis.tls']);
  });

  it('names a malformed Sentinel address by its index', () => {
    expect(issues('{ sentinels: ["s:26379", "no-port"], name: m }')).toEqual([
      {
        path: 'redis.sentinels[1]',
        message: 'expected a Sentinel address "host:port" (e.g. "sentinel-1:26379"), got "no-port"',
      },
    ]);
    expect(issues('{ sentinels: [], name: m }')[0]?.message).toMatch(/^expected at least one Sentinel address/);
  });
});
