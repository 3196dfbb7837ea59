// Benchmark 3: Redis memory bound (docs/design.md, invariant 5). The same pipeline runs a small and
// a large dataset (4x the prompts), each on a fresh redis-server, while INFO memory is sampled. If
// Redis holds a window of batches and results leave it once written, the peak does not follow the
// dataset's size. What does grow with it is measured key by key at the end.
import type { Redis } from 'ioredis';
import { startSimulator, type SimulatorHandle } from '../src/sim/index.js';
import { RunKeys, generateJobOptions } from '../src/shared/index.js';
import {
  benchConfig,
  delay,
  fmtBytes,
  isMain,
  longPrompt,
  openBenchEnv,
  round,
  runAsScript,
  startTokenmill,
  writePrompts,
  type BenchResult,
} from './lib.js';

export interface RedisMemoryOptions {
  /** Dataset sizes (prompts); the first is the reference for the ratios. */
  sizes: number[];
  promptChars: number;
  outputTokens: number;
  concurrency: number;
  timeScale: number;
  sampleEveryMs: number;
  /** The largest acceptable ratio of peaks (large / small) while the datasets differ 4x. */
  maxPeakRatio: number;
}

export const DEFAULT_REDIS_MEMORY: RedisMemoryOptions = {
  sizes: [4_000, 16_000],
  promptChars: 600,
  outputTokens: 32,
  concurrency: 64,
  timeScale: 1_000,
  sampleEveryMs: 50,
  maxPeakRatio: 1.25,
};

/** Where the memory is at the end of a run, by kind of key (MEMORY USAGE, exact). */
interface KeyBreakdown {
  doneSetBytes: number;
  doneSetMembers: number;
  /** BullMQ job hashes kept after completion (`removeOnComplete`), with their payloads. */
  completedJobsBytes: number;
  completedJobs: number;
  /** BullMQ's events stream (capped by BullMQ at about 10 000 entries). */
  bullEventsBytes: number;
  bullOtherBytes: number;
  resultsStreamBytes: number;
  otherBytes: number;
}

interface SizeRun {
  prompts: number;
  datasetBytes: number;
  usedMemoryBeforeBytes: number;
  peakUsedMemoryBytes: number;
  /** Peak minus the empty server's used_memory. */
  peakGrowthBytes: number;
  endUsedMemoryBytes: number;
  /** used_memory at 25, 50, 75 and 100 % of the committed records. */
  usedMemoryByProgress: { progress: number; usedMemoryBytes: number }[];
  resultsBacklogMax: number;
  records: number;
  keys: KeyBreakdown;
  wallS: number;
}

async function usedMemory(conn: Redis): Promise<number> {
  const info = await conn.info('memory');
  return Number(/^used_memory:(\d+)/m.exec(info)?.[1] ?? NaN);
}

async function memoryOf(conn: Redis, key: string): Promise<number> {
  return Number((await conn.call('MEMORY', 'USAGE', key, 'SAMPLES', '0')) ?? 0);
}

async function breakdown(conn: Redis, keys: RunKeys, dataset: string): Promise<KeyBreakdown> {
  const b: KeyBreakdown = {
    doneSetBytes: 0,
    doneSetMembers: await conn.scard(keys.done(dataset)),
    completedJobsBytes: 0,
    completedJobs: 0,
    bullEventsBytes: 0,
    bullOtherBytes: 0,
    resultsStreamBytes: 0,
    otherBytes: 0,
  };
  const completed = new Set<string>();
  const queuePrefix = `${keys.bullPrefix}:generate-${dataset}:`;
  for (const id of await conn.zrange(`${queuePrefix}completed`, 0, -1)) completed.add(`${queuePrefix}${id}`);
  let cursor = '0';
  do {
    const [next, batch] = await conn.scan(cursor, 'COUNT', 1000);
    cursor = next;
    for (const key of batch) {
      const bytes = await memoryOf(conn, key);
      if (key === keys.done(dataset)) b.doneSetBytes += bytes;
      else if (key === keys.results(dataset)) b.resultsStreamBytes += bytes;
      else if (completed.has(key)) {
        b.completedJobsBytes += bytes;
        b.completedJobs += 1;
      } else if (key === `${queuePrefix}events`) b.bullEventsBytes += bytes;
      else if (key.startsWith(keys.bullPrefix)) b.bullOtherBytes += bytes;
      else b.otherBytes += bytes;
    }
  } while (cursor !== '0');
  return b;
}

