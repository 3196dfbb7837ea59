/**
 * The simulator's speculative decoding (src/sim/speculative.ts): options, the verify-step
 * plans and SGLang's per-request counters, the accept length they reach, and the load model
 * pricing a verify step at 1 + draftOverhead decode steps (on a virtual clock).
 */
import { describe, expect, it } from 'vitest';

import { LoadModel, VirtualClock } from '../../src/sim/load-model.js';
import {
  Speculation,
  datasetOfRid,
  expectedAcceptLength,
  parseAcceptanceArg,
  planSpeculation,
  ratesForMeanAcceptLength,
  resolveSpeculative,
  specCounts,
  specMetaInfo,
  specRng,
  specWork,
  speculativeFromFlags,
  tokensAfterWork,
  type SpecPlan,
} from '../../src/sim/speculative.js';

const RATES = [0.8, 0.6, 0.4];

/** Output lengths 1..600 drawn from a fixed seed, so that the last steps are cut in many ways. */
function lengths(n: number): number[] {
  let x = 12345;
  return Array.from({ length: n }, () => {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    return 1 + (x % 600);
  });
}

function plansFor(rates: readonly number[], n: number, seed = 7): { rid: string; plan: SpecPlan }[] {
  return lengths(n).map((outputTokens, i) => {
    const rid = `r${i}`;
    return { rid, plan: planSpeculation(rates, outputTokens, specRng(seed, rid)) };
  });
}

describe('resolveSpeculative', () => {
  it('applies the defaults: 3 steps, topk 1, numSteps + 1 draft tokens, overhead 0.25, rate 0.7 everywhere', () => {
    const r = resolveSpeculative({ draftModelPath: 'drafter' });
    expect(r).toMatchObject({
      algorithm: 'EAGLE3',
      draftModelPath: 'drafter',
      numSteps: 3,
      eagleTopk: 1,
      numDraftTokens: 4,
      numDraftTokensGiven: undefined,
      draftOverhead: 0.25,
      acceptance: [0.7, 0.7, 0.7],
    });
  });

  it('sets numDraftTokens to numSteps + 1 as SGLang does with topk 1, and says what was given', () => {
    const r = resolveSpeculative({ draftModelPath: 'd', numSteps: 5, numDraftTokens: 8 });
    expect(r.numDraftTokens).toBe(6);
    expect(r.numDraftTokensGiven).toBe(8);
    expect(resolveSpeculative({ draftModelPath: 'd', numSteps: 5, numDraftTokens: 6 }).numDraftTokensGiven).toBe(
      undefined,
    );
  });

  it('rejects what it cannot simulate, naming the option', () => {
    expect(() => resolveSpeculative({ draftModelPath: '' })).toThrow(/speculative\.draftModelPath/);
    expect(() => resolveSpeculative({ draftModelPath: 'd', eagleTopk: 4 })).toThrow(/speculative\.eagleTopk/);
    expect(() => resolveSpeculative({ draftModelPath: 'd', acceptance: [0.5, 0.5] })).toThrow(
      /speculative\.acceptance must have numSteps \(3\) entries/,
    );
    expect(() => resolveSpeculative({ draftModelPath: 'd', acceptance: [0.5, 1.5, 0.5] })).toThrow(
      /speculative\.acceptance\[1\]/,
    );
    expect(() => resolveSpeculative({ draftModelPath: 'd', meanAcceptLength: 4.5 })).toThrow(
      /\[1, numSteps \+ 1 = 4\]/,
    );
    expect(() => resolveSpeculative({ draftModelPath: 'd', acceptance: RATES, meanAcceptLength: 2 })).toThrow(
      /not both/,
    );
    expect(() => resolveSpeculative({ draftModelPath: 'd', perDataset: { gsm8k: { meanAcceptLength: 0.5 } } })).toThrow(
      /speculative\.perDataset\.gsm8k\.meanAcceptLength/,
    );
    expect(() => resolveSpeculative({ draftModelPath: 'd', draftOverhead: -0.1 })).toThrow(/draftOverhead/);
  });
});

