/**
 * A run's prompts must not change under it: the producer's cursor, the committed and failed
 * samples and the budget all refer to the prompt file the run started from. The SHA-256 of
 * each prepared prompt file is recorded in the dataset's stats hash; a `prepare` that would
 * replace it with different prompts while the run has progress on the dataset is refused.
 */
import { rm, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { AppError, type Config, type RunKeys } from '../../shared/index.js';
import { PREPARE_STATS_FIELDS } from '../../shared/index.js';
import type { PrepareCounts } from './prepare-report.js';

/** Whether the run has done anything with the dataset's prompts (enqueued, committed, failed, skipped). */
async function hasProgress(redis: Redis, keys: RunKeys, dataset: string): Promise<boolean> {
  const [records, exists] = await Promise.all([
    redis.hget(keys.stats(dataset), 'records'),
    redis.exists(keys.producer(dataset), keys.done(dataset), keys.failed(dataset), keys.skipped(dataset)),
  ]);
  return Number(records ?? 0) > 0 || exists > 0;
}

/**
 * Refuses (with an {@link AppError} naming the dataset, the prompt file and what to do) when the
 * run recorded other prompts for `dataset` and has progress on them.
 */
export async function checkRunPrompts(
  run: { redis: Redis; keys: RunKeys; config: Pick<Config, 'run' | 'source'> },
  dataset: string,
  promptsFile: string,
  sha256: string,
): Promise<void> {
  const recorded = await run.redis.hget(run.keys.stats(dataset), PREPARE_STATS_FIELDS.promptsSha256);
  if (recorded === null || recorded === sha256) return;
  if (!(await hasProgress(run.redis, run.keys, dataset))) return;
  const configArg = run.config.source.file === undefined ? '<config>' : run.config.source.file;
  throw new AppError(
    `dataset "${dataset}": its prompts changed since run "${run.config.run}" started (the source or its prepare settings changed: ` +
      `${promptsFile} would go from SHA-256 ${recorded.slice(0, 12)}… to ${sha256.slice(0, 12)}…), and the run's progress on it refers to the old prompts. ` +
      `Start the run over with \`tokenmill run -c ${configArg} --fresh\`, or give the new prompts a new run name (\`run:\` in the config); ` +
      'to resume the run as it was, put the source back as it was. The prompt file was left unchanged.',
  );
}

/** Records a dataset's prepared prompts (their SHA-256) and its numbers for `status`. */
export async function recordPrepared(
  redis: Redis,
  keys: RunKeys,
  dataset: string,
  sha256: string,
  c: PrepareCounts,
): Promise<void> {
  const f = PREPARE_STATS_FIELDS;
  await redis.hset(keys.stats(dataset), {
    [f.promptsSha256]: sha256,
    [f.rows]: c.rowsRead,
    [f.kept]: c.kept,
    [f.duplicates]: c.duplicates + c.duplicatesAcross,
    [f.tooLong]: c.tooLong,
    [f.empty]: c.empty,
    [f.malformed]: c.malformed,
  });
}

/**
 * `run --fresh`: deletes the run's Redis keys (`<prefix>:<run>:*`, its queues included) and
 * everything in `<output.dir>/<run>` but the embedded Redis server's folder. Refuses while a
 * producer of the run holds its lock.
 */
export async function startRunOver(redis: Redis, keys: RunKeys, runDirectory: string): Promise<{ keys: number }> {
  const holder = await redis.get(keys.producerLock());
  if (holder !== null) {
    throw new AppError(
      `--fresh: a producer of run "${keys.base}" is running (lock ${keys.producerLock()} held by ${holder}); stop it first`,
    );
  }
  let deleted = 0;
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${keys.base}:*`, 'COUNT', 1000);
    cursor = next;
    if (found.length > 0) deleted += await redis.unlink(...found);
  } while (cursor !== '0');
  const entries = await readdir(runDirectory).catch(() => [] as string[]);
  for (const name of entries) {
    if (name === 'redis') continue;
    await rm(join(runDirectory, name), { recursive: true, force: true });
  }
  return { keys: deleted };
}
