// The streamed /generate that `budget: strict` relies on: progress as it comes, the same result
// as a plain request, and the partial output of a request stopped with /abort_request.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SglangClient } from '../../src/shared/index.js';
import { useHarness } from '../helpers/fixture.js';
import { waitFor } from '../helpers/pipeline.js';

const { sim } = useHarness({
  sim: { timeScale: 4, maxRunningRequests: 8, seed: 23, outputLength: { distribution: 'fixed', mean: 600 } },
});
let client: SglangClient;

beforeAll(() => {
  client = new SglangClient({ endpoint: sim.url, concurrency: 8, requestTimeoutMs: 60_000 });
});

afterAll(async () => {
  await client?.close();
});

const prompt = [9707, 11, 1879, 0];

describe('streamed /generate (budget: strict)', () => {
  it('tells the tokens produced as they come and returns what a plain request returns', async () => {
    const seen: number[] = [];
    const streamed = await client.generate({
      inputIds: prompt,
      maxNewTokens: 4_096,
      rid: 'same',
      onProgress: (n) => seen.push(n),
    });
    const plain = await client.generate({ inputIds: prompt, maxNewTokens: 4_096, rid: 'same' });
    expect(streamed.completionTokens).toBe(600);
    expect(streamed.outputIds).toEqual(plain.outputIds);
    expect(streamed.finishReason).toEqual(plain.finishReason);
    expect(seen.length).toBeGreaterThan(1);
    expect([...seen].sort((a, b) => a - b)).toEqual(seen);
    expect(seen[seen.length - 1]).toBe(600);
  });

  it('returns the partial output, finish_reason abort, of a request stopped with /abort_request', async () => {
    let produced = 0;
    const pending = client.generate({
      inputIds: prompt,
      maxNewTokens: 4_096,
      rid: 'cut',
      onProgress: (n) => (produced = n),
    });
    await waitFor(() => produced >= 50, 'some tokens streamed', 30_000, 5);
    await client.abort('cut');
    const result = await pending;
    expect(result.finishReason.type).toBe('abort');
    expect(result.completionTokens).toBeGreaterThanOrEqual(produced);
    expect(result.completionTokens).toBeLessThan(600);
    expect(result.outputIds.length).toBe(result.completionTokens);
  });
});
