// A results sink in a process of its own, for tests that freeze (SIGSTOP) or kill it.
// Argument: JSON {redisUrl, prefix, run, dataset, dir, lockTtlMs?}. Prints "ready" once it holds
// the lock; exits 3 with the error when the sink stops on its own (e.g. it lost its lock), 0 on SIGTERM.
import { ResultsSink } from '../../src/producers/results-sink.js';
import { RunKeys, closeRedisConnection, createRedisConnection } from '../../src/shared/index.js';
import { quietLogger } from './redis.js';

interface Job {
  redisUrl: string;
  prefix: string;
  run: string;
  dataset: string;
  dir: string;
  lockTtlMs?: number;
}

const job = JSON.parse(process.argv[2] ?? '{}') as Job;
const redis = createRedisConnection(job.redisUrl, { role: 'worker', name: 'tokenmill:test-sink' });
const sink = new ResultsSink({
  redis,
  keys: new RunKeys(job.prefix, job.run),
  dataset: job.dataset,
  dir: job.dir,
  logger: quietLogger(),
  ...(job.lockTtlMs === undefined ? {} : { lockTtlMs: job.lockTtlMs }),
});
await sink.start();
process.stdout.write('ready\n');
const stopped = new Promise<number>((resolve) => process.once('SIGTERM', () => resolve(0)));
const code = await Promise.race([
  stopped,
  sink.failed.catch((e: unknown) => {
    process.stderr.write(`sink failed: ${e instanceof Error ? e.message : String(e)}\n`);
    return 3;
  }),
]);
await sink.stop();
await closeRedisConnection(redis);
process.exit(code);
