// Shared by the results-sink tests: commits through the real commit script, and reading back
// what the sink wrote.
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import type { Redis } from 'ioredis';
import { ResultsSink, type ResultsSinkOptions } from '../../src/producers/results-sink.js';
import { withScripts, type RunKeys } from '../../src/shared/index.js';
import { quietLogger } from './redis.js';
import type { GenerationRecord } from './pipeline.js';

/** Commits one sample's result as a worker does (commit-sample-9.lua); 1 on its first commit. */
export async function commitResult(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
  id: string,
  tokens: number,
  options: { ts?: string } = {},
): Promise<number> {
  const record: GenerationRecord = {
    id,
    dataset,
    prompt_ids: [1, 2, 3],
    output_ids: Array.from({ length: tokens }, (_, i) => i),
    prompt_tokens: 3,
    completion_tokens: tokens,
    finish_reason: { type: 'stop' },
    endpoint: 'http://127.0.0.1:1',
    worker: 'test',
    attempt: 1,
    ts: options.ts ?? new Date().toISOString(),
  };
  const [first] = await withScripts(redis).commitSample(
    keys.done(dataset),
    keys.stats(dataset),
    keys.results(dataset),
    keys.inflight(dataset),
    keys.endpointLeases(record.endpoint),
    keys.failed(dataset),
    keys.skipped(dataset),
    keys.attempts(dataset),
    keys.rate(dataset),
    id,
    tokens,
    JSON.stringify(record),
    `${dataset}/${id}#${Math.random()}`,
    10_000,
    30,
  );
  return first;
}

/** Every line of the part files in `dir`, parsed, in file order. */
export function readParts(dir: string): GenerationRecord[] {
  if (!existsSync(dir)) return [];
  const out: GenerationRecord[] = [];
  for (const f of readdirSync(dir)
    .filter((x) => /^part-\d+\.jsonl$/.test(x))
    .sort()) {
    for (const line of readFileSync(path.join(dir, f), 'utf8').split('\n'))
      if (line !== '') out.push(JSON.parse(line) as GenerationRecord);
  }
  return out;
}

/** A started sink with a quiet logger (unless given one). */
export async function startSink(
  options: Omit<ResultsSinkOptions, 'logger'> & Partial<Pick<ResultsSinkOptions, 'logger'>>,
): Promise<ResultsSink> {
  const sink = new ResultsSink({ logger: quietLogger(), ...options });
  await sink.start();
  return sink;
}

/** Starts a sink, lets it write everything in the stream, stops it. */
export async function drainOnce(options: Omit<ResultsSinkOptions, 'logger'>): Promise<void> {
  const sink = await startSink(options);
  try {
    await sink.drained();
  } finally {
    await sink.stop();
  }
}

/** What the counters of `dataset` say. */
export async function datasetStats(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
): Promise<{ records: number; outputTokens: number; outputTokensSq: number }> {
  const s = await redis.hgetall(keys.stats(dataset));
  return {
    records: Number(s.records ?? 0),
    outputTokens: Number(s.outputTokens ?? 0),
    outputTokensSq: Number(s.outputTokensSq ?? 0),
  };
}