describe('acceptance rates', () => {
  it('expectedAcceptLength is 1 + the chance of reaching each draft', () => {
    expect(expectedAcceptLength([0.8, 0.6, 0.4])).toBeCloseTo(1 + 0.8 + 0.48 + 0.192, 12);
    expect(expectedAcceptLength([0, 0, 0])).toBe(1);
    expect(expectedAcceptLength([1, 1, 1])).toBe(4);
  });

  it('ratesForMeanAcceptLength gives rates that reach the mean, from 1 to numSteps + 1', () => {
    for (const steps of [1, 3, 5]) {
      for (const mean of [1, 1.15, 2, 2.5, steps + 0.5, steps + 1]) {
        if (mean > steps + 1) continue;
        const rates = ratesForMeanAcceptLength(mean, steps);
        expect(rates).toHaveLength(steps);
        expect(expectedAcceptLength(rates)).toBeCloseTo(mean, 9);
      }
    }
  });
});

describe('datasetOfRid', () => {
  it("reads the evaluation's eval:<dataset>:… and the generation stage's <dataset>/<sample>#…", () => {
    expect(datasetOfRid('eval:gsm8k:17#a')).toBe('gsm8k');
    expect(datasetOfRid('eval:mt-bench:q3:turn2')).toBe('mt-bench');
    expect(datasetOfRid('sharegpt/p12#0a1b2c3d4')).toBe('sharegpt');
    expect(datasetOfRid('3f2a9c')).toBeUndefined();
    expect(datasetOfRid('/leading-slash')).toBeUndefined();
  });
});

describe('verify-step bookkeeping', () => {
  const plans = plansFor(RATES, 3000);

  it('matches SGLang: histogram sums to spec_verify_ct, Σ k·hist[k] = correct, completion = 1 + correct + verify_ct − cut', () => {
    let cutSome = 0;
    let cutNone = 0;
    for (const { plan } of plans) {
      const counts = specCounts(plan, plan.outputTokens);
      const steps = plan.accepted.length;
      expect(counts.verifyCt).toBe(steps);
      expect(counts.histogram.reduce((a, b) => a + b, 0)).toBe(counts.verifyCt);
      expect(counts.histogram.reduce((sum, n, k) => sum + k * n, 0)).toBe(counts.correctDrafts);
      // SGLang's histogram grows to the largest count seen: its last entry is never 0.
      if (steps > 0) expect(counts.histogram.at(-1)).toBeGreaterThan(0);
      // Only the last step may be cut: every earlier one emitted accepted + 1.
      let uncut = 0;
      for (let i = 0; i < steps - 1; i++) {
        if ((plan.emittedBefore[i + 1] ?? 0) - (plan.emittedBefore[i] ?? 0) === (plan.accepted[i] ?? 0) + 1) uncut++;
      }
      expect(uncut).toBe(Math.max(0, steps - 1));
      const last = steps > 0 ? (plan.emittedBefore[steps] ?? 0) - (plan.emittedBefore[steps - 1] ?? 0) : 0;
      const cut = steps > 0 ? (plan.accepted[steps - 1] ?? 0) + 1 - last : 0;
      expect(cut).toBeGreaterThanOrEqual(0);
      expect(cut).toBeLessThanOrEqual(RATES.length);
      expect(plan.outputTokens).toBe(1 + counts.correctDrafts + counts.verifyCt - cut);
      if (cut > 0) cutSome++;
      else cutNone++;
    }
    // Both cases occur in the sample, so both were checked.
    expect(cutSome).toBeGreaterThan(100);
    expect(cutNone).toBeGreaterThan(100);
  });

  it('a request stopped between steps (an abort) ends on a step boundary: completion = 1 + correct + verify_ct', () => {
    const { plan } = plans.find((p) => p.plan.accepted.length > 20) ?? { plan: undefined };
    if (plan === undefined) throw new Error('no long plan');
    for (const k of [0, 1, 5, 20]) {
      const tokens = 1 + (plan.emittedBefore[k] ?? 0);
      const counts = specCounts(plan, tokens);
      expect(counts.verifyCt).toBe(k);
      expect(tokens).toBe(1 + counts.correctDrafts + counts.verifyCt);
    }
    expect(specCounts(plan, 0).verifyCt).toBe(0);
  });

  it('meta_info fields: rate over (D − 1) per step, length over verify steps; none without a verify step', () => {
    const { plan } = plans.find((p) => p.plan.outputTokens > 50) ?? { plan: undefined };
    if (plan === undefined) throw new Error('no plan');
    const counts = specCounts(plan, plan.outputTokens);
    expect(specMetaInfo(counts, 4, plan.outputTokens)).toEqual({
      spec_accept_rate: counts.correctDrafts / (counts.verifyCt * 3),
      spec_accept_length: plan.outputTokens / counts.verifyCt,
      spec_num_correct_drafts: counts.correctDrafts,
      spec_num_proposed_drafts: counts.verifyCt * 3,
      spec_verify_ct: counts.verifyCt,
      spec_correct_drafts_histogram: counts.histogram,
    });
    // One token comes from the prefill: no verify step, no fields.
    const one = planSpeculation(RATES, 1, specRng(0, 'x'));
    expect(one.accepted).toEqual([]);
    expect(specMetaInfo(specCounts(one, 1), 4, 1)).toBeUndefined();
  });

  it('is deterministic per (seed, rid)', () => {
    const again = plansFor(RATES, 50);
    expect(again.map((p) => p.plan)).toEqual(plans.slice(0, 50).map((p) => p.plan));
    const otherSeed = plansFor(RATES, 50, 8);
    expect(otherSeed.map((p) => p.plan.accepted)).not.toEqual(plans.slice(0, 50).map((p) => p.plan.accepted));
  });
});

