// A step that asks for a target group and a drafter group (`gpus: { target, drafter }`) on a
// "GPU" machine (the stand-in nvidia-smi on the PATH): each group is preflighted on its own
// (its count, its free memory per GPU), the groups get disjoint GPUs, the command sees both
// lists ({target_gpus} / {drafter_gpus}, TOKENMILL_TARGET_GPUS / TOKENMILL_DRAFTER_GPUS) and
// CUDA_VISIBLE_DEVICES for the whole set (the target group first); a group that cannot be
// served makes the step wait, the reason naming that group; `status` shows the groups. Config
// errors for bad values.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatTrainStatus, loadConfig, readRunStatus } from '../../src/shared/index.js';
import { preflightGroups, type GpuInfo } from '../../src/workers/gpu/index.js';
import { buildArgv } from '../../src/workers/train/command.js';
import { startTrainHarness, waitForStatus, type TrainHarness } from '../helpers/train.js';

const H100 = { name: 'NVIDIA H100 80GB HBM3', totalMiB: 81_559 };

/** A command that writes its argv and the GPU variables of its environment to `file`. */
function recorder(file: string, ...args: string[]): string[] {
  const script = [
    "const fs = require('node:fs');",
    'const e = process.env;',
    'fs.writeFileSync(process.argv[1], JSON.stringify({ argv: process.argv.slice(2),',
    '  CUDA_VISIBLE_DEVICES: e.CUDA_VISIBLE_DEVICES, TOKENMILL_TARGET_GPUS: e.TOKENMILL_TARGET_GPUS,',
    '  TOKENMILL_DRAFTER_GPUS: e.TOKENMILL_DRAFTER_GPUS }));',
  ].join('\n');
  return [process.execPath, '-e', script, file, ...args];
}

function gpus(free: number[]): GpuInfo[] {
  return free.map((freeMiB, index) => ({ index, ...H100, freeMiB, driver: '550.54.15' }));
}

describe('preflightGroups', () => {
  const groups = [
    { name: 'target', gpus: 5, minFreeGpuMemMiB: 70_000 },
    { name: 'drafter', gpus: 3, minFreeGpuMemMiB: 40_000 },
  ];

  it('gives each group its own GPUs, in group order, each with its own free memory', () => {
    const v = preflightGroups(groups, {
      gpus: gpus([80_000, 50_000, 80_000, 80_000, 80_000, 80_000, 50_000, 50_000, 80_000]),
      problem: null,
    });
    expect(v.ok).toBe(true);
    if (!v.ok) return;
    // GPU 1 lacks the target's 70,000 MiB: the target takes 0,2,3,4,5; the drafter the next three.
    expect(v.groups.map((g) => [g.name, g.gpus.map((x) => x.index)])).toEqual([
      ['target', [0, 2, 3, 4, 5]],
      ['drafter', [1, 6, 7]],
    ]);
    expect(v.assigned.map((g) => g.index)).toEqual([0, 2, 3, 4, 5, 1, 6, 7]);
  });

  it('waits when one group cannot be served, naming that group and its GPUs', () => {
    const v = preflightGroups(groups, {
      gpus: gpus([80_000, 80_000, 80_000, 80_000, 80_000, 50_000, 1_000, 1_000]),
      problem: null,
    });
    expect(v.ok).toBe(false);
    const reason = v.ok ? '' : v.reason;
    expect(reason).toMatch(/^drafter group: 3 GPU\(s\) with 40,000 MiB free needed, 1 have it/);
    expect(reason).toContain('GPU 6: 1,000 MiB free, 40,000 needed; GPU 7: 1,000 MiB free, 40,000 needed');
    expect(reason).not.toContain('target group');

    const t = preflightGroups(groups, {
      gpus: gpus([80_000, 60_000, 60_000, 60_000, 60_000, 80_000, 80_000, 80_000]),
      problem: null,
    });
    expect(t.ok ? '' : t.reason).toBe(
      'target group: 5 GPU(s) with 70,000 MiB free needed, 4 have it — GPU 1: 60,000 MiB free, 70,000 needed; GPU 2: 60,000 MiB free, 70,000 needed; GPU 3: 60,000 MiB free, 70,000 needed; GPU 4: 60,000 MiB free, 70,000 needed',
    );

    expect(preflightGroups(groups, { gpus: gpus([80_000, 80_000]), problem: null })).toMatchObject({
      ok: false,
      reason: '8 GPU(s) needed (target 5 + drafter 3); this worker has 2 GPU(s)',
    });
    // Only the GPUs this worker may use (--gpus) count.
    const allowed = preflightGroups(
      [
        { name: 'target', gpus: 1, minFreeGpuMemMiB: 1 },
        { name: 'drafter', gpus: 1, minFreeGpuMemMiB: 1 },
      ],
      { gpus: gpus([80_000, 80_000, 80_000]), problem: null },
      [2, 0],
    );
    expect(allowed.ok ? allowed.groups.map((g) => g.gpus.map((x) => x.index)) : allowed.reason).toEqual([[0], [2]]);
  });

  it('fills {target_gpus} and {drafter_gpus}, and refuses them without groups', () => {
    const values = { dataset: 'd', output: 'o', checkpoint: null, gpus: [0, 1, 2] };
    expect(
      buildArgv(['t', '{gpus}', 'x={target_gpus}', '{drafter_gpus}'], [], {
        ...values,
        groups: { target: [0, 1], drafter: [2] },
      }),
    ).toEqual(['t', '3', 'x=0,1', '2']);
    expect(() => buildArgv(['t', '{target_gpus}'], [], values)).toThrow(
      /\{target_gpus\}: only a step with a target group and a drafter group/,
    );
  });
});

