// The train stage's pure parts: nvidia-smi parsing, GPU choice, progress lines, CUDA OOM lines,
// fingerprint differences and the command's placeholders.
import { describe, expect, it } from 'vitest';
import { dashboardQueueNames } from '../../src/dashboard/server.js';
import { buildArgv } from '../../src/workers/train/command.js';
import { fingerprintChanges, pythonOf, type EnvFingerprint } from '../../src/workers/train/fingerprint.js';
import { parseGpuList, parseNvidiaSmi, type GpuInfo } from '../../src/workers/gpu/gpus.js';
import { preflight } from '../../src/workers/gpu/preflight.js';
import { ProgressTracker, isCudaOom, parseProgressLine } from '../../src/workers/train/progress.js';

const SMI = `index, name, memory.total [MiB], memory.free [MiB], driver_version
0, NVIDIA H200, 143771 MiB, 140000 MiB, 570.86.15
1, NVIDIA H200, 143771 MiB, 14200 MiB, 570.86.15
`;

describe('nvidia-smi and preflight', () => {
  it('parses the CSV query with header and units, or without', () => {
    const gpus = parseNvidiaSmi(SMI);
    expect(gpus).toEqual([
      { index: 0, name: 'NVIDIA H200', totalMiB: 143_771, freeMiB: 140_000, driver: '570.86.15' },
      { index: 1, name: 'NVIDIA H200', totalMiB: 143_771, freeMiB: 14_200, driver: '570.86.15' },
    ]);
    expect(parseNvidiaSmi('3, Tesla T4, 15360, 15000, 535.1\n')).toEqual([
      { index: 3, name: 'Tesla T4', totalMiB: 15_360, freeMiB: 15_000, driver: '535.1' },
    ]);
    expect(() => parseNvidiaSmi('0, X, lots, 1 MiB, 1')).toThrow(/line 1: expected a size in MiB, got "lots"/);
    expect(parseGpuList('0, 2,2')).toEqual([0, 2]);
    expect(parseGpuList('all')).toBeUndefined();
    expect(() => parseGpuList('0;1')).toThrow(/--gpus: expected GPU indices/);
  });

  it('assigns GPUs with enough free memory, else says which lack it and by how much', () => {
    const gpus: GpuInfo[] = parseNvidiaSmi(SMI);
    const probe = { gpus, problem: null };
    expect(preflight({ gpus: 1, minFreeGpuMemMiB: 20_000 }, probe)).toMatchObject({
      ok: true,
      assigned: [{ index: 0 }],
    });
    const two = preflight({ gpus: 2, minFreeGpuMemMiB: 20_000 }, probe);
    expect(two).toMatchObject({ ok: false });
    expect(two.ok ? '' : two.reason).toContain('GPU 1: 14,200 MiB free, 20,000 needed');
    const restricted = preflight({ gpus: 1, minFreeGpuMemMiB: 20_000 }, probe, [1]);
    expect(restricted.ok ? '' : restricted.reason).toContain('GPU 1: 14,200 MiB free, 20,000 needed');
    expect(preflight({ gpus: 3, minFreeGpuMemMiB: 1 }, probe)).toMatchObject({
      ok: false,
      reason: '3 GPU(s) needed; this worker has 2 GPU(s)',
    });
    expect(
      preflight(
        { gpus: 1, minFreeGpuMemMiB: 1 },
        { gpus: [], problem: 'no GPU on this worker (nvidia-smi not found on the PATH)' },
      ),
    ).toMatchObject({
      ok: false,
      reason: '1 GPU(s) needed; no GPU on this worker (nvidia-smi not found on the PATH)',
    });
    expect(preflight({ gpus: 0, minFreeGpuMemMiB: 20_000 }, { gpus: [], problem: 'none' })).toMatchObject({
      ok: true,
      assigned: [],
    });
  });
});

