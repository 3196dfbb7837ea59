/**
 * Redis refusing writes for its own sake, said plainly: `OOM command not allowed` (maxmemory
 * reached with `noeviction`) and `MISCONF` (it cannot persist, e.g. its disk is full) reach a
 * command as the error of whatever Lua script ran into them; and a warning at start when
 * `maxmemory` looks small for the run.
 */
import type { Redis } from 'ioredis';
import { errorMessage, formatInt, type RunKeys } from '../shared/index.js';

/** Bytes Redis holds per prompt of a run, roughly (committed ids, attempts, counters; docs/benchmarks). */
const BYTES_PER_PROMPT = 100;
/** Headroom for the queues' windows, the results streams between sink reads and BullMQ's own keys. */
const HEADROOM_BYTES = 64 * 1024 * 1024;

/**
 * One line for a Redis that refuses writes (OOM or MISCONF), naming what it is and what to
 * do; undefined for any other error.
 */
export function describeRedisRefusal(e: unknown, where = 'Redis'): string | undefined {
  const message = errorMessage(e);
  if (/(^|\s|-)OOM command not allowed/.test(message)) {
    return (
      `${where} is out of memory: it refuses writes (OOM, its maxmemory is reached and its policy is noeviction, as tokenmill needs). ` +
      'Raise its maxmemory (CONFIG SET maxmemory <bytes>, and in its config file) or give it a larger machine, then run the same command again: nothing acknowledged is lost'
    );
  }
  if (/(^|\s|-)MISCONF /.test(message)) {
    return (
      `${where} cannot persist its data (MISCONF: writing its AOF or snapshot failed, often a full disk) and refuses writes. ` +
      'Free space on the disk of its dir (CONFIG GET dir) and check its log; once it persists again, run the same command again'
    );
  }
  return undefined;
}

const mib = (bytes: number): string => `${formatInt(Math.ceil(bytes / (1024 * 1024)))} MiB`;

/**
 * A warning (to print once at start) when Redis's `maxmemory` (0 = no limit) is below what the run may need: what it
 * uses now plus about {@link BYTES_PER_PROMPT} bytes for each prompt not yet accounted for (from
 * each dataset's prepared prompt count) plus 64 MiB. Returns the warning, or undefined. Never
 * throws: a Redis that does not allow INFO or CONFIG is not checked.
 */
export async function smallMaxmemoryWarning(
  redis: Redis,
  keys: RunKeys,
  datasets: readonly string[],
): Promise<string | undefined> {
  try {
    const info = await redis.info('memory');
    const field = (name: string): number => Number(new RegExp(`^${name}:(\\d+)`, 'm').exec(info)?.[1] ?? NaN);
    const maxmemory = field('maxmemory');
    const used = field('used_memory');
    if (!Number.isFinite(maxmemory) || maxmemory === 0 || !Number.isFinite(used)) return undefined;
    let prompts = 0;
    for (const d of datasets) {
      const [total, records] = await redis.hmget(keys.stats(d), 'prompts', 'records');
      prompts += Math.max(0, Number(total ?? 0) - Number(records ?? 0));
    }
    const need = used + prompts * BYTES_PER_PROMPT + HEADROOM_BYTES;
    if (maxmemory >= need) return undefined;
    return (
      `Redis maxmemory is ${mib(maxmemory)} (${mib(used)} used); this run may need about ${mib(need)} ` +
      `(${formatInt(prompts)} prompts to go at about ${BYTES_PER_PROMPT} bytes each, plus 64 MiB for queues and results): ` +
      'raise maxmemory (CONFIG SET maxmemory <bytes>), or a full Redis refuses writes (OOM) and the run stops'
    );
  } catch {
    return undefined;
  }
}