describe('accept length over many requests', () => {
  /** Tokens per verify step (bonus included) over every step of every plan. */
  function measured(rates: readonly number[], seed: number): { perStep: number; reported: number } {
    let steps = 0;
    let stepTokens = 0;
    let reportedSum = 0;
    let reportedN = 0;
    for (const { plan } of plansFor(rates, 2000, seed)) {
      const c = specCounts(plan, plan.outputTokens);
      steps += c.verifyCt;
      stepTokens += c.correctDrafts + c.verifyCt;
      const meta = specMetaInfo(c, rates.length + 1, plan.outputTokens);
      if (meta !== undefined && plan.outputTokens >= 300) {
        reportedSum += meta.spec_accept_length as number;
        reportedN++;
      }
    }
    return { perStep: stepTokens / steps, reported: reportedSum / reportedN };
  }

  it.each([
    { what: 'rates [0.8, 0.6, 0.4]', rates: RATES },
    { what: 'mean 3.2 over 3 steps', rates: ratesForMeanAcceptLength(3.2, 3) },
    { what: 'a weak drafter, mean 1.15', rates: ratesForMeanAcceptLength(1.15, 3) },
    { what: 'mean 4 over 5 steps', rates: ratesForMeanAcceptLength(4, 5) },
  ])('reaches the configured accept length: $what', ({ rates }) => {
    const target = expectedAcceptLength(rates);
    for (const seed of [1, 2]) {
      const m = measured(rates, seed);
      expect(Math.abs(m.perStep - target)).toBeLessThan(0.02 * target);
      // spec_accept_length of long completions (the prefill's token and a cut step barely count).
      expect(Math.abs(m.reported - target)).toBeLessThan(0.04 * target);
    }
  });

  it('perDataset overrides apply to the rids that name the dataset', () => {
    const spec = new Speculation(
      resolveSpeculative({
        draftModelPath: 'd',
        acceptance: RATES,
        perDataset: { gsm8k: { meanAcceptLength: 3.5 }, chat: { acceptance: [0.1, 0, 0] } },
      }),
      0,
    );
    const mean = (prefix: string): number => {
      let tokens = 0;
      let steps = 0;
      for (let i = 0; i < 500; i++) {
        const plan = spec.plan(`${prefix}${i}`, 400);
        const c = specCounts(plan, plan.outputTokens);
        tokens += c.correctDrafts + c.verifyCt;
        steps += c.verifyCt;
      }
      return tokens / steps;
    };
    expect(mean('eval:gsm8k:')).toBeCloseTo(3.5, 1);
    expect(mean('chat/p')).toBeCloseTo(1.1, 1);
    expect(mean('eval:other:')).toBeCloseTo(expectedAcceptLength(RATES), 1);
  });
});

