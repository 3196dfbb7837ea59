// An inference worker in a process of its own, for the budget tests that race two worker
// processes: `node --import tsx budget-worker-child.ts '<InferenceWorkerOptions as JSON>'`.
// Prints `ready` once started; SIGTERM stops it cleanly, SIGKILL is a crash.
import { RunKeys, createRootLogger } from '../../src/shared/index.js';
import { InferenceWorker } from '../../src/workers/inference/worker.js';

interface ChildOptions {
  redisUrl: string;
  prefix: string;
  run: string;
  endpoints: string[];
  concurrency: number;
  strictBudgetDatasets: string[];
  budgetMarginSd?: Record<string, number>;
  leaseTtlMs?: number;
  workerId: string;
}

const o = JSON.parse(process.argv[2] ?? '{}') as ChildOptions;
createRootLogger({ level: process.env['TOKENMILL_TEST_LOG_LEVEL'] ?? 'warn' });
const worker = new InferenceWorker({
  redisUrl: o.redisUrl,
  keys: new RunKeys(o.prefix, o.run),
  endpoints: o.endpoints,
  concurrency: o.concurrency,
  requestTimeoutMs: 60_000,
  batchSize: 8,
  lockDurationMs: 2_000,
  stalledIntervalMs: 1_000,
  ...(o.leaseTtlMs === undefined ? {} : { leaseTtlMs: o.leaseTtlMs }),
  strictBudgetDatasets: o.strictBudgetDatasets,
  ...(o.budgetMarginSd === undefined ? {} : { budgetMarginSd: o.budgetMarginSd }),
  workerId: o.workerId,
});
await worker.start();
process.stdout.write('ready\n');
process.once('SIGTERM', () => {
  void worker.stop(2_000).then(() => process.exit(0));
});
