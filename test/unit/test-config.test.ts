import { describe, expect, it } from 'vitest';
import { loadTestConfig, testConfig } from '../helpers/config.js';

describe('the tests’ config builder', () => {
  it('fills a run on the given Redis and endpoints with one dataset, and loads', () => {
    const c = loadTestConfig('/tmp', {
      run: 'r',
      redis: { url: 'redis://127.0.0.1:7000', prefix: 'p' },
      sim: { url: 'http://127.0.0.1:30000' },
      sglang: { concurrency: 4 },
      dataset: { maxNewTokens: 64 },
    });
    expect(c.redis).toMatchObject({ url: 'redis://127.0.0.1:7000', prefix: 'p' });
    expect(c.sglang).toMatchObject({ endpoints: ['http://127.0.0.1:30000'], concurrency: 4, requestTimeoutMs: 60_000 });
    expect(c.datasets).toHaveLength(1);
    expect(c.datasets[0]).toMatchObject({ name: 'ds', prompts: '/tmp/r.jsonl', maxNewTokens: 64, batchSize: 8 });
    expect(c.output.dir).toBe('/tmp/out');
  });

  it('takes the datasets given, and several endpoints', () => {
    const c = testConfig({
      sim: ['http://a:1', 'http://b:2'],
      datasets: [{ name: 'x', prompts: 'x.jsonl', tokenBudget: 5 }],
    });
    expect(c.sglang?.endpoints).toEqual(['http://a:1', 'http://b:2']);
    expect(c.datasets.map((d) => d.name)).toEqual(['x']);
  });
});