describe('cost in the load model', () => {
  const plan = planSpeculation(RATES, 500, specRng(3, 'cost'));

  it('a verify step costs 1 + draftOverhead decode steps; tokens come a step at a time', () => {
    expect(specWork(plan, 0.25)).toBeCloseTo(1 + plan.accepted.length * 1.25, 9);
    expect(tokensAfterWork(plan, 0.25, 0.5)).toBe(0);
    expect(tokensAfterWork(plan, 0.25, 1)).toBe(1);
    expect(tokensAfterWork(plan, 0.25, 1 + 1.25 - 0.01)).toBe(1);
    expect(tokensAfterWork(plan, 0.25, 1 + 1.25)).toBe(1 + (plan.accepted[0] ?? 0) + 1);
    expect(tokensAfterWork(plan, 0.25, specWork(plan, 0.25))).toBe(500);
  });

  function runAlone(job: { decodeWork?: number; tokensAfterWork?: (w: number) => number }) {
    const clock = new VirtualClock();
    const model = new LoadModel(
      {
        maxRunningRequests: 8,
        singleRequestTokensPerSec: 100,
        peakTokensPerSec: 1000,
        prefillTokensPerSec: 1e9,
        timeScale: 1,
      },
      clock,
    );
    let finishedAt = -1;
    let generated = -1;
    model.submit({
      id: 'a',
      promptTokens: 0,
      cachedTokens: 0,
      outputTokens: 500,
      ...job,
      onFinish: (r) => {
        finishedAt = clock.now();
        generated = r.generatedTokens;
      },
    });
    const seen = new Set<number>();
    for (let t = 0; finishedAt < 0 && t < 1e6; t += 3) {
      clock.advanceTo(t);
      const p = model.progress('a');
      if (p !== undefined) seen.add(p.generatedTokens);
    }
    return { finishedAt, generated, seen, decoded: model.decodedTokensTotal() };
  }

  it('one request alone takes work / T(1): the speed-up is accept length / (1 + overhead)', () => {
    const plain = runAlone({});
    const spec = new Speculation(resolveSpeculative({ draftModelPath: 'd', acceptance: RATES }), 3);
    const fast = runAlone(spec.loadJob(plan));
    expect(plain.generated).toBe(500);
    expect(fast.generated).toBe(500);
    expect(fast.decoded).toBeCloseTo(500, 6);
    expect(plain.finishedAt).toBeCloseTo(5000, 0);
    expect(fast.finishedAt / plain.finishedAt).toBeCloseTo(specWork(plan, 0.25) / 500, 2);
    // Streaming sees only step boundaries: 0, the prefill's token, then 1 + tokens of k steps.
    const boundaries = new Set([0, ...plan.emittedBefore.map((e) => 1 + e)]);
    for (const n of fast.seen) expect(boundaries.has(n)).toBe(true);
    expect(fast.seen.size).toBeGreaterThan(plan.accepted.length / 2);
  });

  it('a weak drafter (accept length below 1 + overhead) is slower than no drafter', () => {
    const weak = planSpeculation(ratesForMeanAcceptLength(1.1, 3), 500, specRng(3, 'weak'));
    expect(specWork(weak, 0.25)).toBeGreaterThan(500);
  });
});

describe('command-line values', () => {
  it('parseAcceptanceArg: rates with commas, a number ≥ 1 is a mean accept length, below 1 one rate', () => {
    expect(parseAcceptanceArg('0.8,0.6,0.4')).toEqual({ acceptance: [0.8, 0.6, 0.4] });
    expect(parseAcceptanceArg('2.4')).toEqual({ meanAcceptLength: 2.4 });
    expect(parseAcceptanceArg('0.7')).toEqual({ acceptance: [0.7] });
    expect(() => parseAcceptanceArg('0.8,,0.4')).toThrow(/per-position rates/);
    expect(() => parseAcceptanceArg('high')).toThrow(/got "high"/);
  });

  it('speculativeFromFlags needs the algorithm and the draft model path', () => {
    expect(speculativeFromFlags({})).toBeUndefined();
    expect(() => speculativeFromFlags({ speculativeNumSteps: 4 })).toThrow(
      /--speculative-num-steps needs --speculative-algorithm EAGLE3/,
    );
    expect(() => speculativeFromFlags({ speculativeAlgorithm: 'EAGLE3' })).toThrow(/--speculative-draft-model-path/);
    expect(
      speculativeFromFlags({
        speculativeAlgorithm: 'EAGLE3',
        speculativeDraftModelPath: 'out/drafter',
        speculativeNumSteps: 4,
        speculativeAcceptance: '2.5',
        speculativeDataset: ['gsm8k=0.9,0.8,0.7,0.6', 'chat=1.2'],
        speculativeDraftOverhead: 0.3,
      }),
    ).toEqual({
      algorithm: 'EAGLE3',
      draftModelPath: 'out/drafter',
      numSteps: 4,
      meanAcceptLength: 2.5,
      perDataset: { gsm8k: { acceptance: [0.9, 0.8, 0.7, 0.6] }, chat: { meanAcceptLength: 1.2 } },
      draftOverhead: 0.3,
    });
    expect(() =>
      speculativeFromFlags({
        speculativeAlgorithm: 'EAGLE3',
        speculativeDraftModelPath: 'd',
        speculativeDataset: ['=2'],
      }),
    ).toThrow(/<dataset>=<acceptance>/);
  });
});