describe('a split train step', () => {
  let h: TrainHarness;
  beforeAll(async () => {
    h = await startTrainHarness();
  });
  afterAll(async () => {
    await h?.close();
  });

  it('refuses bad values with a clear config error', () => {
    const load = (step: Record<string, unknown>) => () =>
      loadConfig({
        object: {
          run: 'r',
          redis: { url: 'redis://127.0.0.1:6379/0' },
          datasets: [{ name: 'd', conversations: 'c.jsonl' }],
          train: { mode: 'from-scratch', steps: [{ name: 's', command: ['t'], ...step }] },
        },
        baseDir: h.root,
      });
    expect(load({ gpus: { target: 5, drafter: 3 } })).not.toThrow();
    expect(load({ gpus: { target: 0, drafter: 3 } })).toThrow(
      /train\.steps\[0\]\.gpus\.target: expected a number of GPUs >= 1 for the target group/,
    );
    expect(load({ gpus: { target: 5 } })).toThrow(
      /train\.steps\[0\]\.gpus: expected a number of GPUs >= 0, or \{ target: N, drafter: M \}.*got a mapping/,
    );
    expect(load({ gpus: { target: 5, drafter: 3, extra: 1 } })).toThrow(/train\.steps\[0\]\.gpus/);
    expect(load({ gpus: 'five' })).toThrow(
      /train\.steps\[0\]\.gpus: expected a number of GPUs >= 0, or \{ target: N, drafter: M \}/,
    );
    expect(load({ gpus: 2, minFreeGpuMemMiB: { target: 1, drafter: 1 } })).toThrow(
      /train\.steps\[0\]\.minFreeGpuMemMiB: expected one number: \{ target, drafter \} needs gpus split the same way/,
    );
    expect(load({ gpus: 2, command: ['t', '{target_gpus}'] })).toThrow(
      /train\.steps\[0\]\.gpus: expected gpus: \{ target: N, drafter: M \}: the command uses "\{target_gpus\}"/,
    );
  });

  it('waits while one group is short, saying which, then runs with disjoint groups, both lists and the whole set', async () => {
    // Eight GPUs; GPU 6 is busy: the drafter group (3 × 40,000 MiB) cannot be served.
    const free = [80_000, 80_000, 80_000, 80_000, 80_000, 50_000, 1_000, 50_000];
    h.setGpus({ driver: '550.54.15', gpus: free.map((freeMiB) => ({ ...H100, freeMiB })) });
    const out = path.join(h.root, 'split.json');
    const config = h.config({
      mode: 'from-scratch',
      steps: [
        {
          name: 'train',
          gpus: { target: 5, drafter: 3 },
          minFreeGpuMemMiB: { target: 70_000, drafter: 40_000 },
          command: recorder(out, '--target', '{target_gpus}', '--drafter', '{drafter_gpus}', '--n', '{gpus}'),
        },
      ],
    });
    const jobId = await h.queue(config);
    await h.worker();
    const waiting = await waitForStatus(
      h,
      (s) => s.state === 'waiting',
      'the split step to wait for its drafter group',
    );
    expect(waiting.waiting).toMatch(/^drafter group: 3 GPU\(s\) with 40,000 MiB free needed, 2 have it/);
    expect(waiting.waiting).toContain('GPU 6: 1,000 MiB free, 40,000 needed');
    const run = await readRunStatus(h.redis.connection(), h.keys, config);
    expect(run.phases.find((p) => p.name === 'train')?.detail).toContain('drafter group');
    expect(existsSync(out)).toBe(false);

    free[6] = 60_000;
    h.setGpus({ driver: '550.54.15', gpus: free.map((freeMiB) => ({ ...H100, freeMiB })) });
    const outcome = await h.wait(jobId);
    expect(outcome.status, outcome.status === 'failed' ? outcome.reason : '').toBe('completed');
    if (outcome.status !== 'completed') return;
    const seen = JSON.parse(readFileSync(out, 'utf8')) as Record<string, unknown>;
    expect(seen).toEqual({
      argv: ['--target', '0,1,2,3,4', '--drafter', '5,6,7', '--n', '8'],
      CUDA_VISIBLE_DEVICES: '0,1,2,3,4,5,6,7',
      TOKENMILL_TARGET_GPUS: '0,1,2,3,4',
      TOKENMILL_DRAFTER_GPUS: '5,6,7',
    });
    expect(outcome.result.gpus).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    const status = await h.status();
    expect(status?.gpuGroups).toBe('target 0,1,2,3,4 + drafter 5,6,7');
    expect(formatTrainStatus(status)[0]).toContain('GPUs target 0,1,2,3,4 + drafter 5,6,7');
    const env = JSON.parse(
      readFileSync(path.join(outcome.result.attemptDir ?? '', 'train', 'environment.json'), 'utf8'),
    ) as { gpuGroups: unknown };
    expect(env.gpuGroups).toEqual({ target: [0, 1, 2, 3, 4], drafter: [5, 6, 7] });
  });

  it('puts the target group first in CUDA_VISIBLE_DEVICES when memory scatters the groups', async () => {
    // GPUs 0 and 1 lack the target's memory, not the drafter's.
    const free = [50_000, 50_000, 80_000, 80_000, 80_000];
    h.setGpus({ driver: '550.54.15', gpus: free.map((freeMiB) => ({ ...H100, freeMiB })) });
    const out = path.join(h.root, 'scattered.json');
    const config = h.config({
      mode: 'from-scratch',
      steps: [
        {
          name: 'train',
          gpus: { target: 3, drafter: 2 },
          minFreeGpuMemMiB: { target: 70_000, drafter: 40_000 },
          command: recorder(out, '{target_gpus}', '{drafter_gpus}'),
        },
      ],
    });
    const outcome = await h.wait(await h.queue(config));
    expect(outcome.status, outcome.status === 'failed' ? outcome.reason : '').toBe('completed');
    expect(JSON.parse(readFileSync(out, 'utf8'))).toEqual({
      argv: ['2,3,4', '0,1'],
      CUDA_VISIBLE_DEVICES: '2,3,4,0,1',
      TOKENMILL_TARGET_GPUS: '2,3,4',
      TOKENMILL_DRAFTER_GPUS: '0,1',
    });
  });
});