describe('progress lines', () => {
  it('reads step N/M and loss X in the usual spellings', () => {
    expect(parseProgressLine('step 40/100 loss 2.31')).toEqual({ step: 40, total: 100, loss: 2.31 });
    expect(parseProgressLine('[rank0] Step: 7 / 10, Loss=1.5e-1, lr 3e-4')).toEqual({ step: 7, total: 10, loss: 0.15 });
    expect(parseProgressLine('epoch 1 step 12 of 50 | loss: 0.98')).toEqual({ step: 12, total: 50, loss: 0.98 });
    expect(parseProgressLine('train loss 3.25')).toEqual({ step: null, total: null, loss: 3.25 });
    expect(parseProgressLine('loading checkpoint shards')).toBeNull();
    expect(parseProgressLine('steps_per_epoch=100')).toBeNull();
  });

  it('a custom pattern uses its named groups only', () => {
    const re = /it=(?<step>\d+) of (?<total>\d+) \| objective=(?<loss>[\d.]+)/;
    expect(parseProgressLine('it=3 of 9 | objective=0.5', re)).toEqual({ step: 3, total: 9, loss: 0.5 });
    expect(parseProgressLine('step 3/9 loss 0.5', re)).toBeNull();
  });

  it('tracks steps/s from the first step seen, and the ETA', () => {
    const t = new ProgressTracker();
    t.feed('step 100/1000 loss 4.0', 0);
    t.feed('noise', 500);
    t.feed('step 110/1000 loss 3.0', 5_000);
    expect(t.progress).toEqual({ step: 110, total: 1000, loss: 3, stepsPerSec: 2, etaSeconds: 445 });
    expect(t.firstLoss).toBe(4);
  });

  it('recognizes CUDA out-of-memory lines', () => {
    expect(isCudaOom('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 MiB.')).toBe(true);
    expect(isCudaOom('RuntimeError: CUDA error: out of memory')).toBe(true);
    expect(isCudaOom('step 3/9 loss 0.5')).toBe(false);
  });
});

describe('fingerprint and command', () => {
  const fp = (over: Partial<EnvFingerprint>): EnvFingerprint => ({
    pythonPath: '/venv/bin/python',
    python: '3.11.7',
    cuda: '12.4',
    driver: '550.54.15',
    gpus: ['NVIDIA H100 80GB HBM3'],
    packages: { torch: '2.4.0', transformers: '4.45.0' },
    ...over,
  });

  it('lists what changed, package by package', () => {
    expect(fingerprintChanges(fp({}), fp({ pythonPath: '/other/python' }))).toEqual([]);
    expect(
      fingerprintChanges(
        fp({}),
        fp({ cuda: '12.6', packages: { torch: '2.5.1', transformers: '4.45.0', 'flash-attn': '2.6.3' } }),
      ),
    ).toEqual(['CUDA: 12.4 → 12.6', 'flash-attn: (none) → 2.6.3', 'torch: 2.4.0 → 2.5.1']);
    expect(fingerprintChanges(fp({}), fp({ gpus: ['NVIDIA H100 80GB HBM3', 'NVIDIA H100 80GB HBM3'] }))).toEqual([]);
    expect(fingerprintChanges(fp({}), fp({ gpus: ['NVIDIA H200'] }))).toEqual([
      'GPUs: NVIDIA H100 80GB HBM3 → NVIDIA H200',
    ]);
  });

  it("fingerprints the command's own Python, else python3", () => {
    expect(pythonOf(['/venv/bin/python3.11', 'train.py'])).toBe('/venv/bin/python3.11');
    expect(pythonOf(['torchrun', '--nproc_per_node', '8'])).toBe('python3');
    expect(pythonOf(['torchrun'], '/venv/bin/python')).toBe('/venv/bin/python');
  });

  it('fills the placeholders, and refuses a resume the command could not see', () => {
    const values = { dataset: '/d', output: '/o', checkpoint: null, gpus: [2, 3] };
    expect(
      buildArgv(
        ['t', '--data={dataset}', '{output}', '--n', '{gpus}', '{checkpoint}'],
        ['--resume', '{checkpoint}'],
        values,
      ),
    ).toEqual(['t', '--data=/d', '/o', '--n', '2', '']);
    expect(buildArgv(['t'], ['--resume', '{checkpoint}'], { ...values, checkpoint: '/c/step-5' })).toEqual([
      't',
      '--resume',
      '/c/step-5',
    ]);
    expect(() => buildArgv(['t'], [], { ...values, checkpoint: '/c' })).toThrow(
      /neither train\.command nor train\.resumeArgs has "\{checkpoint\}"/,
    );
  });
});

describe('Bull Board', () => {
  it('shows the train queue when train is configured, and the eval queue with eval too', () => {
    const datasets = [{ name: 'a', prompts: '/a.jsonl' }] as Parameters<typeof dashboardQueueNames>[0]['datasets'];
    expect(dashboardQueueNames({ datasets })).toEqual(['generate-a', 'tokenize', 'merge']);
    expect(dashboardQueueNames({ datasets, train: { command: ['t'] } })).toEqual([
      'generate-a',
      'tokenize',
      'merge',
      'train',
    ]);
    expect(dashboardQueueNames({ datasets, train: { command: ['t'] }, eval: { server: {} } })).toEqual([
      'generate-a',
      'tokenize',
      'merge',
      'train',
      'eval',
    ]);
    expect(dashboardQueueNames({ datasets, eval: { server: {} } })).toEqual(['generate-a', 'tokenize', 'merge']);
  });
});
