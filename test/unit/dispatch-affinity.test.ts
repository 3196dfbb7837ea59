// The slot a conversation holds between two turns: other samples wait for it while it is held,
// and it is free again at once when the conversation ends before its last turn (an agentic turn
// that diverges, a call that does not parse), not only when the hold lapses.
import { describe, expect, it } from 'vitest';

import { EndpointAffinity, type AcquireStage } from '../../src/workers/inference/dispatch-affinity.js';
import type { SampleRequest } from '../../src/workers/inference/dispatch-types.js';

const endpoint = { url: 'http://127.0.0.1:1' } as AcquireStage['endpoints'][number];
const groups: AcquireStage[] = [{ endpoints: [endpoint], cap: 1 }];

function req(id: string, conversation?: { id: string; turn: number; turns: number }): SampleRequest {
  return {
    dataset: 'ds',
    sample: { id, line: 1, promptIds: [1], maxNewTokens: 8 },
    sampling: {},
    maxAttempts: 1,
    priorExpectedTokens: 8,
    attemptsSpent: 0,
    ...(conversation === undefined ? {} : { conversation: { ...conversation, spliced: false } }),
  };
}

describe('endpoint affinity holds', () => {
  it('a held slot waits for its conversation, and is freed when the conversation ends early', () => {
    const affinity = new EndpointAffinity(60_000);
    affinity.answered(req('c#t1', { id: 'c', turn: 1, turns: 3 }), endpoint.url);
    // The one slot is held for turn 2 of `c`: another sample waits.
    expect(affinity.plan(groups, []).admit(req('other'))).toBe(false);
    // `c` ended after turn 1: its slot is free at once.
    affinity.release('ds', 'c');
    expect(affinity.plan(groups, []).admit(req('other'))).toBe(true);
  });

  it('holds nothing after a last turn', () => {
    const affinity = new EndpointAffinity(60_000);
    affinity.answered(req('c#t3', { id: 'c', turn: 3, turns: 3 }), endpoint.url);
    expect(affinity.plan(groups, []).admit(req('other'))).toBe(true);
  });
});
