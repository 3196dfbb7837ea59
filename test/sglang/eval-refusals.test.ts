// `tokenmill eval`'s refusals against the real SGLang 0.5.23 (CPU; it cannot run EAGLE-3 here, so
// the server decodes without a drafter): given as a drafter endpoint, it is refused with the
// message built from its own /server_info; given as the baseline beside a speculative simulator
// that serves the same model_path, it is accepted (labelled measured: real SGLang makes no simulator
// announcement), and beside one serving another model, refused.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig, type Config } from '../../src/shared/index.js';
import type { SimulatorHandle } from '../../src/sim/index.js';
import { startSimulator } from '../../src/sim/index.js';
import { checkServers, evalConfigOf } from '../../src/workers/index.js';
import { killCliChildren, spawnCli, tempDir, writeConfig } from '../helpers/pipeline.js';
import { realSglang, skipReason } from '../helpers/real-sglang.js';

const skip = skipReason();

describe.skipIf(skip !== '')(
  `tokenmill eval's refusals against a real SGLang 0.5.23${skip === '' ? '' : ` (skipped: ${skip})`}`,
  () => {
    let url: string;
    let modelPath: string;
    let tmp: { dir: string; cleanup: () => void };
    let drafter: string;
    const sims: SimulatorHandle[] = [];

    const config = (endpoints: string[], baseline?: string[]): Config =>
      loadConfig({
        object: {
          run: 'r',
          datasets: [{ name: 'ds', prompts: 'p.jsonl', tokenBudget: 1_000 }],
          output: { dir: 'out' },
          eval: { endpoints, ...(baseline === undefined ? {} : { baseline }) },
        },
        baseDir: tmp.dir,
      });

    const speculativeSim = async (model: string): Promise<SimulatorHandle> => {
      const sim = await startSimulator({
        port: 0,
        seed: 3,
        modelPath: model,
        speculative: { draftModelPath: drafter, meanAcceptLength: 2.5 },
      });
      sims.push(sim);
      return sim;
    };

    beforeAll(async () => {
      url = realSglang().url;
      tmp = tempDir('tm-sglang-eval-');
      drafter = path.join(tmp.dir, 'drafter');
      mkdirSync(drafter, { recursive: true });
      writeFileSync(path.join(drafter, 'config.json'), '{}\n');
      const info = (await (await fetch(`${url}/server_info`)).json()) as Record<string, unknown>;
      expect(info.speculative_algorithm ?? null).toBeNull();
      modelPath = String(info.model_path);
    });

    afterAll(async () => {
      await killCliChildren();
      for (const s of sims) await s.stop();
      tmp?.cleanup();
    });

    it('as a drafter endpoint it is refused, the message built from its own /server_info', async () => {
      const file = writeConfig(tmp.dir, {
        run: 'r',
        datasets: [{ name: 'ds', prompts: 'p.jsonl', tokenBudget: 1_000 }],
        output: { dir: 'out' },
        eval: { endpoints: [url] },
      });
      const cli = spawnCli(['eval', '-c', file, '--checkpoint', drafter]);
      expect(await cli.exited).toBe(1);
      expect(cli.output().trim()).toBe(
        `tokenmill: eval: endpoint ${url} serves without speculative decoding (/server_info speculative_algorithm: null); ` +
          `start it with --speculative-algorithm EAGLE3 --speculative-draft-model-path ${drafter}, or list it in eval.baseline`,
      );
    }, 60_000);

    it("as the baseline it is accepted beside a drafter endpoint serving its model_path; beside another model's, refused", async () => {
      const same = await speculativeSim(modelPath);
      const checked = await checkServers(evalConfigOf(config([same.url], [url])), {
        path: drafter,
        what: '--checkpoint',
      });
      // Real SGLang makes no simulator announcement: its figures are measured; the simulator's are not.
      expect(checked.baseline).toEqual([
        { url, version: expect.stringMatching(/^0\.5\./), modelPath, simulator: null },
      ]);
      expect(checked.endpoints[0]).toMatchObject({ url: same.url, modelPath, algorithm: 'EAGLE3' });
      expect(checked.endpoints[0]?.simulator).toMatchObject({ meanAcceptLength: 2.5 });

      const other = await speculativeSim('Qwen/Qwen3-32B');
      await expect(
        checkServers(evalConfigOf(config([other.url], [url])), { path: drafter, what: '--checkpoint' }),
      ).rejects.toThrow(
        `eval: baseline endpoint ${url} serves the model ${modelPath}, but drafter endpoint ${other.url} serves Qwen/Qwen3-32B: the speed-up would compare two targets`,
      );
    }, 60_000);
  },
);
