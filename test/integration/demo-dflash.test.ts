// `tokenmill demo --drafter dflash --json` as a real child process, on one demo dataset (a small,
// quick demo): prepare → generate → tokenize → merge → train (trainers/tiny_drafter.py --mode
// dflash on the CPU) → eval on a DFLASH simulator, the attempt's eval.json reporting it per
// dataset; then `tokenmill eval --compare` lists the drafter beside no speculation. Needs the
// trainer environment (.venv with torch); without it the demo ends at merge and this file skips.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { demoTrainerPython } from '../../src/cli/commands/demo-train.js';
import { repoRoot, spawnCli } from '../helpers/pipeline.js';

const out = mkdtempSync(path.join(os.tmpdir(), 'tm-demo-dflash-'));
afterAll(() => rmSync(out, { recursive: true, force: true }));

describe.skipIf(demoTrainerPython(repoRoot) === null)('tokenmill demo --drafter dflash', () => {
  it('trains the DFlash block drafter and evaluates it on a DFLASH server; eval --compare lists it', async () => {
    const demo = spawnCli([
      'demo',
      '--drafter',
      'dflash',
      '--json',
      '--datasets',
      'B1_glaive',
      '--time-scale',
      '200',
      '--out',
      out,
    ]);
    expect(await demo.exited, demo.output().slice(-3000)).toBe(0);
    const lines = demo.stdout().trim().split('\n');
    const status = JSON.parse(lines.at(-1) ?? '{}') as { phases: { name: string; status: string }[] };
    for (const phase of ['prepare', 'generate', 'tokenize', 'merge', 'train', 'eval'])
      expect(status.phases.find((p) => p.name === phase)?.status, phase).toBe('completed');

    const runDir = path.join(out, 'demo');
    const log = readFileSync(path.join(runDir, 'train', '0001', 'train.log'), 'utf8');
    expect(log).toMatch(/tiny_drafter: dflash, \d+ samples with anchors .*block 8, mask token 151654/);
    const report = JSON.parse(readFileSync(path.join(runDir, 'train', '0001', 'eval.json'), 'utf8')) as {
      endpoints: { algorithm: string; numDraftTokens: number | null; blockSize?: number | null }[];
      datasets: { dataset: string; drafter: { acceptLength: number | null }; speedup: number | null }[];
    };
    expect(report.endpoints[0]).toMatchObject({ algorithm: 'DFLASH', numDraftTokens: 8, blockSize: 8 });
    expect(report.datasets.map((d) => d.dataset)).toEqual(['B1_glaive']);
    expect(report.datasets[0]?.drafter.acceptLength ?? 0).toBeGreaterThan(1.5);
    expect(report.datasets[0]?.speedup).not.toBeNull();

    const compare = spawnCli(['eval', '-c', path.join(runDir, 'tokenmill.yaml'), '--compare']);
    expect(await compare.exited, compare.output()).toBe(0);
    // Both rows marked simulated (`*`): the demo's server is the simulator.
    expect(compare.stdout()).toMatch(/^B1_glaive\s+no speculation \*\s+4\s+-\s+[\d.]+\s+1\.00x$/m);
    expect(compare.stdout()).toMatch(/^B1_glaive\s+0001 DFLASH \(block 8\) \*\s+4\s+[\d.]+\s+[\d.]+\s+[\d.]+x$/m);
  }, 300_000);
});
