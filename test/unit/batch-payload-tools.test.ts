import { describe, expect, it } from 'vitest';
import {
  GenerateBatchPayloadSchema,
  batchSamples,
  encodeBatchPayload,
  parsePayload,
  type Sample,
} from '../../src/shared/queues/catalog.js';

const settings = {
  dataset: 'd',
  batchId: 'B:e0:1-2',
  sampling: { temperature: 0 },
  maxAttempts: 3,
  priorExpectedTokens: 100,
};

const weather = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
];

describe('generate batch payload: tools', () => {
  it('carries each sample its tools (null for none) and reads them back', () => {
    const samples: Sample[] = [
      { id: 'a', line: 1, promptIds: [1, 2], maxNewTokens: 8, tools: weather },
      { id: 'b', line: 2, promptIds: [3], maxNewTokens: 8 },
    ];
    const payload = encodeBatchPayload(settings, samples);
    expect(payload.tools).toEqual([weather, null]);
    const again = parsePayload(GenerateBatchPayloadSchema, JSON.parse(JSON.stringify(payload)), 'generate batch');
    const back = batchSamples(again);
    expect(back[0]?.tools).toEqual(weather);
    expect(back[1]).not.toHaveProperty('tools');
    expect(back.map((s) => s.promptIds)).toEqual([[1, 2], [3]]);
  });

  it('has no tools field when no sample has tools, and reads a job without one', () => {
    const payload = encodeBatchPayload(settings, [{ id: 'a', line: 1, promptIds: [1], maxNewTokens: 8 }]);
    expect(payload).not.toHaveProperty('tools');
    const back = batchSamples(parsePayload(GenerateBatchPayloadSchema, payload, 'generate batch'));
    expect(back[0]).not.toHaveProperty('tools');
  });

  it('carries tools beside the conversations of turns: all', () => {
    const messages = [{ role: 'user', content: 'Weather in Paris?' }];
    const payload = encodeBatchPayload(settings, [
      { id: 'a', line: 1, promptIds: [1], maxNewTokens: 8, messages, tools: weather },
    ]);
    expect(payload.turns).toBe('all');
    const [back] = batchSamples(parsePayload(GenerateBatchPayloadSchema, payload, 'generate batch'));
    expect(back).toMatchObject({ messages, tools: weather });
  });

  it('refuses a tools list that is not one per sample', () => {
    const payload = encodeBatchPayload(settings, [{ id: 'a', line: 1, promptIds: [1], maxNewTokens: 8 }]);
    expect(() =>
      parsePayload(GenerateBatchPayloadSchema, { ...payload, tools: [null, null] }, 'generate batch'),
    ).toThrow(/tools: expected 1 tool lists/);
  });
});
