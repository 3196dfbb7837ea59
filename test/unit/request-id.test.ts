import { describe, expect, it } from 'vitest';
import { sampleKeyOfRid } from '../../src/sim/faults.js';
import { newRid } from '../../src/workers/inference/dispatch-acquire.js';

describe('newRid', () => {
  it('names the sample before `#` and never repeats, for the same sample either', () => {
    const rids = Array.from({ length: 10_000 }, (_, i) => newRid('ds', `p${i % 10}`));
    expect(new Set(rids).size).toBe(rids.length);
    expect(rids.slice(0, 10).map(sampleKeyOfRid)).toEqual(Array.from({ length: 10 }, (_, i) => `ds/p${i}`));
    expect(rids[0]).toMatch(/^ds\/p0#[0-9a-f]{8}[0-9a-z]+$/);
  });
});
