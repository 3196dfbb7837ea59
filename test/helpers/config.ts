// One builder for the configs the tests run with: a run on a test Redis, against one or more
// SGLang endpoints (a simulator), with one dataset `ds` unless the test names its own, writing
// under `out`. Everything else the test gives goes over these defaults.
//
//   loadTestConfig(tmp.dir, { run: 'crash', redis, sim, dataset: { tokenBudget: 5_000 } })
//   writeTestConfig(tmp.dir, { run: 'r', redis, sim: [a.url, b.url], sglang: { concurrency: 4 }, datasets: [...] })
import path from 'node:path';
import { loadConfig, type Config, type ConfigInput } from '../../src/shared/index.js';
import { writeConfig } from './pipeline.js';

type DatasetInput = ConfigInput['datasets'][number];
type SglangInput = NonNullable<ConfigInput['sglang']>;

export interface TestConfigSpec extends Omit<Partial<ConfigInput>, 'redis' | 'sglang'> {
  /** The run's name (default `test`); the default dataset reads `<run>.jsonl`. */
  run?: string;
  /** The Redis of the run: a test Redis (its url and key prefix are used), or a URL; none: an embedded one. */
  redis?: { url: string; prefix?: string } | string | undefined;
  /** The SGLang endpoints: a simulator (its url), a URL, or several URLs. */
  sim?: { url: string } | string | readonly string[] | undefined;
  /** Over the defaults: the `sim` endpoints, `concurrency` 16, `requestTimeoutMs` 60 s. */
  sglang?: Partial<SglangInput>;
  /** Over the default dataset (`ds`, `<run>.jsonl`, a budget of 1e9 tokens, 2048 new tokens, batches of 8); ignored when `datasets` is given. */
  dataset?: Partial<DatasetInput>;
}

/** The default dataset of a run: `ds`, reading `<run>.jsonl`, a budget that never binds. */
export function testDataset(run: string, over: Partial<DatasetInput> = {}): DatasetInput {
  return {
    name: 'ds',
    prompts: `${run}.jsonl`,
    tokenBudget: 1_000_000_000,
    maxNewTokens: 2048,
    batchSize: 8,
    ...over,
  } as DatasetInput;
}

/** A config for a test run: the spec over the defaults above. */
export function testConfig(spec: TestConfigSpec = {}): ConfigInput {
  const { run = 'test', redis, sim, sglang, dataset, datasets, output, ...rest } = spec;
  const endpoints =
    sim === undefined ? undefined : typeof sim === 'string' ? [sim] : 'url' in sim ? [sim.url] : [...sim];
  return {
    run,
    ...(redis === undefined
      ? {}
      : {
          redis:
            typeof redis === 'string'
              ? { url: redis }
              : { url: redis.url, ...(redis.prefix === undefined ? {} : { prefix: redis.prefix }) },
        }),
    sglang: {
      ...(endpoints === undefined ? {} : { endpoints }),
      concurrency: 16,
      requestTimeoutMs: 60_000,
      ...sglang,
    } as SglangInput,
    datasets: datasets ?? [testDataset(run, dataset)],
    output: { dir: 'out', ...output },
    ...rest,
  };
}

/** The test config written as YAML into `dir` (as `<run>.yaml` unless `name` says otherwise); returns its path. */
export function writeTestConfig(dir: string, spec: TestConfigSpec = {}, name?: string): string {
  return writeConfig(dir, testConfig(spec), name ?? `${spec.run ?? 'test'}.yaml`);
}

/** The test config loaded as the CLI would from a file in `dir` (defaults applied, paths resolved against `dir`). */
export function loadTestConfig(dir: string, spec: TestConfigSpec = {}): Config {
  return loadConfig({ baseDir: path.resolve(dir), object: testConfig(spec) });
}