async function runSize(o: RedisMemoryOptions, prompts: number): Promise<SizeRun> {
  const t0 = performance.now();
  const env = await openBenchEnv('memory');
  let sim: SimulatorHandle | undefined;
  try {
    sim = await startSimulator({
      timeScale: o.timeScale,
      maxRunningRequests: o.concurrency,
      seed: 6,
      outputLength: { distribution: 'fixed', mean: o.outputTokens },
    });
    const { bytes } = writePrompts(env.dir, 'mem', prompts, (i) => ({
      id: `mem-${i}`,
      prompt: longPrompt(i, o.promptChars),
    }));
    const config = benchConfig(env, {
      run: 'memory',
      endpoint: sim.url,
      concurrency: o.concurrency,
      datasets: [{ name: 'mem', prompts: 'mem.jsonl', tokenBudget: 1_000_000_000, maxNewTokens: 1024 }],
    });
    const keys = new RunKeys(config.redis.prefix, config.run);
    const probe = env.redis.connection('client');
    const before = await usedMemory(probe);
    let peak = before;
    let backlogMax = 0;
    const byProgress: { progress: number; usedMemoryBytes: number }[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const [[, info], [, recs], [, backlog]] = (await probe
          .multi()
          .info('memory')
          .hget(keys.stats('mem'), 'records')
          .xlen(keys.results('mem'))
          .exec()) as [[unknown, string], [unknown, string | null], [unknown, number]];
        const used = Number(/^used_memory:(\d+)/m.exec(info)?.[1] ?? NaN);
        peak = Math.max(peak, used);
        backlogMax = Math.max(backlogMax, backlog);
        const progress = Number(recs ?? 0) / prompts;
        const next = (byProgress.length + 1) * 0.25;
        if (progress >= next && next < 1) byProgress.push({ progress: next, usedMemoryBytes: used });
        await delay(o.sampleEveryMs);
      }
    })();
    const gen = await startTokenmill(config);
    try {
      await gen.handle.finished;
    } finally {
      sampling = false;
      await sampler;
    }
    const end = await usedMemory(probe);
    peak = Math.max(peak, end);
    byProgress.push({ progress: 1, usedMemoryBytes: end });
    const records = Number((await probe.hget(keys.stats('mem'), 'records')) ?? 0);
    const keyBytes = await breakdown(probe, keys, 'mem');
    await gen.stop();
    return {
      prompts,
      datasetBytes: bytes,
      usedMemoryBeforeBytes: before,
      peakUsedMemoryBytes: peak,
      peakGrowthBytes: peak - before,
      endUsedMemoryBytes: end,
      usedMemoryByProgress: byProgress,
      resultsBacklogMax: backlogMax,
      records,
      keys: keyBytes,
      wallS: round((performance.now() - t0) / 1000, 1),
    };
  } finally {
    await sim?.stop();
    await env.close();
  }
}

