// Hidden states sized before they are written: the model's hidden size from its config.json
// (plain, multimodal, broken), the estimate's formula at SpecForge issue #426's scale, the
// verdict against a file system, and the lines `status` shows.
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { describeHiddenStates, formatBytes, loadConfig } from '../../src/shared/index.js';
import { stepPayload } from '../../src/workers/train/chain.js';
import {
  estimateHiddenStates,
  hiddenStatesBytes,
  judgeHiddenStates,
  readModelShape,
  type HiddenStatesEstimate,
} from '../../src/workers/train/hidden-states.js';
import { trainPayloadOf } from '../../src/workers/train/train-jobs.js';
import { repoRoot } from '../helpers/pipeline.js';

const FIXTURES = path.join(repoRoot, 'test/fixtures/train');
const MODELS = path.join(FIXTURES, 'models');
const WHERE = 'train.steps[0].hiddenStates';

describe("the target model's hidden size", () => {
  it('reads hidden_size and num_hidden_layers from a Qwen3-8B-like config.json, by folder or by file', async () => {
    const byFolder = await readModelShape(path.join(MODELS, 'qwen3-8b'), WHERE);
    expect(byFolder).toEqual({
      configFile: path.join(MODELS, 'qwen3-8b', 'config.json'),
      hiddenSize: 4096,
      numHiddenLayers: 36,
    });
    expect(await readModelShape(path.join(MODELS, 'qwen3-8b', 'config.json'), WHERE)).toEqual(byFolder);
  });

  it("takes a multimodal config's text_config (the language model's states), not its vision tower's", async () => {
    expect(await readModelShape(path.join(MODELS, 'qwen3-vl-8b'), WHERE)).toMatchObject({
      hiddenSize: 4096,
      numHiddenLayers: 36,
    });
  });

  it('a missing, unparsable or hidden_size-less config.json: the error names the config path and the file', async () => {
    const missing = path.join(MODELS, 'nowhere');
    await expect(readModelShape(missing, WHERE)).rejects.toThrow(
      `${WHERE}.model: cannot read ${path.join(missing, 'config.json')}: no such file`,
    );
    await expect(readModelShape(path.join(MODELS, 'not-json'), WHERE)).rejects.toThrow(
      new RegExp(
        `^${WHERE.replace(/[.[\]]/g, '\\$&')}\\.model: ${path.join(MODELS, 'not-json', 'config.json')} is not valid JSON`,
      ),
    );
    await expect(readModelShape(path.join(MODELS, 'no-hidden-size'), WHERE)).rejects.toThrow(
      `${WHERE}.model: ${path.join(MODELS, 'no-hidden-size', 'config.json')} has no hidden_size (nor text_config.hidden_size)`,
    );
  });

  it("a chain's second step with a broken model: the error says train.steps[1], the model resolved against the config's folder", async () => {
    const config = loadConfig({
      object: {
        datasets: [{ name: 'a', conversations: 'a.jsonl' }],
        train: {
          mode: 'from-scratch',
          steps: [
            { name: 'prepare', command: ['true'] },
            { name: 'extract', command: ['true'], hiddenStates: { model: 'models/no-hidden-size' } },
          ],
        },
      },
      baseDir: FIXTURES,
    });
    const payload = trainPayloadOf(config, '/tmp/run', { origin: 'cli' });
    expect(payload.steps?.[1]?.hiddenStates).toEqual({
      model: path.join(MODELS, 'no-hidden-size'),
      layers: 4,
      dtype: 'bfloat16',
      overheadBytesPerToken: 16,
      margin: 0.05,
    });
    await expect(estimateHiddenStates(stepPayload(payload, 1))).rejects.toThrow(
      `train.steps[1].hiddenStates.model: ${path.join(MODELS, 'no-hidden-size', 'config.json')} has no hidden_size`,
    );
  });

  it('refuses more layers than the model has hidden states, naming the file', async () => {
    const config = loadConfig({
      object: {
        datasets: [{ name: 'a', conversations: 'a.jsonl' }],
        train: {
          mode: 'from-scratch',
          steps: [{ name: 'extract', command: ['true'], hiddenStates: { model: 'models/qwen3-8b', layers: 38 } }],
        },
      },
      baseDir: FIXTURES,
    });
    await expect(
      estimateHiddenStates(stepPayload(trainPayloadOf(config, '/tmp/run', { origin: 'cli' }), 0)),
    ).rejects.toThrow(
      /^train\.steps\[0\]\.hiddenStates\.layers: 38 hidden-state vectors per token, but .*qwen3-8b\/config\.json gives num_hidden_layers 36 \(at most 37/,
    );
  });
});

describe('the estimate', () => {
  it('is tokens × (hidden size × layers × bytes per element + 16 B of ids and mask)', () => {
    // Qwen3-8B, EAGLE-3's 4 vectors, bfloat16: 32,784 bytes a token.
    expect(
      hiddenStatesBytes({ tokens: 1, hiddenSize: 4096, layers: 4, bytesPerElement: 2, overheadBytesPerToken: 16 }),
    ).toBe(32_784);
    expect(
      hiddenStatesBytes({
        tokens: 1_000_000,
        hiddenSize: 4096,
        layers: 4,
        bytesPerElement: 4,
        overheadBytesPerToken: 16,
      }),
    ).toBe(65_552_000_000);
  });

  it("comes out at SpecForge #426's scale: 53 samples of 64K tokens of GPT-OSS-120B (hidden 2880) are tens of GB", () => {
    // The issue saw 62 GB for its 53 samples (1.17 GB a sample, so on average somewhat under 64K
    // tokens); full 65,536-token samples with the 4 EAGLE-3 vectors are an upper bound near it.
    const bytes = hiddenStatesBytes({
      tokens: 53 * 65_536,
      hiddenSize: 2880,
      layers: 4,
      bytesPerElement: 2,
      overheadBytesPerToken: 16,
    });
    expect(bytes).toBe(80_082_894_848);
    expect(bytes).toBeGreaterThan(62e9);
    expect(bytes).toBeLessThan(100e9);
    expect(formatBytes(bytes)).toBe('80.1 GB');
    // 30,000 such samples: the "35 TB" order.
    expect(formatBytes((bytes / 53) * 30_000)).toBe('45.3 TB');
  });

  it('formats bytes in decimal units', () => {
    expect([950, 96 * 1024, 1.8e12, 900e9, 2.9e15].map(formatBytes)).toEqual([
      '950 B',
      '98.3 kB',
      '1.8 TB',
      '900 GB',
      '2.9 PB',
    ]);
  });
});

describe('the verdict against the file system', () => {
  const estimate: HiddenStatesEstimate = {
    step: 'extract',
    stepIndex: 0,
    steps: 2,
    where: WHERE,
    tokens: 53 * 65_536,
    tokensFrom: 'merge index',
    dataset: '/data/run/train-dataset',
    hiddenSize: 2880,
    layers: 4,
    dtype: 'bfloat16',
    bytesPerElement: 2,
    overheadBytesPerToken: 16,
    margin: 0.05,
    configFile: '/models/gpt-oss-120b/config.json',
    bytes: 80_082_894_848,
  };
  const ctx = { minFreeDiskGiB: 0, reusableBytes: 0, chain: 'r-train-1', jobId: 'r-train-1-extract' };
  const needed = Math.ceil(80_082_894_848 * 1.05);

  it('a file system smaller than the estimate + 5 % is refused, in one line with the inputs, its size and path', () => {
    const v = judgeHiddenStates(estimate, { path: '/data', totalBytes: 50e9, freeBytes: 40e9 }, ctx);
    expect(v.verdict).toBe('refused');
    expect(v.reason).not.toContain('\n');
    expect(v.reason).toBe(
      'step extract: hidden states ≈ 80.1 GB (3,473,408 tokens × (2,880 hidden × 4 layers × 2 B bfloat16 + 16 B)), 84.1 GB with the 5% margin, cannot fit on /data: its file system is 50.0 GB in all (train.steps[0].hiddenStates; tokens of /data/run/train-dataset, hidden size from /models/gpt-oss-120b/config.json)',
    );
    expect(v.entry).toMatchObject({ verdict: 'refused', neededBytes: needed, chain: 'r-train-1', step: 'extract' });
  });

  it('too little free space waits, saying the estimate and what is free; what the output folder holds counts', () => {
    const v = judgeHiddenStates(estimate, { path: '/data', totalBytes: 2e12, freeBytes: 60e9 }, ctx);
    expect(v.verdict).toBe('waiting');
    expect(v.reason).toMatch(
      /^hidden states ≈ 80\.1 GB \(.*\), \/data has 60\.0 GB free; step extract waits for 84\.1 GB/,
    );
    const reused = judgeHiddenStates(
      estimate,
      { path: '/data', totalBytes: 2e12, freeBytes: 60e9 },
      { ...ctx, reusableBytes: 30e9 },
    );
    expect(reused.verdict).toBe('fits');
  });

  it('minFreeDiskGiB adds to what is needed', () => {
    const disk = { path: '/data', totalBytes: 2e12, freeBytes: 90e9 };
    expect(judgeHiddenStates(estimate, disk, ctx).verdict).toBe('fits');
    const v = judgeHiddenStates(estimate, disk, { ...ctx, minFreeDiskGiB: 10 });
    expect(v.verdict).toBe('waiting');
    expect(v.entry.neededBytes).toBe(Math.ceil(80_082_894_848 * 1.05 + 10 * 2 ** 30));
    expect(v.reason).toContain('(the estimate + 5% margin + minFreeDiskGiB 10)');
  });

  it("status' line: the estimate, its inputs, the disk and the verdict", () => {
    const v = judgeHiddenStates(estimate, { path: '/data', totalBytes: 2e12, freeBytes: 60e9 }, ctx);
    expect(describeHiddenStates(v.entry)).toBe(
      'hidden states ≈ 80.1 GB (3,473,408 tokens × (2,880 hidden × 4 layers × 2 B bfloat16 + 16 B)); /data: 60.0 GB free of 2.0 TB — waiting for 84.1 GB free',
    );
  });
});
