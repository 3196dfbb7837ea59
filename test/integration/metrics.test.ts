// GET /metrics during a real generation (simulator behind a proxy that answers 500 to one
// prompt): the text parses under a strict Prometheus text-format parser written here, and its
// numbers are the run's — records, tokens, failed prompts, queue depths, the endpoint's health,
// its request latency histogram and its errors by status.
import { beforeAll, describe, expect, it } from 'vitest';
import { startGeneration } from '../../src/cli/pipeline.js';
import { openRunContextFor } from '../../src/cli/run-context.js';
import { startDashboard } from '../../src/dashboard/server.js';
import { loadConfig, readRunStatus } from '../../src/shared/index.js';
import { waitFor, writePrompts } from '../helpers/pipeline.js';
import { startPromptFaultProxy, type PromptFaultProxy } from '../helpers/prompt-fault-proxy.js';
import { useHarness } from '../helpers/fixture.js';
import { quietLogger } from '../helpers/redis.js';

// ---------------------------------------------------------------------------------------------
// A strict parser of the Prometheus text exposition format (0.0.4).

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}
interface Family {
  name: string;
  type: 'counter' | 'gauge' | 'histogram' | 'summary' | 'untyped';
  help: string | undefined;
  samples: Sample[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

function parseValue(text: string, where: string): number {
  if (text === '+Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  if (text === 'NaN') return NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`${where}: bad value "${text}"`);
  return Number(text);
}

/** Labels `{a="x",b="y"}` from position `i` of `line`; returns them and the position after `}`. */
function parseLabels(line: string, start: number, where: string): [Record<string, string>, number] {
  const labels: Record<string, string> = {};
  let i = start + 1;
  for (;;) {
    if (line[i] === '}') return [labels, i + 1];
    const eq = line.indexOf('=', i);
    if (eq < 0) throw new Error(`${where}: label without =`);
    const name = line.slice(i, eq);
    if (!LABEL_NAME.test(name)) throw new Error(`${where}: bad label name "${name}"`);
    if (name in labels) throw new Error(`${where}: label "${name}" twice`);
    if (line[eq + 1] !== '"') throw new Error(`${where}: label value not quoted`);
    let j = eq + 2;
    let value = '';
    for (;;) {
      const c = line[j];
      if (c === undefined) throw new Error(`${where}: unterminated label value`);
      if (c === '"') break;
      if (c === '\\') {
        const n = line[j + 1];
        if (n === 'n') value += '\n';
        else if (n === '\\' || n === '"') value += n;
        else throw new Error(`${where}: bad escape \\${n ?? ''}`);
        j += 2;
        continue;
      }
      value += c;
      j += 1;
    }
    labels[name] = value;
    i = j + 1;
    if (line[i] === ',') i += 1;
    else if (line[i] !== '}') throw new Error(`${where}: expected , or } after a label`);
  }
}

/** Parses the text; throws on anything the format does not allow. */
function parsePrometheusText(text: string): Map<string, Family> {
  if (!text.endsWith('\n')) throw new Error('the text must end with a newline');
  const families = new Map<string, Family>();
  const seen = new Set<string>();
  const familyOf = (name: string): Family | undefined => {
    const direct = families.get(name);
    if (direct !== undefined) return direct;
    const m = /^(.*)_(bucket|sum|count)$/.exec(name);
    const base = m === null ? undefined : families.get(m[1] ?? '');
    return base !== undefined && (base.type === 'histogram' || base.type === 'summary') ? base : undefined;
  };
  text.split('\n').forEach((line, n) => {
    const where = `line ${n + 1}`;
    if (line.trim() === '') return;
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
      if (m === null) return; // a plain comment
      const [, kind, name = '', rest = ''] = m;
      if (!METRIC_NAME.test(name)) throw new Error(`${where}: bad metric name "${name}"`);
      const f = families.get(name) ?? { name, type: 'untyped', help: undefined, samples: [] };
      if (kind === 'TYPE') {
        if (f.samples.length > 0) throw new Error(`${where}: TYPE of ${name} after its samples`);
        if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(rest))
          throw new Error(`${where}: bad type "${rest}"`);
        f.type = rest as Family['type'];
      } else {
        if (f.help !== undefined) throw new Error(`${where}: second HELP for ${name}`);
        f.help = rest;
      }
      families.set(name, f);
      return;
    }
    const nameEnd = line.search(/[{ ]/);
    if (nameEnd <= 0) throw new Error(`${where}: no metric name`);
    const name = line.slice(0, nameEnd);
    if (!METRIC_NAME.test(name)) throw new Error(`${where}: bad metric name "${name}"`);
    let labels: Record<string, string> = {};
    let i = nameEnd;
    if (line[i] === '{') [labels, i] = parseLabels(line, i, where);
    if (line[i] !== ' ') throw new Error(`${where}: expected a space before the value`);
    const parts = line.slice(i + 1).split(' ');
    if (parts.length < 1 || parts.length > 2) throw new Error(`${where}: expected a value and an optional timestamp`);
    const value = parseValue(parts[0] ?? '', where);
    if (parts[1] !== undefined && !/^-?\d+$/.test(parts[1])) throw new Error(`${where}: bad timestamp`);
    const family = familyOf(name);
    if (family === undefined) throw new Error(`${where}: sample ${name} without a TYPE line`);
    const key = `${name}${JSON.stringify(Object.entries(labels).sort())}`;
    if (seen.has(key)) throw new Error(`${where}: series ${key} twice`);
    seen.add(key);
    family.samples.push({ name, labels, value });
  });
  for (const f of families.values()) {
    if (f.type !== 'histogram') continue;
    const series = new Map<string, Sample[]>();
    for (const s of f.samples.filter((x) => x.name === `${f.name}_bucket`)) {
      const { le, ...rest } = s.labels;
      if (le === undefined) throw new Error(`${f.name}: bucket without le`);
      const k = JSON.stringify(Object.entries(rest).sort());
      series.set(k, [...(series.get(k) ?? []), s]);
    }
    for (const [k, buckets] of series) {
      const les = buckets.map((b) => parseValue(b.labels.le ?? '', f.name));
      for (let i = 1; i < buckets.length; i++) {
        if (!((les[i] ?? 0) > (les[i - 1] ?? 0))) throw new Error(`${f.name}${k}: le not increasing`);
        if ((buckets[i]?.value ?? 0) < (buckets[i - 1]?.value ?? 0))
          throw new Error(`${f.name}${k}: buckets not cumulative`);
      }
      if (les.at(-1) !== Infinity) throw new Error(`${f.name}${k}: no +Inf bucket`);
      const count = f.samples.find(
        (s) => s.name === `${f.name}_count` && JSON.stringify(Object.entries(s.labels).sort()) === k,
      );
      if (count?.value !== buckets.at(-1)?.value) throw new Error(`${f.name}${k}: _count differs from the +Inf bucket`);
    }
  }
  return families;
}

/** The one sample of `name` whose labels include `labels`. */
function value(
  families: Map<string, Family>,
  family: string,
  name: string,
  labels: Record<string, string>,
): number | undefined {
  const f = families.get(family);
  const s = f?.samples.filter((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v));
  if (s === undefined || s.length === 0) return undefined;
  if (s.length > 1) throw new Error(`${name} ${JSON.stringify(labels)}: ${s.length} samples`);
  return s[0]?.value;
}

// ---------------------------------------------------------------------------------------------

describe('the strict parser', () => {
  it('accepts valid text and refuses what the format forbids', () => {
    const ok = parsePrometheusText(
      '# HELP a_total x\n# TYPE a_total counter\na_total{k="v\\"q\\\\"} 3\n\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n',
    );
    expect(value(ok, 'a_total', 'a_total', { k: 'v"q\\' })).toBe(3);
    for (const bad of [
      'a 1\n', // no TYPE
      '# TYPE a gauge\na{k=v} 1\n', // unquoted label
      '# TYPE a gauge\na 1,5\n', // bad value
      '# TYPE a gauge\na 1\na 2\n', // same series twice
      '# TYPE a gauge\na 1', // no final newline
      '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_count 1\n', // not cumulative
      '# TYPE h histogram\nh_bucket{le="1"} 1\nh_count 1\n', // no +Inf
    ]) {
      expect(() => parsePrometheusText(bad), bad).toThrow();
    }
  });
});

const { redis, sim, tmp, defer } = useHarness({
  redis: true,
  tmp: true,
  sim: { timeScale: 200, maxRunningRequests: 16, seed: 9, outputLength: { distribution: 'fixed', mean: 50 } },
});
let proxy: PromptFaultProxy;

beforeAll(async () => {
  proxy = await startPromptFaultProxy(sim.url);
  defer(() => proxy.close());
});

describe('GET /metrics', () => {
  it("is valid Prometheus text with the run's numbers, per dataset and per endpoint", async () => {
    writePrompts(tmp.dir, 'm', 30);
    proxy.failing.add('m-4');
    const config = loadConfig({
      object: {
        run: 'metrics',
        redis: { url: redis.url, prefix: redis.prefix },
        sglang: { endpoints: [proxy.url], concurrency: 8, maxAttempts: 2, requestTimeoutMs: 30_000 },
        datasets: [{ name: 'm', prompts: 'm.jsonl', tokenBudget: 1_000_000, maxNewTokens: 128, batchSize: 10 }],
        output: { dir: 'out' },
        workers: { shutdownGraceMs: 2_000 },
      },
      baseDir: tmp.dir,
    });
    const ctx = await openRunContextFor(config);
    const dashboard = await startDashboard({
      redis: ctx.redis,
      keys: ctx.keys,
      config,
      host: '127.0.0.1',
      port: 0,
      token: 'metrics-test-token-0123456789',
      logger: quietLogger(),
    });
    const run = await startGeneration(ctx, { produce: true, infer: true });
    try {
      await run.finished;
      const scrape = async (): Promise<{ type: string; families: Map<string, Family> }> => {
        const res = await fetch(new URL('/metrics', dashboard.url), {
          headers: { authorization: 'Bearer metrics-test-token-0123456789' },
        });
        expect(res.status).toBe(200);
        return { type: res.headers.get('content-type') ?? '', families: parsePrometheusText(await res.text()) };
      };
      // The worker's heartbeat (every 5 s) carries its request stats: wait for the final ones.
      const scraped = await waitFor(
        async () => {
          const s = await scrape();
          return value(
            s.families,
            'tokenmill_endpoint_request_duration_seconds',
            'tokenmill_endpoint_request_duration_seconds_count',
            { endpoint: proxy.url },
          ) === 29
            ? s
            : undefined;
        },
        'the worker heartbeat with every request',
        15_000,
        250,
      );
      if (scraped === undefined) throw new Error('no scrape');
      const { type, families } = scraped;
      expect(type).toMatch(/^text\/plain; version=0\.0\.4/);
      const status = await readRunStatus(ctx.redis, ctx.keys, config);
      const ds = { run: 'metrics', dataset: 'm' };
      const g = (family: string, labels: Record<string, string>): number | undefined =>
        value(families, family, family, labels);
      expect(g('tokenmill_dataset_records', ds)).toBe(29);
      expect(g('tokenmill_dataset_output_tokens', ds)).toBe(29 * 50);
      expect(g('tokenmill_dataset_output_tokens', ds)).toBe(status.datasets[0]?.outputTokens);
      expect(g('tokenmill_dataset_token_budget', ds)).toBe(1_000_000);
      expect(g('tokenmill_dataset_failed_prompts', ds)).toBe(1);
      expect(g('tokenmill_dataset_skipped_prompts', ds)).toBe(0);
      expect(g('tokenmill_dataset_in_flight_requests', ds)).toBe(0);
      expect(g('tokenmill_dataset_completed', ds)).toBe(1);
      expect(g('tokenmill_dataset_paused', ds)).toBe(0);
      // Three batches: two completed, the one with the failed prompt failed (as Bull Board shows).
      expect(g('tokenmill_queue_jobs', { queue: 'generate-m', state: 'completed' })).toBe(2);
      expect(g('tokenmill_queue_jobs', { queue: 'generate-m', state: 'failed' })).toBe(1);
      expect(g('tokenmill_queue_jobs', { queue: 'generate-m', state: 'waiting' })).toBe(0);
      expect(g('tokenmill_queue_jobs', { queue: 'merge', state: 'waiting' })).toBe(0);
      expect(families.get('tokenmill_queue_jobs')?.type).toBe('gauge');

      const ep = { run: 'metrics', endpoint: proxy.url };
      expect(g('tokenmill_endpoint_up', ep)).toBe(1);
      expect(g('tokenmill_endpoint_in_flight_requests', ep)).toBe(0);
      // m-4 was answered 500 on both of its attempts; the 29 others succeeded once each.
      expect(families.get('tokenmill_endpoint_request_errors_total')?.type).toBe('counter');
      expect(g('tokenmill_endpoint_request_errors_total', { ...ep, status: '500' })).toBe(2);
      expect(g('tokenmill_endpoint_requests_total', ep)).toBe(31);
      const h = 'tokenmill_endpoint_request_duration_seconds';
      expect(families.get(h)?.type).toBe('histogram');
      expect(value(families, h, `${h}_bucket`, { ...ep, le: '+Inf' })).toBe(29);
      expect(value(families, h, `${h}_sum`, ep)).toBeGreaterThan(0);
      expect(g('tokenmill_workers', { run: 'metrics', role: 'inference' })).toBe(1);
      expect(g('tokenmill_workers', { run: 'metrics', role: 'producer' })).toBe(1);
    } finally {
      await run.stop();
      await dashboard.stop();
      await ctx.close();
    }
  }, 60_000);
});
