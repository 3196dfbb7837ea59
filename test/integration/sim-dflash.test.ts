/**
 * The simulator with `speculative.algorithm: DFLASH` (block drafting): options and defaults, the
 * decaying acceptance profile per block position, the load model's block-verify cost,
 * `/server_info` as SGLang 0.5.23 reports a DFLASH server, and `/generate`'s `spec_*` meta_info
 * fields (the same as EAGLE3's) over real HTTP.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { type SimulatorHandle, startSimulator } from '../../src/sim/index.js';
import {
  DEFAULT_DFLASH_Q,
  Speculation,
  dflashProfile,
  expectedAcceptLength,
  resolveSpeculative,
  speculativeFromFlags,
  specWork,
} from '../../src/sim/speculative.js';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const REAL_PLAIN = JSON.parse(
  readFileSync(path.join(REPO_ROOT, 'test/fixtures/sglang/server_info-0.5.23-plain.json'), 'utf8'),
) as Record<string, unknown>;

describe('DFLASH options', () => {
  it('defaults: a block of 16 (15 drafts), one chain, a decaying profile, the block verify priced', () => {
    const r = resolveSpeculative({ algorithm: 'DFLASH', draftModelPath: 'd' });
    expect(r).toMatchObject({ algorithm: 'DFLASH', blockSize: 16, numSteps: 15, numDraftTokens: 16, eagleTopk: 1 });
    expect(r.acceptance).toEqual(dflashProfile(DEFAULT_DFLASH_Q, 15));
    // 0.1 for the drafter's one pass, 0.02 per slot verified.
    expect(r.draftOverhead).toBeCloseTo(0.1 + 0.02 * 16, 12);
    for (let k = 1; k < r.acceptance.length; k++) expect(r.acceptance[k] ?? 0).toBeLessThan(r.acceptance[k - 1] ?? 0);
  });

  it('a mean accept length gives the profile that reaches it, per dataset too', () => {
    const r = resolveSpeculative({
      algorithm: 'DFLASH',
      draftModelPath: 'd',
      blockSize: 8,
      meanAcceptLength: 3.5,
      perDataset: { code: { meanAcceptLength: 5 } },
    });
    expect(r.acceptance).toHaveLength(7);
    expect(expectedAcceptLength(r.acceptance)).toBeCloseTo(3.5, 6);
    expect(expectedAcceptLength(r.perDataset.get('code') ?? [])).toBeCloseTo(5, 6);
    expect((r.acceptance[6] ?? 1) < (r.acceptance[0] ?? 0)).toBe(true);
  });

  it('rejects what DFLASH does not take, naming the option', () => {
    const base = { algorithm: 'DFLASH' as const, draftModelPath: 'd' };
    expect(() => resolveSpeculative({ ...base, numSteps: 3 })).toThrow(/speculative\.numSteps: DFLASH/);
    expect(() => resolveSpeculative({ ...base, blockSize: 1 })).toThrow(/speculative\.blockSize/);
    expect(() => resolveSpeculative({ ...base, blockSize: 8, numDraftTokens: 4 })).toThrow(/numDraftTokens/);
    expect(() => resolveSpeculative({ ...base, blockSize: 4, acceptance: [0.5, 0.5] })).toThrow(
      /must have numSteps \(3\) entries/,
    );
    expect(() => resolveSpeculative({ ...base, blockSize: 4, meanAcceptLength: 4.5 })).toThrow(
      /\[1, numSteps \+ 1 = 4\]/,
    );
    expect(() => resolveSpeculative({ draftModelPath: 'd', blockSize: 8 })).toThrow(/only with algorithm DFLASH/);
  });

  it('from the command line: --speculative-dflash-block-size and --speculative-block-verify-cost', () => {
    expect(
      speculativeFromFlags({
        speculativeAlgorithm: 'DFLASH',
        speculativeDraftModelPath: 'd',
        speculativeDflashBlockSize: 8,
        speculativeBlockVerifyCost: 0.05,
        speculativeAcceptance: '3.2',
      }),
    ).toEqual({ algorithm: 'DFLASH', draftModelPath: 'd', blockSize: 8, blockVerifyCost: 0.05, meanAcceptLength: 3.2 });
    expect(() => speculativeFromFlags({ speculativeDflashBlockSize: 8 })).toThrow(
      /--speculative-dflash-block-size needs --speculative-algorithm EAGLE3 or DFLASH/,
    );
  });

  it('a verify step costs 1 + draftOverhead + blockVerifyCost × blockSize decode steps', () => {
    const spec = resolveSpeculative({ algorithm: 'DFLASH', draftModelPath: 'd', blockSize: 8, blockVerifyCost: 0.05 });
    const s = new Speculation(spec, 1);
    const plan = s.plan('eval:x:1', 200);
    expect(s.loadJob(plan).decodeWork).toBeCloseTo(1 + plan.accepted.length * (1 + 0.1 + 0.05 * 8), 9);
    expect(specWork(plan, spec.draftOverhead)).toBeCloseTo(s.loadJob(plan).decodeWork, 12);
  });

  it('the acceptance per block position follows the profile: position k reached as often as the rates say', () => {
    const spec = resolveSpeculative({ algorithm: 'DFLASH', draftModelPath: 'd', blockSize: 8 });
    const s = new Speculation(spec, 3);
    const reached = new Array<number>(8).fill(0);
    let steps = 0;
    for (let i = 0; i < 400; i++) {
      const plan = s.plan(`r${i}`, 400);
      // Leave out the last step, which may be cut.
      for (const a of plan.accepted.slice(0, -1)) {
        steps++;
        for (let k = 0; k <= a; k++) reached[k] = (reached[k] ?? 0) + 1;
      }
    }
    let expected = 1;
    for (let k = 1; k < 8; k++) {
      expected *= spec.acceptance[k - 1] ?? 0;
      expect((reached[k] ?? 0) / steps).toBeCloseTo(expected, 1);
    }
  });
});

describe('a DFLASH simulator over HTTP', () => {
  let sim: SimulatorHandle;
  beforeAll(async () => {
    sim = await startSimulator({
      port: 0,
      seed: 5,
      timeScale: 1000,
      modelPath: 'Qwen/Qwen3-8B',
      outputLength: { distribution: 'fixed', mean: 300 },
      speculative: {
        algorithm: 'DFLASH',
        draftModelPath: 'out/drafters/qwen3-8b-dflash',
        blockSize: 8,
        meanAcceptLength: 3.4,
        perDataset: { gsm8k: { meanAcceptLength: 5.2 } },
      },
    });
  });
  afterAll(async () => {
    await sim.stop();
  });

  it("/server_info: SGLang's DFLASH settings, with the keys and types of a real 0.5.23 answer", async () => {
    const info = (await (await fetch(`${sim.url}/server_info`)).json()) as Record<string, unknown>;
    expect(info).toMatchObject({
      speculative_algorithm: 'DFLASH',
      speculative_draft_model_path: 'out/drafters/qwen3-8b-dflash',
      speculative_num_steps: 1,
      speculative_eagle_topk: 1,
      speculative_num_draft_tokens: 8,
      speculative_dflash_block_size: 8,
    });
    expect(REAL_PLAIN).toHaveProperty('speculative_dflash_block_size');
    expect(String(info.launch_command)).toContain(
      '--speculative-algorithm DFLASH --speculative-draft-model-path out/drafters/qwen3-8b-dflash --speculative-dflash-block-size 8',
    );
  });

  it("/generate: the same spec_* meta_info as EAGLE3's, per dataset, counted against the block", async () => {
    const lengths: Record<string, number[]> = { gsm8k: [], chat: [] };
    for (const dataset of ['gsm8k', 'chat'])
      for (let i = 0; i < 12; i++) {
        const res = await fetch(`${sim.url}/generate`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            rid: `eval:${dataset}:${i}:drafter`,
            input_ids: [1, 2, 3],
            sampling_params: { max_new_tokens: 300 },
          }),
        });
        const body = (await res.json()) as { meta_info: Record<string, number | number[]> };
        const m = body.meta_info;
        const verify = m.spec_verify_ct as number;
        expect(verify).toBeGreaterThan(0);
        expect(m.spec_num_proposed_drafts).toBe(verify * 7);
        expect(m.spec_accept_length).toBeCloseTo((m.completion_tokens as number) / verify, 9);
        expect((m.spec_correct_drafts_histogram as number[]).length).toBeLessThanOrEqual(8);
        lengths[dataset]?.push(m.spec_accept_length as number);
      }
    const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
    expect(mean(lengths.gsm8k ?? [])).toBeGreaterThan(mean(lengths.chat ?? []) + 0.8);
    expect(mean(lengths.chat ?? [])).toBeGreaterThan(2.6);
    expect(mean(lengths.chat ?? [])).toBeLessThan(4.2);
  });
});
