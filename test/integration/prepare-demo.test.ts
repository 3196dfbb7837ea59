// The demo's sources (a ShareGPT parquet file, an Alpaca JSONL file) prepare, in JS alone, into
// the very prompts of the demo's prompt files they were made from.
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { DEMO_DATASETS, DEMO_SOURCES, demoConfig } from '../../src/cli/commands/demo.js';
import { loadConfig, readPromptFile, type Config, type PromptRecord } from '../../src/shared/index.js';
import { prepareSources } from '../../src/producers/prepare/prepare.js';
import { useHarness } from '../helpers/fixture.js';
import { repoRoot } from '../helpers/pipeline.js';

const { tmp } = useHarness({ tmp: 'tm-prepare-demo-' });
let config: Config;

beforeAll(() => {
  config = loadConfig({ object: demoConfig('http://127.0.0.1:1', tmp.dir), baseDir: repoRoot });
});

async function records(file: string, turns: 'last' | 'all'): Promise<Pick<PromptRecord, 'id' | 'messages'>[]> {
  const out = [];
  for await (const p of readPromptFile(file, undefined, { turns }))
    if (p.ok) out.push({ id: p.record.id, messages: p.record.messages });
  return out;
}

describe('the demo sources', () => {
  it('at least two demo datasets come from sources, in two formats', () => {
    const sourced = config.datasets.filter((d) => d.source !== undefined);
    expect(sourced.map((d) => d.name).sort()).toEqual(Object.keys(DEMO_SOURCES).sort());
    expect(new Set(sourced.map((d) => path.extname(d.source?.path ?? ''))).size).toBeGreaterThanOrEqual(2);
    expect(config.datasets.map((d) => d.name)).toEqual(DEMO_DATASETS.map((d) => d.name));
    for (const d of sourced) expect(d.prompts).toBe(path.join(tmp.dir, 'demo', d.name, 'prompts.jsonl'));
  });

  it('prepare into the prompts of the demo prompt files they were made from', async () => {
    const outcomes = await prepareSources({ config });
    expect(outcomes.map((o) => [o.dataset, o.format, o.outcome])).toEqual([
      ['B5_sharegpt', 'sharegpt', 'prepared'],
      ['B6_writing', 'alpaca', 'prepared'],
    ]);
    for (const o of outcomes) {
      const turns = config.datasets.find((d) => d.name === o.dataset)?.turns ?? 'last';
      const original = await records(path.join(repoRoot, 'data/demo', `${o.dataset}.jsonl`), turns);
      expect(await records(o.prompts, turns)).toEqual(original);
      expect(o.counts).toMatchObject({ rowsRead: original.length, kept: original.length, malformed: 0 });
    }
    // B5 is regenerated turn by turn (turns: all): its conversations are kept whole, the 13 that end
    // with an assistant turn too, and 31 of its 42 have several turns.
    expect(outcomes[0]?.counts.trailingTurnsDropped).toBe(0);
    expect(outcomes[0]?.counts.multiTurn).toBe(31);
  });
});