export async function redisMemory(o: RedisMemoryOptions = DEFAULT_REDIS_MEMORY): Promise<BenchResult> {
  const started = performance.now();
  const runs: SizeRun[] = [];
  for (const n of o.sizes) runs.push(await runSize(o, n));
  const small = runs[0];
  const large = runs[runs.length - 1];
  if (small === undefined || large === undefined) throw new Error('redis-memory needs at least one dataset size');
  const datasetRatio = large.datasetBytes / small.datasetBytes;
  const peakRatio = large.peakUsedMemoryBytes / small.peakUsedMemoryBytes;
  const growthRatio = large.peakGrowthBytes / small.peakGrowthBytes;
  const extraSamples = large.records - small.records;
  // What grows per committed sample, from the difference between the two runs' end states.
  const perSample = {
    doneSetBytes: round((large.keys.doneSetBytes - small.keys.doneSetBytes) / extraSamples, 1),
    completedJobsBytes: round((large.keys.completedJobsBytes - small.keys.completedJobsBytes) / extraSamples, 1),
    bullEventsBytes: round((large.keys.bullEventsBytes - small.keys.bullEventsBytes) / extraSamples, 1),
    usedMemoryBytes: round((large.endUsedMemoryBytes - small.endUsedMemoryBytes) / extraSamples, 1),
  };
  // used_memory at the end without the completed jobs BullMQ keeps: what the rest of the state costs.
  const endWithoutJobs = runs.map((r) => r.endUsedMemoryBytes - r.keys.completedJobsBytes);
  const endWithoutJobsRatio = (endWithoutJobs[endWithoutJobs.length - 1] ?? NaN) / (endWithoutJobs[0] ?? NaN);
  const bytesPerCompletedJob =
    large.keys.completedJobs > 0 ? large.keys.completedJobsBytes / large.keys.completedJobs : 0;
  const keep = generateJobOptions.removeOnComplete;
  const keptJobs = typeof keep === 'object' && keep.count !== undefined ? keep.count : Infinity;
  const summary = [
    `fixed ${o.outputTokens}-token outputs, ~${o.promptChars}-char prompts, concurrency ${o.concurrency}, default batchSize and queue window; INFO memory every ${o.sampleEveryMs} ms`,
    ...runs.map(
      (r) =>
        `${r.prompts} prompts (${fmtBytes(r.datasetBytes)} on disk): used_memory ${fmtBytes(r.usedMemoryBeforeBytes)} empty, peak ${fmtBytes(r.peakUsedMemoryBytes)} (+${fmtBytes(r.peakGrowthBytes)}), ` +
        `end ${fmtBytes(r.endUsedMemoryBytes)}; at 25/50/75/100%: ${r.usedMemoryByProgress.map((p) => fmtBytes(p.usedMemoryBytes)).join(' / ')}; results backlog max ${r.resultsBacklogMax}`,
    ),
    `ratios large/small: dataset ${datasetRatio.toFixed(2)}, peak used_memory ${peakRatio.toFixed(3)}, peak growth over the empty server ${growthRatio.toFixed(3)}`,
    ...runs.map(
      (r) =>
        `${r.prompts} prompts, at the end: done set ${fmtBytes(r.keys.doneSetBytes)} (${r.keys.doneSetMembers} ids), ${r.keys.completedJobs} completed batch jobs kept ${fmtBytes(r.keys.completedJobsBytes)}, ` +
        `BullMQ events ${fmtBytes(r.keys.bullEventsBytes)}, other BullMQ ${fmtBytes(r.keys.bullOtherBytes)}, results stream ${fmtBytes(r.keys.resultsStreamBytes)}, other ${fmtBytes(r.keys.otherBytes)}`,
    ),
    `end used_memory minus the kept completed jobs: ${endWithoutJobs.map((b) => fmtBytes(b)).join(' vs ')} (ratio ${endWithoutJobsRatio.toFixed(3)})`,
    `growth per committed sample: done set ${perSample.doneSetBytes} B, kept completed jobs ${perSample.completedJobsBytes} B, BullMQ events ${perSample.bullEventsBytes} B, used_memory in all ${perSample.usedMemoryBytes} B`,
    `a kept completed job holds its payload (prompt ids): ${fmtBytes(bytesPerCompletedJob)} each here; BullMQ keeps up to ${keptJobs} (removeOnComplete), i.e. up to ~${fmtBytes(keptJobs * bytesPerCompletedJob)} at this prompt length`,
  ];
  const targets: BenchResult['targets'] = [
    {
      what: `peak used_memory ratio for a ${datasetRatio.toFixed(1)}x larger dataset`,
      required: `<= ${o.maxPeakRatio}`,
      measured: peakRatio.toFixed(3),
      met: peakRatio <= o.maxPeakRatio,
    },
    {
      what: 'peak used_memory smaller than the large dataset on disk',
      required: `< ${fmtBytes(large.datasetBytes)}`,
      measured: fmtBytes(large.peakUsedMemoryBytes),
      met: large.peakUsedMemoryBytes < large.datasetBytes,
    },
  ];
  return {
    name: 'redis-memory',
    ok: targets.every((t) => t.met),
    targets,
    metrics: {
      config: o,
      runs,
      datasetRatio: round(datasetRatio, 3),
      peakRatio: round(peakRatio, 3),
      peakGrowthRatio: round(growthRatio, 3),
      endWithoutCompletedJobsBytes: endWithoutJobs,
      endWithoutCompletedJobsRatio: round(endWithoutJobsRatio, 3),
      perSample,
      bytesPerCompletedJob: Math.round(bytesPerCompletedJob),
    },
    summary,
    wallS: (performance.now() - started) / 1000,
  };
}

if (isMain(import.meta.url)) runAsScript(() => redisMemory());
